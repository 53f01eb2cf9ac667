#!/usr/bin/env python3
"""tools/gpu/ncu_summary.py on a log shaped like `ncu --csv --page details` output (phase C's ncu_attention
step): the application's lines and ncu's ==PROF== lines skipped, one line per launch, durations converted to
microseconds, the three largest stall reasons in order, a log without a launch named (exit 1).
  test_ncu_summary.py REPO TMPDIR
"""
import os
import subprocess
import sys

repo, tmp = sys.argv[1], sys.argv[2]
os.makedirs(tmp, exist_ok=True)
head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(i, kernel, section, name, unit, value):
    return (f'"{i}","77","bench_gpu_kernels","127.0.0.1","{kernel}","1","7","(128, 1, 1)","(3072, 1, 1)","0","9.0",'
            f'"{section}","{name}","{unit}","{value}"')


fwd = "void gpt2::kernels::(anonymous namespace)::attention_fwd_tc<64>(__nv_bfloat16 *, float *, int)"
bwd = "void gpt2::kernels::(anonymous namespace)::attention_bwd_tc<64>(__nv_bfloat16 *, int, float)"
log = "\n".join([
    "==PROF== Connected to process 77 (/tmp/bundle/bin/bench_gpu_kernels)",
    "Running /tmp/bundle/bin/bench_gpu_kernels",
    "BM_attention_forward_bf16/8/0/0/manual_time  84 us",
    head,
    row(0, fwd, "GPU Speed Of Light Throughput", "Duration", "us", "84.10"),
    row(0, fwd, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "61.20"),
    row(0, fwd, "Occupancy", "Achieved Occupancy", "%", "11.9"),
    row(0, fwd, "Command line profiler metrics", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
        "", "0.50"),
    row(0, fwd, "Command line profiler metrics",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "", "1.75"),
    row(0, fwd, "Command line profiler metrics",
        "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio", "", "0.90"),
    row(0, fwd, "Command line profiler metrics", "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
        "", "0.20"),
    "==PROF== Disconnected from process 77",
    head,
    row(5, bwd, "GPU Speed Of Light Throughput", "Duration", "ms", "1,313.5"),
    row(5, bwd, "Compute Workload Analysis", "Issue Slots Busy", "%", "40.0"),
    row(5, bwd, "Launch Statistics", "Registers Per Thread", "register/thread", "243"),
]) + "\n"
path = os.path.join(tmp, "ncu.log")
with open(path, "w") as f:
    f.write(log)
out = subprocess.run([sys.executable, os.path.join(repo, "tools/gpu/ncu_summary.py"), path], capture_output=True,
                     text=True, check=True).stdout
print(out)
lines = out.splitlines()
failures = []
if len(lines) != 2:
    failures.append(f"two launches, got {len(lines)} lines")
else:
    if lines[0] != ("attention_fwd_tc<64>: us 84.1; sm% 61.2; occupancy% 11.9; "
                    "stalls long_scoreboard 1.75, math_pipe_throttle 0.90, barrier 0.50"):
        failures.append("forward line: " + lines[0])
    if lines[1] != "attention_bwd_tc<64>: us 1313500.0; issue% 40.0; regs 243":
        failures.append("backward line (ms to us, a thousands separator): " + lines[1])
empty = os.path.join(tmp, "empty.log")
with open(empty, "w") as f:
    f.write("==PROF== No kernels were profiled.\n")
r = subprocess.run([sys.executable, os.path.join(repo, "tools/gpu/ncu_summary.py"), path, empty], capture_output=True,
                   text=True)
if r.returncode != 1 or f"{empty}: no ncu launches" not in r.stdout or not r.stdout.startswith("attention_fwd_tc<64>"):
    failures.append(f"a log without launches beside one with: exit {r.returncode}, {r.stdout!r}")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
