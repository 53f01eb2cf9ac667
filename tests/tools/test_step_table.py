#!/usr/bin/env python3
"""tools/gpu/step_table.py on a synthetic device call: the verdicts that decide the defaults, with their noise.

Phase C ends with this table, and a default changes on what it says, so each verdict below fails when the
script misjudges it: a difference outside the band, one inside it, one inside only because of the A/A
pair, the opposite of what a target expects, the rate and "within N%" targets; the first and the profiled
step left out of the mean; a failed run, a missing baseline, a call without runs, bad metrics and a bad
target. Then every train_124m target in tools/gpu-phase.sh must parse and name a step that the phases define.
  test_step_table.py REPO TMPDIR
"""
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

repo, tmp = sys.argv[1], sys.argv[2]
script = os.path.join(repo, "tools/gpu/step_table.py")
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def metrics(step_ms, tokens=16384, profiled=11, spread=None, warmup=1):
    """metrics.jsonl of a 12-step run: the warm-up steps and the profiled step slow (they must not count), the
    others step_ms each, or step_ms + spread[i] in turn."""
    lines = []
    for s in range(1, 13):
        ms = step_ms if spread is None else step_ms + spread[s % len(spread)]
        if s <= warmup:
            ms = 900.0
        if s == profiled:
            ms = 3 * step_ms
            lines.append(json.dumps({"profile_step": s, "step_ms": ms}))
        lines.append(json.dumps({"step": s, "loss": 7.0, "ms": ms, "tokens_per_s": tokens / ms * 1e3}))
    bench = {"benchmark": True, "ms_per_step": step_ms, "global_batch_tokens": tokens}
    if warmup != 1:
        bench["warmup_steps"] = warmup  # runs before 2026-12-07 have no such field: 1
    lines.append(json.dumps(bench))
    return "\n".join(lines) + "\n"


def write_phase(out, phase, runs):
    """runs: [(name, result, target, metrics text or None)] -> summary_<P>.txt and phase_<P>_logs.tar.gz."""
    with open(os.path.join(out, f"summary_{phase}.txt"), "w") as f:
        f.write("\nstep | result | s | figure | target\n---\n")
        for name, result, target, _ in runs:
            # a figure with " | " in it, as train_figure writes them
            f.write(f"{name:30s} | {result:6s} |    5 | {'466.5K tok/s, mfu 37.9% | gemm 55% attention 28%':52s} | "
                    f"{target}\n")
        f.write(f"phase {phase}: {len(runs)} step(s)\n")
    with tarfile.open(os.path.join(out, f"phase_{phase}_logs.tar.gz"), "w:gz") as tar:
        for name, _, _, text in runs:
            if text is None:
                continue
            data = text.encode()
            info = tarfile.TarInfo(f"logs/{name}.metrics.jsonl")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def run(*paths):
    p = subprocess.run([sys.executable, script, *paths], capture_output=True, text=True)
    print(p.stdout + p.stderr)
    return p.returncode, p.stdout + p.stderr


def verdict(out, name, target):
    for line in out.splitlines():
        if line.startswith(name + " ") and target in line:
            return line
    return ""


# ---- a call with phase A's defaults and phase C's A/A pair and opt-ins --------------------------------
call = os.path.join(tmp, "call")
os.makedirs(call)
jitter = [0.0, 0.02, -0.02, 0.01, -0.01]  # +-0.06% of 35 ms: a tight run
write_phase(call, "A", [
    ("train_124m_cublaslt_mb16", "PASS", ">= 470K tok/s", metrics(35.0, spread=jitter)),  # 468.1K
    ("train_124m_hand_mb16", "PASS", "within 15% of train_124m_cublaslt_mb16", metrics(42.0, spread=jitter)),
    ("train_124m_cublaslt_64k", "PASS", ">= 470K tok/s", metrics(138.0, tokens=65536, spread=jitter)),  # 474.9K
])
write_phase(call, "C", [
    ("aa_cublaslt_mb16", "PASS", "same as train_124m_cublaslt_mb16", metrics(35.175, spread=jitter)),  # 0.5% apart
    ("opt_fast", "PASS", "faster than train_124m_cublaslt_mb16", metrics(34.0, spread=jitter)),  # 2.9% faster
    ("opt_in_aa_band", "PASS", "faster than train_124m_cublaslt_mb16", metrics(34.86, spread=jitter)),  # 0.4%
    ("opt_backwards", "PASS", "faster than train_124m_cublaslt_mb16", metrics(36.0, spread=jitter)),  # 2.8% slower
    ("opt_noisy", "PASS", "faster than train_124m_cublaslt_mb16",
     metrics(34.3, spread=[0.0, 3.0, -3.0, 2.5, -2.5])),  # ~4% faster, but steps spread +-8%
    ("opt_expected_slower", "PASS", "slower than train_124m_hand_mb16", metrics(44.0, spread=jitter)),
    ("opt_two", "PASS", "vs train_124m_hand_mb16; within 15% of train_124m_cublaslt_mb16",
     metrics(40.0, spread=jitter)),
    ("opt_orphan", "PASS", "faster than opt_never_ran", metrics(34.0, spread=jitter)),
    # --cuda-graph: step 2 captures the graph (warmup_steps 2), slow like step 1, and left out like it
    ("opt_graph", "PASS", "faster than train_124m_cublaslt_mb16", metrics(34.0, spread=jitter, warmup=2)),
    # 4 micro-steps a step: 4x the tokens in 4x the time is the same speed
    ("opt_64k_same_speed", "PASS", "vs train_124m_cublaslt_mb16", metrics(140.0, tokens=65536, spread=jitter)),
    # the default step again at the end of the phase: 0.99% slower than phase A's run, 0.5% than the first A/A
    ("aa_end_cublaslt_mb16", "PASS", "same as train_124m_cublaslt_mb16; same as aa_cublaslt_mb16",
     metrics(35.35, spread=jitter)),
    ("opt_failed", "FAIL", "faster than train_124m_cublaslt_mb16", metrics(20.0)),
    ("opt_skipped", "SKIP", "faster than opt_failed", None),
])
rc, out = run(call)
check(rc == 0, "a call with every kind of target: exit 0")
m = re.search(r"^train_124m_cublaslt_mb16 +(\d+\.\d)K", out, re.M)
check(m is not None and abs(float(m[1]) - 468.1) <= 0.15,
      "the mean leaves out step 1 and the profiled step (468.1K tok/s at 35 ms, not the slow steps' mean)")
check("A/A: aa_cublaslt_mb16 and train_124m_cublaslt_mb16, the same run twice in this call: 0.50% apart" in out,
      "the A/A pair is reported with its difference")
check("A/A: aa_end_cublaslt_mb16 and train_124m_cublaslt_mb16, the same run twice in this call: 0.99% apart" in out
      and "A/A: aa_end_cublaslt_mb16 and aa_cublaslt_mb16, the same run twice in this call: 0.50% apart" in out,
      "an A/A step with two partners: each difference reported")
check("the widest A/A, 0.99%" in out, "the band is the widest A/A difference (the drift over the phase)")
check("0.4% short, within the band: not shown" in verdict(out, "train_124m_cublaslt_mb16", ">= 470K"),
      "468.1K is 0.4% short of 470K, inside the 0.5% A/A band")
check(verdict(out, "train_124m_cublaslt_64k", ">= 470K").endswith("met"), "the 64K step's 474.9K meets 470K")
check("missed: 1.7% short of 0.85x" in verdict(out, "train_124m_hand_mb16", "within 15%"),
      "the hand step at 0.833x misses within 15% by 1.7%")
check("faster by 2.9%: as expected" in verdict(out, "opt_fast", "faster than"), "2.9% faster, outside the band")
check("same within the band: not shown" in verdict(out, "opt_in_aa_band", "faster than"),
      "0.4% faster with a tight spread is inside the 0.5% A/A band")
check("slower by 2.8%: the opposite" in verdict(out, "opt_backwards", "faster than"),
      "an opt-in that is slower against 'faster than' is called the opposite")
check("same within the band: not shown" in verdict(out, "opt_noisy", "faster than"),
      "~4% faster with steps that spread 8% is inside its own band")
check("slower by 4.5%: as expected" in verdict(out, "opt_expected_slower", "slower than"),
      "'slower than' met by a slower run")
check("faster by 5.0%" in verdict(out, "opt_two", "vs train_124m_hand_mb16") and
      verdict(out, "opt_two", "within 15%").endswith("met"), "two clauses in one target, each judged")
check("not judged: opt_orphan faster than opt_never_ran, which did not run in this call" in out,
      "a baseline missing from the call is noted, not an error")
check(re.search(r"^opt_failed ", out, re.M) is None, "a run whose step failed is not judged")
check("faster by 2.9%: as expected" in verdict(out, "opt_graph", "faster than"),
      "a --cuda-graph run's capture step (warmup_steps 2) is left out of its mean")
check("same within the band" in verdict(out, "opt_64k_same_speed", "vs train_124m_cublaslt_mb16"),
      "runs of different batches compared by tokens/s, not by step time")
check("targets: 5 met, 2 missed, 3 within the band (A/A 0.99%)" in out, "the counts line (the step's figure)")

# ---- without the A/A pair, the 0.4% difference is outside the runs' own band -------------------------
no_aa = os.path.join(tmp, "no_aa")
os.makedirs(no_aa)
write_phase(no_aa, "A", [("train_124m_cublaslt_mb16", "PASS", ">= 470K tok/s", metrics(35.0, spread=jitter))])
write_phase(no_aa, "C", [("opt_in_aa_band", "PASS", "faster than train_124m_cublaslt_mb16",
                          metrics(34.86, spread=jitter))])
rc, out = run(no_aa)
check(rc == 0 and "faster by 0.4%: as expected" in verdict(out, "opt_in_aa_band", "faster than"),
      "without an A/A pair the band is the runs' own (0.4% faster is outside it)")
check("missed: 0.4% short" in verdict(out, "train_124m_cublaslt_mb16", ">= 470K"),
      "and 0.4% short of 470K is outside it: missed")
check("no A/A pair in these runs" in out, "and the table says the band lacks the A/A part")

# ---- phase C in a call of its own: the A/A step ran, its partner did not ------------------------------
alone = os.path.join(tmp, "alone")
os.makedirs(alone)
write_phase(alone, "C", [("aa_cublaslt_mb16", "PASS", "same as train_124m_cublaslt_mb16", metrics(35.0))])
rc, out = run(alone)
check(rc == 0 and "A/A: aa_cublaslt_mb16 ran, but its partner train_124m_cublaslt_mb16 is not among these runs" in out,
      "an A/A step without its partner in the call says so")

# ---- a phase archive alone, no summary: listed, not judged ------------------------------------------
rc, out = run(os.path.join(no_aa, "phase_C_logs.tar.gz"))
check(rc == 0 and re.search(r"^opt_in_aa_band +47\d\.\dK", out, re.M) is not None and "as expected" not in out,
      "an archive without its summary: the runs listed, nothing judged")

# ---- errors and the call without a GPU -------------------------------------------------------------
empty = os.path.join(tmp, "empty")
os.makedirs(empty)
rc, out = run(empty)
check(rc == 77 and "skipped" in out, "no 124M run (a call without a GPU): exit 77, skipped")
bad_target = os.path.join(tmp, "bad_target")
os.makedirs(bad_target)
write_phase(bad_target, "C", [("opt_x", "PASS", "faster than mma.sync", metrics(35.0))])
rc, out = run(bad_target)
check(rc == 1 and "error: opt_x: target clause 'faster than mma.sync'" in out, "a target that does not parse: exit 1")
bad_json = os.path.join(tmp, "bad_json")
os.makedirs(bad_json)
write_phase(bad_json, "C", [("opt_x", "PASS", "vs opt_x", "{\"step\": 1, \"ms\"\n")])
rc, out = run(bad_json)
check(rc == 1 and "opt_x: line 1 of its metrics.jsonl is not JSON" in out, "metrics that do not parse: exit 1")
unfinished = os.path.join(tmp, "unfinished")
os.makedirs(unfinished)
write_phase(unfinished, "C", [("opt_x", "PASS", "vs opt_x", "\n".join(metrics(35.0).splitlines()[:-1]))])
rc, out = run(unfinished)
check(rc == 1 and "no benchmark line" in out, "a run without its benchmark line: exit 1")

# ---- every train_124m target in the phases parses and names a step they define ----------------------
spec = importlib.util.spec_from_file_location("step_table", script)
step_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_table)
phase_sh = open(os.path.join(repo, "tools/gpu-phase.sh")).read().replace("\\\n", " ")
calls = re.findall(r'^\s*train_124m (\S+) "([^"]*)"', phase_sh, re.M)
names = {n for n, _ in calls}
check(len(calls) >= 20, f"gpu-phase.sh's train_124m steps found ({len(calls)})")
for name, target in calls:
    check(step_table.TRAIN_STEP.match(name) is not None, f"{name}: a name step_table reads (train_124m_, opt_, aa_)")
    try:
        clauses = step_table.parse_target(target)
    except ValueError as e:
        check(False, f"{name}: {e}")
        continue
    for _, _, other in clauses:
        if other is not None:
            check(other in names and other != name, f"{name}: its target names {other}, a train_124m step")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
