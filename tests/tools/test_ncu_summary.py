#!/usr/bin/env python3
"""tools/gpu/ncu_summary.py on logs shaped like `ncu --csv --page details` output (phase C's ncu_attention
step).

The fixtures ncu_summary_attention_bwd_tc.csv and ncu_summary_attention_bwd_wgmma_tma.csv are trimmed copies of
what ncu printed on an H200 (2026-11-27): the benchmark's banner before the header, a 20-column header whose
metric rows have 16 fields (the rule columns left off), rule rows with the metric columns empty, thousands
separators ("302,048"), Duration in ns, kernel names like "void unnamed>::attention_bwd_tc<64>(...)". The
tool once skipped every metric row of that shape and printed "no metrics" with exit 0.

Checked: one full line a launch (durations in microseconds, the three largest stall reasons in order); the
application's lines and ncu's ==PROF== lines skipped; and exit 1, naming the log and the kernel, for a launch
with no usable metrics, one missing a figure the line needs, a duration in an unknown unit, fewer than three
stall metrics, and a log without a launch.
  test_ncu_summary.py REPO TMPDIR
"""
import os
import subprocess
import sys

repo, tmp = sys.argv[1], sys.argv[2]
os.makedirs(tmp, exist_ok=True)
tool = os.path.join(repo, "tools/gpu/ncu_summary.py")
here = os.path.join(repo, "tests/tools")
real_tc = os.path.join(here, "ncu_summary_attention_bwd_tc.csv")
real_wgmma = os.path.join(here, "ncu_summary_attention_bwd_wgmma_tma.csv")
failures = []


def run(*paths):
    r = subprocess.run([sys.executable, tool, *paths], capture_output=True, text=True)
    print(f"$ ncu_summary.py {' '.join(os.path.basename(p) for p in paths)}  (exit {r.returncode})\n{r.stdout}{r.stderr}")
    return r


def write(name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def check(what, ok):
    if not ok:
        failures.append(what)


# --- the real format ----------------------------------------------------------------------------------
TC_LINE = ("attention_bwd_tc<64>: us 302.0; sm% 41.8; mem% 40.8; issue% 41.8; eligible 0.55; occupancy% 12.4; "
           "regs 243; stalls wait 1.69, short_scoreboard 0.55, not_selected 0.29")
WGMMA_LINE = ("attention_bwd_wgmma_tma: us 384.9; sm% 12.9; mem% 26.6; issue% 12.9; eligible 0.17; occupancy% 13.5; "
              "regs 168; stalls barrier 5.47, long_scoreboard 4.97, wait 1.01")
r = run(real_tc, real_wgmma)
check(f"real ncu CSVs: exit {r.returncode}, want 0", r.returncode == 0)
check(f"real ncu CSVs: lines {r.stdout.splitlines()!r}, want {[TC_LINE, WGMMA_LINE]!r}",
      r.stdout.splitlines() == [TC_LINE, WGMMA_LINE])

with open(real_tc) as f:
    tc_lines = f.readlines()
header_at = next(i for i, l in enumerate(tc_lines) if l.startswith('"ID"'))
banner, header, rows = tc_lines[:header_at], tc_lines[header_at], tc_lines[header_at + 1:]
rule_rows = [l for l in rows if '"","","","' in l]  # Metric Name, Unit and Value empty
check("the fixture has rule rows (20 fields, the metric columns empty)", len(rule_rows) >= 2)


def without(*names):
    return "".join(banner + [header] + [l for l in rows if not any(f'","{n}","' in l for n in names)])


def is_error(r, log, kernel, *words):
    """exit 1 and an error line naming the log and the kernel (and each of words), no summary line for it."""
    line = next((l for l in r.stdout.splitlines() if l.startswith("error:") and kernel in l and log in l), "")
    return (r.returncode == 1 and line != "" and all(w in line for w in words)
            and not any(l.startswith(kernel + ":") for l in r.stdout.splitlines()))


# A launch the log shows only in rule rows: no usable metrics.
only_rules = write("only_rules.csv", "".join(banner + [header] + rule_rows))
r = run(only_rules)
check(f"a launch with only rule rows: exit {r.returncode}, {r.stdout!r}",
      is_error(r, only_rules, "attention_bwd_tc<64>", "no usable metrics"))

# Every metric not a number: no usable metrics, beside a log that is fine (its line still printed).
na = write("na.csv", "".join(banner + [header] + [
    l[:l.rstrip().rstrip(",").rfind(',"')] + ',"n/a",\n' if l not in rule_rows else l for l in rows]))
r = run(real_wgmma, na)
check(f"metrics that are all n/a: exit {r.returncode}, {r.stdout!r}",
      is_error(r, na, "attention_bwd_tc<64>", "no usable metrics") and r.stdout.startswith(WGMMA_LINE + "\n"))

# Each figure the line needs, taken away in turn.
for label, names in [("us", ["Duration"]), ("sm%", ["Compute (SM) Throughput"]), ("mem%", ["Memory Throughput"]),
                     ("issue%", ["Issue Slots Busy"]),
                     ("eligible", ["Eligible Warps Per Scheduler", "smsp__warps_eligible.avg.per_cycle_active"]),
                     ("occupancy%", ["Achieved Occupancy"]), ("regs", ["Registers Per Thread"])]:
    log = write(f"no_{label.rstrip('%')}.csv", without(*names))
    r = run(log)
    check(f"no {label}: exit {r.returncode}, {r.stdout!r}", is_error(r, log, "attention_bwd_tc<64>", "missing " + label))

# Fewer than three stall reasons.
stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
log = write("two_stalls.csv", without(*(stall.format(s) for s in ["barrier", "long_scoreboard", "not_selected",
                                                                    "short_scoreboard"])))
r = run(log)
check(f"two stall metrics: exit {r.returncode}, {r.stdout!r}", is_error(r, log, "attention_bwd_tc<64>", "stalls"))

# A duration without a unit is not read as microseconds.
log = write("duration_no_unit.csv", "".join(l.replace('"Duration","ns","302,048"', '"Duration","","302,048"')
                                            for l in tc_lines))
r = run(log)
check(f"a duration without a unit: exit {r.returncode}, {r.stdout!r}",
      is_error(r, log, "attention_bwd_tc<64>", "us (", "302,048"))

# --- the older shape: 15 columns, two launches in one log, ==PROF== lines between, the --metrics names ---
head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(i, kernel, section, name, unit, value):
    return (f'"{i}","77","bench_gpu_kernels","127.0.0.1","{kernel}","1","7","(128, 1, 1)","(3072, 1, 1)","0","9.0",'
            f'"{section}","{name}","{unit}","{value}"')


fwd = "void gpt2::kernels::(anonymous namespace)::attention_fwd_tc<64>(__nv_bfloat16 *, float *, int)"
bwd = "void gpt2::kernels::(anonymous namespace)::attention_bwd_tc<64>(__nv_bfloat16 *, int, float)"
cl = "Command line profiler metrics"


def launch(i, kernel, duration_unit, duration, issue_name, eligible_name, stalls):
    return [row(i, kernel, "GPU Speed Of Light Throughput", "Duration", duration_unit, duration),
            row(i, kernel, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "61.20"),
            row(i, kernel, "GPU Speed Of Light Throughput", "Memory Throughput", "%", "33.3"),
            row(i, kernel, cl, issue_name, "%", "40.0"),
            row(i, kernel, cl, eligible_name, "warp", "1.25"),
            row(i, kernel, "Occupancy", "Achieved Occupancy", "%", "11.9"),
            row(i, kernel, "Launch Statistics", "Registers Per Thread", "register/thread", "243")] + [
            row(i, kernel, cl, stall.format(s), "inst", v) for s, v in stalls]


log = "\n".join([
    "==PROF== Connected to process 77 (/tmp/bundle/bin/bench_gpu_kernels)",
    "Running /tmp/bundle/bin/bench_gpu_kernels",
    "BM_attention_forward_bf16/8/0/0/manual_time  84 us",
    head,
    *launch(0, fwd, "us", "84.10", "smsp__issue_active.avg.pct_of_peak_sustained_active",
            "smsp__warps_eligible.avg.per_cycle_active",
            [("barrier", "0.50"), ("long_scoreboard", "1.75"), ("math_pipe_throttle", "0.90"), ("wait", "0.20")]),
    "==PROF== Disconnected from process 77",
    head,
    *launch(5, bwd, "msecond", "1,313.5", "Issue Slots Busy", "Eligible Warps Per Scheduler",
            [("barrier", "2"), ("mio_throttle", "1,000.5"), ("wait", "0.125")]),
]) + "\n"
path = write("ncu.log", log)
r = run(path)
want = ["attention_fwd_tc<64>: us 84.1; sm% 61.2; mem% 33.3; issue% 40.0; eligible 1.25; occupancy% 11.9; regs 243; "
        "stalls long_scoreboard 1.75, math_pipe_throttle 0.90, barrier 0.50",
        "attention_bwd_tc<64>: us 1313500.0; sm% 61.2; mem% 33.3; issue% 40.0; eligible 1.25; occupancy% 11.9; "
        "regs 243; stalls mio_throttle 1000.50, barrier 2.00, wait 0.12"]
check(f"two launches in one log: exit {r.returncode}, {r.stdout.splitlines()!r}, want {want!r}",
      r.returncode == 0 and r.stdout.splitlines() == want)

# --- a log without a launch beside one with ---------------------------------------------------------------
empty = write("empty.log", "==PROF== No kernels were profiled.\n")
r = run(path, empty)
check(f"a log without launches beside one with: exit {r.returncode}, {r.stdout!r}",
      r.returncode == 1 and f"error: no ncu launches in {empty}" in r.stdout and r.stdout.startswith(want[0]))

for f in failures:
    print("FAIL:", f)
print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
