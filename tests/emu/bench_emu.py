#!/usr/bin/env python3
"""bench_gpu_kernels on the emulated GPU: phase A's kernel figures come from this binary and
tools/gpu/bench_table.py, on a lent GPU's one device call, so both run here first.

  bench_emu.py BENCH_BINARY REPO WORK_DIR

One run, on a device of 4 GiB (EMU_DEVICE_MEMORY_MIB), of benchmarks cheap to emulate: the LM head's forward
at B*T = 65536, whose 6.6 GB of logits the device cannot hold, and three others (a cuBLASLt weight gradient
with its bias gradient fused in bf16 sums, a layernorm forward, the copy ceiling), at least one of which the binary
registers after the LM head. The LM head must become an error row saying how much it asked for, while the
others still measure; the process must exit 1, its --benchmark_out JSON be whole, and bench_table.py judge
the rows and name the error. Timings are the emulator's (meaningless): what is checked is that the harness
runs, and fails one benchmark at a time.
"""
import json
import os
import re
import subprocess
import sys

bench, repo, work = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)
out_json = os.path.join(work, "bench.json")
wanted = ["Ceiling/copy_d2d/1GiB", "Gemm/bf16/cublaslt/lm_head/fwd/BT:65536",
          "WeightBiasGrad/bf16/cublaslt_bgrad_bf16/attn_proj/BT:8192", "BM_layernorm_fwd_bf16/8192/768"]
failing = wanted[1]
env = dict(os.environ, EMU_FIBERS="1", EMU_DEVICE_MEMORY_MIB="4096")
try:
    r = subprocess.run([bench, "--benchmark_filter=^(" + "|".join(re.escape(w) for w in wanted) + ")/",
                        "--benchmark_min_time=0", "--benchmark_out=" + out_json, "--benchmark_out_format=json"],
                       capture_output=True, text=True, env=env, timeout=900)
except subprocess.TimeoutExpired:
    print("FAIL: bench_gpu_kernels did not end within 900 s")
    sys.exit(1)
print(r.stdout[-3000:], r.stderr[-3000:])
problems = []
if r.returncode != 1:
    problems.append(f"exit {r.returncode}: a failed benchmark must make it 1")
if "out of GPU memory" not in r.stderr:
    problems.append("fatal()'s message (out of GPU memory) is not on stderr")
try:
    with open(out_json) as f:
        benchmarks = json.load(f)["benchmarks"]
    rows = {w: b for w in wanted for b in benchmarks if b["name"].startswith(w + "/")}
    order = [w for b in benchmarks for w in wanted if b["name"].startswith(w + "/")]
    if failing in order and order.index(failing) == len(order) - 1:
        problems.append(f"no benchmark ran after the failing one (order {order}): continuing is not shown")
except (OSError, ValueError) as e:
    rows = {}
    problems.append(f"the --benchmark_out JSON is not whole: {e}")
for name in wanted:
    b = rows.get(name)
    if b is None:
        problems.append(f"{name}: no row (the failure before it ended the run?)")
    elif name == failing:
        if not (b.get("error_occurred") and "out of GPU memory" in b.get("error_message", "")):
            problems.append(f"{name}: expected an error row naming the allocation, got {b}")
    elif b.get("error_occurred") or not (b.get("GB_per_s") or b.get("TFLOP_per_s")):
        problems.append(f"{name}: expected a measured row, got {b}")
if rows.get(wanted[2], {}).get("fused") != 1:
    problems.append(f"{wanted[2]}: the bias gradient did not ride on the cuBLASLt product (fused counter)")

t = subprocess.run([sys.executable, os.path.join(repo, "tools/gpu/bench_table.py"), out_json, out_json],
                   capture_output=True, text=True)
print(t.stdout, t.stderr)
if t.returncode != 0:
    problems.append(f"bench_table.py exited {t.returncode}")
if not any(l.startswith(failing) and "not run: failed: out of GPU memory" in l for l in t.stdout.splitlines()):
    problems.append("bench_table.py does not show the failed benchmark's error")
if not any(l.startswith("BM_layernorm_fwd") and "of copy  target 80% of copy" in l for l in t.stdout.splitlines()):
    problems.append("bench_table.py does not judge the layernorm row against the copy ceiling")

for p in problems:
    print("FAIL:", p)
print(f"{'FAIL' if problems else 'PASS'}: {len(wanted)} benchmarks, 1 failing by design (device memory), "
      f"{len(problems)} problem(s)")
sys.exit(1 if problems else 0)
