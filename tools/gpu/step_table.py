#!/usr/bin/env python3
"""The 124M steps of one device call, judged against each other with their noise: what decides a default.

Every 124M run of tools/gpu-phase.sh (train_124m: phase A's defaults, phase C's opt_* and its A/A repeats)
leaves its metrics.jsonl in its phase's logs archive (logs/<step>.metrics.jsonl), and its target in the
phase's summary. Each target clause is one of
    >= 470K tok/s                  the run's own rate
    within 15% of <step>           tok/s at least 85% of <step>'s (the hand GEMM against cuBLASLt)
    faster than <step>             an opt-in that becomes the default only if it is
    slower than <step>             a change whose removal must cost
    vs <step>                      a figure with no expectation
    same as <step>                 an A/A pair: the same run twice in the call, which measures the noise
(clauses joined by "; "). A run's rate is its tokens a step over the mean step time after its warm-up steps
(the first; with --cuda-graph the first two), without the --profile-step one: the trainer's --benchmark mean,
from the per-step ms in metrics.jsonl.

A comparison's verdict ("faster", "slower", or "same" within the band) takes the band as the larger of
  - two standard errors of the ratio of the two means, from the runs' own step-to-step spread, and
  - the widest A/A difference in the call: what two processes of the same run differ by on this machine
    (clocks, placement, the minutes between phase A and phase C), which no run's own spread shows.
A rate or "within" target short of its mark by less than the band is reported as such, not as missed. A
ratio inside the band says nothing either way: the default step's rate differed by about 2% from one lent
machine to the next (2026-11-27), and the changes waiting to be judged are 0.5-13%.

    step_table.py PATH...     each PATH a device call's $OUT (summary_<P>.txt, phase_<P>_logs.tar.gz), a
                              phase logs archive, or a folder of logs/<step>.metrics.jsonl
Phase C's step_table step reads its own call's $OUT, so phase A must run in the same call for the A/A pairs
and the opt-ins against A's defaults; for phases run in separate calls, run it here on both calls' folders.
Exit: 0 with a table (a comparison whose other run is missing from the call is listed as not judged); 77
("skipped") when no 124M run is found (a call without a GPU); 1 when a run's metrics or a target do not parse."""
import io
import json
import math
import os
import re
import sys
import tarfile

CLAUSE_RATE = re.compile(r"^>= (\d+(?:\.\d+)?)K tok/s$")
CLAUSE_WITHIN = re.compile(r"^within (\d+(?:\.\d+)?)% of ([a-z0-9_]+)$")
CLAUSE_PAIR = re.compile(r"^(faster than|slower than|vs|same as) ([a-z0-9_]+)$")
TRAIN_STEP = re.compile(r"^(train_124m_|opt_|aa_)")


def parse_target(text):
    """[(kind, value, step)] of a train_124m target, or ValueError naming the clause that does not parse."""
    clauses = []
    for c in text.split("; "):
        m = CLAUSE_RATE.match(c)
        if m:
            clauses.append(("rate", float(m[1]) * 1e3, None))
            continue
        m = CLAUSE_WITHIN.match(c)
        if m:
            clauses.append(("within", float(m[1]) / 100.0, m[2]))
            continue
        m = CLAUSE_PAIR.match(c)
        if m:
            clauses.append((m[1], None, m[2]))
            continue
        raise ValueError(f"target clause {c!r} is none of '>= NK tok/s', 'within N% of STEP', "
                         "'faster than STEP', 'slower than STEP', 'vs STEP', 'same as STEP'")
    return clauses


class Run:
    """One 124M run: its step times after the first, without the profiled step."""

    def __init__(self, name, text):
        self.name = name
        ms, tokens, profiled, warmup = {}, None, set(), 1
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{name}: line {i + 1} of its metrics.jsonl is not JSON ({e})")
            if "profile_step" in r:
                profiled.add(int(r["profile_step"]))
            elif r.get("benchmark"):
                tokens = float(r["global_batch_tokens"])
                warmup = int(r.get("warmup_steps", 1))
            elif "step" in r and "ms" in r:
                ms[int(r["step"])] = float(r["ms"])
        if tokens is None:
            raise ValueError(f"{name}: its metrics.jsonl has no benchmark line (did the run finish?)")
        first = min(ms) if ms else 0
        self.ms = [t for s, t in sorted(ms.items()) if s >= first + warmup and s not in profiled]
        if len(self.ms) < 2:
            raise ValueError(f"{name}: {len(self.ms)} timed step(s) after its {warmup} warm-up step(s): too few to judge")
        self.tokens = tokens
        n = len(self.ms)
        self.mean = sum(self.ms) / n
        sd = math.sqrt(sum((t - self.mean) ** 2 for t in self.ms) / (n - 1))
        self.rel_se = sd / self.mean / math.sqrt(n)  # relative standard error of the mean step time

    @property
    def tok_s(self):
        return self.tokens / (self.mean / 1e3)


def read_sources(paths):
    """({step: metrics text}, {step: (result, target)}) from every device-call folder, archive or logs folder."""
    metrics, summary = {}, {}

    def add_archive(path):
        with tarfile.open(path, "r:*") as tar:
            for m in tar.getmembers():
                base = os.path.basename(m.name)
                if m.isfile() and base.endswith(".metrics.jsonl"):
                    metrics[base[:-len(".metrics.jsonl")]] = tar.extractfile(m).read().decode(errors="replace")

    def add_summary(path):
        # "step | result | s | figure | target": a figure may hold " | " (the kinds of op), a target never does
        for line in open(path, errors="replace"):
            cells = line.rstrip("\n").split(" | ")
            if len(cells) >= 5 and TRAIN_STEP.match(cells[0].strip()) and cells[1].strip() in ("PASS", "FAIL", "SKIP"):
                summary[cells[0].strip()] = (cells[1].strip(), cells[-1].strip())

    for p in paths:
        if os.path.isfile(p):
            if p.endswith(".txt"):
                add_summary(p)
            else:
                add_archive(p)
            continue
        if not os.path.isdir(p):
            raise ValueError(f"{p}: no such file or folder")
        for f in sorted(os.listdir(p)):
            full = os.path.join(p, f)
            if re.match(r"^summary_[A-D]\.txt$", f):
                add_summary(full)
            elif re.match(r"^phase_[A-D]_logs\.tar\.gz$", f):
                add_archive(full)
            elif f.endswith(".metrics.jsonl"):
                metrics[f[:-len(".metrics.jsonl")]] = open(full, errors="replace").read()
            elif f == "logs" and os.path.isdir(full):
                for g in sorted(os.listdir(full)):
                    if g.endswith(".metrics.jsonl"):
                        metrics[g[:-len(".metrics.jsonl")]] = open(os.path.join(full, g), errors="replace").read()
    return metrics, summary


def pct(x, digits=1):
    return f"{100.0 * x:.{digits}f}%"


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    try:
        metrics, summary = read_sources(argv)
        runs = {name: Run(name, text) for name, text in metrics.items()
                if summary.get(name, ("PASS",))[0] == "PASS"}
    except (ValueError, OSError, tarfile.TarError) as e:
        print(f"step_table: error: {e}", file=sys.stderr)
        return 1
    if not runs:
        print("skipped: no 124M run in " + ", ".join(argv))
        return 77

    problems = []
    targets = {}
    for name in runs:
        text = summary.get(name, (None, ""))[1]
        if not text:
            continue  # a logs folder without its summary: the run is listed, nothing is judged
        try:
            targets[name] = parse_target(text)
        except ValueError as e:
            problems.append(f"{name}: {e}")
    unjudged = []  # a partial call (a rerun line) may leave out a baseline: noted, not an error
    for name, clauses in sorted(targets.items()):
        for kind, _, other in clauses:
            if other is not None and other not in runs:
                why = "did not pass" if other in summary else "did not run in this call"
                unjudged.append(f"not judged: {name} {kind} {other}, which {why}")

    print("124M steps: tokens/s from the mean step time after the warm-up (the first step; with --cuda-graph two), "
          "without the profiled one; ± is two standard errors of that mean")
    print(f"{'run':36s} {'tok/s':>9s} {'±':>6s} {'steps':>5s}")
    for name, r in sorted(runs.items()):
        print(f"{name:36s} {r.tok_s / 1e3:8.1f}K {pct(2 * r.rel_se, 2):>6s} {len(r.ms):5d}")

    def ratio(a, b):
        """a's speed over b's in tokens/s (> 1: a is faster), and two standard errors of it (relative)."""
        ra, rb = runs[a], runs[b]
        return ra.tok_s / rb.tok_s, 2 * math.sqrt(ra.rel_se ** 2 + rb.rel_se ** 2)

    aa, aa_alone = [], []
    for name, clauses in sorted(targets.items()):
        for kind, _, other in clauses:
            if kind == "same as":
                if other in runs:
                    aa.append((name, other, abs(ratio(name, other)[0] - 1.0)))
                else:
                    aa_alone.append((name, other))
    aa_band = max((d for _, _, d in aa), default=0.0)
    print()
    if aa:
        for name, other, d in aa:
            print(f"A/A: {name} and {other}, the same run twice in this call: {pct(d, 2)} apart")
        print("band of a verdict: the larger of two standard errors of the ratio and the widest A/A, "
              f"{pct(aa_band, 2)}")
        if aa_band > 0.02:
            print("warning: two runs of the same step differ by more than 2% on this machine: a verdict below "
                  "that is not far outside its band is weak")
    else:
        for name, other in aa_alone:
            print(f"A/A: {name} ran, but its partner {other} is not among these runs (phase A runs in the same "
                  "call as phase C, or pass both calls' folders)")
        print("no A/A pair in these runs: each band is the runs' own step-to-step noise only, "
              "which leaves out what separate processes differ by")

    print()
    print(f"{'run':36s} {'target':44s} {'figure':>9s} {'band':>6s}  verdict")
    counts = {"met": 0, "missed": 0, "same": 0}
    for name, clauses in sorted(targets.items()):
        for kind, value, other in clauses:
            if other is not None and other not in runs:
                continue
            r = runs[name]
            if kind in ("rate", "within"):
                if kind == "rate":
                    target, x, mark = f">= {value / 1e3:.0f}K tok/s", r.tok_s / value, 1.0
                    figure, band = f"{r.tok_s / 1e3:.1f}K", max(2 * r.rel_se, aa_band)
                    short = f"{pct(1 - x)} short"
                else:
                    x, se2 = ratio(name, other)
                    target, mark, figure, band = f"within {value * 100:.0f}% of {other}", 1 - value, f"{x:.3f}x", max(se2, aa_band)
                    short = f"{pct(mark - x)} short of {mark:.2f}x"
                if x >= mark:
                    verdict, counts["met"] = "met", counts["met"] + 1
                elif x >= mark - band:
                    verdict, counts["same"] = f"{short}, within the band: not shown", counts["same"] + 1
                else:
                    verdict, counts["missed"] = f"missed: {short}", counts["missed"] + 1
            elif kind == "same as":
                continue  # the A/A lines above
            else:
                x, se2 = ratio(name, other)
                band = max(se2, aa_band)
                target = f"{kind} {other}"
                figure = f"{x:.3f}x"
                if x > 1 + band:
                    seen = f"faster by {pct(x - 1)}"
                elif x < 1 - band:
                    seen = f"slower by {pct(1 - x)}"
                else:
                    seen = "same within the band"
                if kind == "vs":
                    verdict = seen
                elif seen.startswith(kind.split()[0]):
                    verdict, counts["met"] = seen + ": as expected", counts["met"] + 1
                elif seen.startswith("same"):
                    verdict, counts["same"] = seen + ": not shown", counts["same"] + 1
                else:
                    verdict, counts["missed"] = seen + ": the opposite", counts["missed"] + 1
            print(f"{name:36s} {target:44s} {figure:>9s} {pct(band, 2):>6s}  {verdict}")
    print()
    print(f"targets: {counts['met']} met, {counts['missed']} missed, {counts['same']} within the band"
          f" (A/A {pct(aa_band, 2) if aa else 'none'})")
    for u in unjudged:
        print(u)
    for p in problems:
        print("error: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
