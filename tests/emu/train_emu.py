#!/usr/bin/env python3
"""The training programs on the GPU path, on the emulator (emu.sh --train; README.md here): gpt2-train,
gpt2-sample and the device reducer's test, built by emu.sh --train-build with every CUDA kernel run by the
emulator, cuBLASLt emulated from its documented contract and NCCL emulated over MPI. What the lent GPU's phase
B runs (tests/gpu/test_gpu_train.py) but at a size the emulator takes seconds a step for, mostly with the hand
GEMM (the emulated cuBLASLt computes in double: what it checks is the wrapper's use of the API):
  1. --device cuda follows the CPU backend's loss trajectory: fp32 to 1e-4, bf16 to 2e-2, the opt-in Hopper
     kernels (wgmma GEMM, wgmma attention forward and backward) in bf16 to 2e-2, and the default GEMM backend
     (cuBLASLt, its fused epilogues and bias gradients) in fp32 to 1e-4 and bf16 to 2e-2;
  2. bf16 resume from a checkpoint continues bit for bit; --recompute full repeats fp32 bit for bit;
  3. gradient accumulation, 2 ranks with --comm mpi (the host-staged reducer), 2 ranks with --comm nccl
     (one emulated device each: the device reducer on NCCL's stream), and ZeRO-1 on NCCL all follow one
     rank with the whole micro-batch (fp32: 1e-4; bf16 on NCCL: 2e-2);
  4. gpt2-sample --device cuda prints the same text as --device cpu from the same checkpoint and seed;
  5. the device reducer's exact all-reduce (tests/gpu/test_device_reducer.cpp) on 1 and 2 ranks;
  6. --cuda-graph (each micro-step's forward and backward captured once, then replayed) repeats the eager run
     bit for bit, fp32 with accumulation and bf16, and the emulator counts the captures and launches it expects;
     the emulated capture refuses what CUDA's refuses (graph_capture_test.cpp);
  7. on NCCL (a nonblocking communicator, emulated as always in progress), a peer hung before a gradient
     bucket, before the ranks meet to set NCCL up or before NCCL's initialisation, and an initialisation that
     never completes, end the job within --comm-timeout-s with the message that names the cause; an
     asynchronous NCCL error on one rank (EMU_NCCL_ASYNC_ERROR) ends it with NCCL's reason; ranks whose
     nodes resolve different backends (1 and 2 GPUs) end it at once, saying so.
usage: train_emu.py EMU_TRAIN_DIR WORK_DIR MPIEXEC [--streams]    (EMU_TRAIN_DIR: BUILD_DIR/train of emu.sh)
--streams: only the fp32 checks that the ordering between streams and the host decides (accumulation, the
CUDA graph's replay, 2 ranks over MPI and NCCL, ZeRO-1), stopping at the first failure: what emu.sh --mutants
runs for the stream-ordering mutants of the training code, with EMU_ASYNC_STREAMS=1."""
import re
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

bin_dir, work, mpiexec = sys.argv[1], sys.argv[2], sys.argv[3]
streams_only = "--streams" in sys.argv[4:]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE",
           EMU_FIBERS="1")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
rnd = random.Random(1)
words = "the of and to in that he shall unto for his a lord they be is him not them it with all thou".split()
open(f"{work}/corpus.txt", "w").write(" ".join(rnd.choice(words) for _ in range(20000)))
subprocess.run([f"{bin_dir}/gpt2-data", "prepare", "--tokenizer", "byte", "--text", f"{work}/corpus.txt",
                "--out", f"{work}/data"], check=True, capture_output=True, env=env)

# Head size 64 and T = 64: the tensor-core paths (mma.sync, and wgmma when asked for) take these shapes.
common = ["--n-layer", "2", "--n-head", "2", "--n-embd", "128", "--vocab-size", "256", "--max-seq-len", "64",
          "--seq-len", "64", "--global-batch-tokens", "256", "--lr", "3e-3", "--warmup-steps", "2",
          "--train-data", f"{work}/data/train.h5", "--log-every", "1"]
cuda = ["--device", "cuda", "--gemm", "hand"]
lt = ["--device", "cuda", "--gemm", "cublaslt"]
fp32 = ["--precision", "fp32"]
failures = []


def launch(cmd, extra_env=None, timeout=120 if streams_only else 600):
    """(exit status, stdout, stderr) of cmd. A command that does not end in time is killed with everything it
    started (mpiexec's ranks too) and this script exits 124, as a hang; one that cannot start exits 2."""
    try:
        p = subprocess.Popen(cmd, env=dict(env, **(extra_env or {})), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    except OSError as e:
        print(f"ERROR: cannot run {cmd[0]}: {e}", flush=True)
        sys.exit(2)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        print(f"HANG: {' '.join(cmd)} did not end within {timeout} s", flush=True)
        sys.exit(124)
    return p.returncode, out, err


def run(cmd, name, extra_env=None):
    """stdout and stderr of cmd; a failure (non-zero exit) fails the check run."""
    rc, out, err = launch(cmd, extra_env)
    if rc != 0:
        print(out[-3000:], err[-3000:])
        print(f"FAIL {name}: exited {rc}: {' '.join(cmd)}", flush=True)
        sys.exit(1)
    return out, err


def train(name, steps, extra=(), ranks=1, micro_batch=4, extra_env=None):
    if streams_only and failures:
        raise SystemExit(f"{len(failures)} failure(s)")  # fail fast: the mutant is caught
    out = f"{work}/{name}"
    cmd = [f"{bin_dir}/gpt2-train", *common, "--micro-batch", str(micro_batch), "--max-steps", str(steps),
           "--out", out, *extra]
    if ranks > 1:
        cmd = [mpiexec, "--oversubscribe", "-n", str(ranks)] + \
              [a for k in (extra_env or {}) for a in ("-x", k)] + cmd
    train.log = "".join(run(cmd, name, extra_env))
    rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}, out


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        failures.append(name)


def compare(name, a, b, rtol):
    if sorted(a) != sorted(b) or not b:
        return check(name, False, f": steps {sorted(a)} against {sorted(b)}")
    worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in b)
    check(name, worst <= rtol, f": worst relative loss difference {worst:.2e} (bound {rtol:g})")


steps = 3
two_devices = {"EMU_DEVICES": "2"}


def graph_check(name, extra, micro_batch, eager, launches):
    """A --cuda-graph run against its eager twin's losses, bit for bit: the first micro-step runs eagerly (the
    warm-up), the second is captured into the one graph, and every micro-step from then on is a launch of it
    (the capturing one too): `launches` in all, as the emulator's report at exit says."""
    graphed, _ = train(name, steps, cuda + extra + ["--cuda-graph"], micro_batch=micro_batch)
    check(f"{name}: --cuda-graph repeats the eager run bit for bit", graphed == eager, f": {graphed} against {eager}")
    report = re.search(r"CUDA graphs: (\d+) captured \(\d+ nodes\), (\d+) launches", train.log)
    counts = (int(report[1]), int(report[2])) if report else None
    check(f"{name}: one graph captured, launched {launches} times", counts == (1, launches),
          f": the emulator's report {report[0] if report else 'is missing'}")


def stream_checks(gpu32):
    """The fp32 checks against one rank (gpu32's losses) that the ordering between streams and the host decides,
    in the order --streams runs them."""
    two_nccl, _ = train("fp32_2ranks_nccl", steps, cuda + fp32 + ["--comm", "nccl"], ranks=2, micro_batch=2,
                        extra_env=two_devices)
    compare("fp32 2 ranks, --comm nccl == 1 rank", two_nccl, gpu32, 1e-4)
    zero, _ = train("fp32_2ranks_zero1", steps, cuda + fp32 + ["--comm", "nccl", "--zero", "1"], ranks=2,
                    micro_batch=2, extra_env=two_devices)
    compare("fp32 2 ranks, --comm nccl --zero 1 == 1 rank", zero, gpu32, 1e-4)
    two_mpi, _ = train("fp32_2ranks_mpi", steps, cuda + fp32 + ["--comm", "mpi"], ranks=2, micro_batch=2)
    compare("fp32 2 ranks, --comm mpi == 1 rank", two_mpi, gpu32, 1e-4)
    accumulated, _ = train("fp32_accumulate", steps, cuda + fp32, micro_batch=2)
    compare("fp32 gradient accumulation (2 x micro-batch 2) == micro-batch 4", accumulated, gpu32, 1e-4)
    graph_check("fp32_graph", fp32, 2, accumulated, 2 * steps - 1)
    return accumulated


L, C, T = 2, 128, 64  # common's model and sequence length


def profile_check(name, out, micro_batch, micro_steps, ranks=1):
    """--profile-step 2 (the run's metrics.jsonl line and its log's table): every op of the step, each as often as
    the model runs it per micro-step (L layers) or per step, the GEMMs' and attention's work from their shapes, the
    times adding up."""
    rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    prof = next((r for r in rows if "profile_step" in r), None)
    if prof is None:
        return check(f"{name}: a profile line in metrics.jsonl", False)
    ops = {o["op"]: o for o in prof["ops"]}
    m, N = micro_steps, micro_batch * T
    want = {"inputs to the device": m, "encoder forward": m, "layernorm forward": m, "gemm qkv forward (+bias)": L * m,
            "attention forward": L * m, "gemm attn_proj forward (+bias)": L * m,
            "residual + layernorm forward": 2 * L * m, "gemm mlp_up forward (+bias, GELU)": L * m,
            "gemm mlp_down forward (+bias)": L * m, "gemm lm_head forward": m,
            "softmax + cross-entropy (+dlogits)": m, "losses to the host": m, "gemm lm_head dinp": m,
            "gemm lm_head dw": m, "zero dresidual": m, "layernorm backward": (2 * L + 1) * m,
            "encoder backward": m, "zero the gradients": 1, "gradient norm": 1, "adamw": 1,
            "the update's check (its non-finite flag)": 1}
    for op in ("gemm mlp_down dinp (+GELU backward)", "gemm mlp_down dw (+dbias)", "gemm mlp_up dinp",
               "gemm mlp_up dw (+dbias)", "gemm attn_proj dinp", "gemm attn_proj dw (+dbias)", "attention backward",
               "gemm qkv dinp", "gemm qkv dw (+dbias)"):
        want[op] = L * m
    if ranks > 1:  # after ln_f's backward, after each block's, after the encoder's; the wait for the last buckets
        want["gradient buckets handed to the reducer"] = L + 2
        want["waiting for the gradient all-reduce"] = 1
    got = {op: o["calls"] for op, o in ops.items()}
    check(f"{name}: the profile holds every op of the step, as often as the model runs it", got == want,
          f": {sorted(set(got.items()) ^ set(want.items()))} differ")
    qkv = ops.get("gemm qkv forward (+bias)", {}).get("flops")
    check(f"{name}: the qkv GEMM's flops are 2 N 3C C a layer", qkv == 2.0 * N * 3 * C * C * L * m, f": {qkv}")
    att = ops.get("attention backward", {}).get("flops")
    check(f"{name}: the attention backward's flops are 2.5 x 2 N T C a layer", att == 2.5 * 2 * N * T * C * L * m,
          f": {att}")
    total = sum(o["ms"] for o in prof["ops"]) + prof["idle_ms"]
    check(f"{name}: the ops and the idle time add up to the device time, none negative",
          all(o["ms"] >= 0 for o in prof["ops"]) and prof["idle_ms"] >= 0 and prof["device_ms"] > 0 and
          abs(total - prof["device_ms"]) <= 1e-3 * len(prof["ops"]), f": {total} against {prof['device_ms']}")
    table = re.search(r"profile of step 2 on rank 0's GPU.*\n(  .*\n)+  by kind: .*gemm [\d.]+ ms", train.log)
    check(f"{name}: the log has the table", table is not None)


if streams_only:
    stream_checks(train("fp32", steps, cuda + fp32)[0])
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)

cpu, _ = train("cpu", steps, ["--device", "cpu", "--threads", "2"])
gpu32, out32 = train("fp32", steps, cuda + fp32)
compare("GPU fp32 == CPU", gpu32, cpu, 1e-4)
bf16, out16 = train("bf16", 4, cuda + ["--ckpt-every", "2"])
compare("GPU bf16 ~ CPU", {s: bf16[s] for s in range(1, steps + 1)}, cpu, 2e-2)
# The emulated device is compute capability 9.0, where the hand GEMM's bf16 default is its wgmma kernel with
# 128x256 tiles; GPT2_GEMM_SM90=0 runs mma.sync, every other GPU's.
check("the bf16 hand GEMM ran wgmma 128x256 (the default on 9.0)", "gemm: hand wgmma 128x256;" in train.log,
      ": 'gemm: hand wgmma 128x256;' in its log")
# The wgmma GEMM's bulk-store epilogue (GPT2_GEMM_STORE=bulk): the same bits as its threads' stores, so the
# same losses as the default run's, every one
bulk16, _ = train("bf16_bulk_store", steps, cuda, extra_env={"GPT2_GEMM_STORE": "bulk"})
compare("GPU bf16, the wgmma GEMM's bulk stores == its threads' stores", bulk16,
        {s: bf16[s] for s in range(1, steps + 1)}, 0.0)
check("the bulk-store run stored with bulk copies", "gemm store: bulk" in train.log, ": 'gemm store: bulk' in its log")
mma16, _ = train("bf16_mma_sync", steps, cuda, extra_env={"GPT2_GEMM_SM90": "0"})
compare("GPU bf16, mma.sync GEMM ~ CPU", mma16, cpu, 2e-2)
check("the GPT2_GEMM_SM90=0 run ran mma.sync alone", "gemm: hand mma.sync;" in train.log,
      ": 'gemm: hand mma.sync;' in its log")
hopper, _ = train("bf16_sm90a", steps, cuda,
                  extra_env={"GPT2_GEMM_SM90": "1", "GPT2_ATTENTION_FWD": "wgmma", "GPT2_ATTENTION_BWD": "wgmma"})
compare("GPU bf16, wgmma GEMM and attention ~ CPU", hopper, cpu, 2e-2)
kernels = "kernels: gemm: hand wgmma 128x128; attention forward: wgmma; attention backward: wgmma"
check("the wgmma run ran the wgmma kernels", kernels in train.log, f": {kernels!r} in its log")
# The attention backward that stores dS, in the model: its workspace sized for the path it runs (the dS
# tiles in place of the dQ accumulator; the emulated cudaMalloc fills with NaN, so a dS value read unwritten
# shows in the losses)
storeds, _ = train("bf16_store_ds", steps, cuda, extra_env={"GPT2_ATTENTION_BWD": "store-ds"})
compare("GPU bf16, store-ds attention backward ~ CPU", storeds, cpu, 2e-2)
check("the store-ds run ran it", "attention backward: store-ds" in train.log, ": 'attention backward: store-ds' in its log")
# ... and with the wgmma dK/dV kernel storing dS (the same workspace; its dS^T writer warp's copies)
wstoreds, _ = train("bf16_wgmma_store_ds", steps, cuda, extra_env={"GPT2_ATTENTION_BWD": "wgmma-store-ds"})
compare("GPU bf16, wgmma-store-ds attention backward ~ CPU", wstoreds, cpu, 2e-2)
check("the wgmma-store-ds run ran it", "attention backward: wgmma-store-ds" in train.log,
      ": 'attention backward: wgmma-store-ds' in its log")
lt32, _ = train("fp32_cublaslt", steps, lt + fp32)
compare("GPU fp32, cuBLASLt ~ CPU", lt32, cpu, 1e-4)
lt16, _ = train("bf16_cublaslt", steps, lt)
compare("GPU bf16, cuBLASLt (fused bias and GELU epilogues) ~ CPU", lt16, cpu, 2e-2)


def memory_check(name):
    """On one rank the device memory estimate that admits a run (runner_cuda.cpp) is all it allocates: the
    emulated device counts what cudaMalloc holds, and the last run's log prints both after its first step.
    Returns the estimate in MiB."""
    m = re.search(r"device memory after the first step: ([\d.]+) MiB in use .*\(estimate ([\d.]+) MiB", train.log)
    used, estimate = (float(m[1]), float(m[2])) if m else (0.0, -1.0)
    check(f"{name}: the device memory estimate is what the run allocates", abs(used - estimate) <= 0.01 * used,
          f": {used} MiB in use, estimate {estimate} MiB" if m else ": no memory line in its log")
    return estimate


estimate = memory_check("bf16, cuBLASLt")

# A finite loss and gradient whose update overflows (lr 1e38: AdamW's first step size lr / (1 - beta1) is inf):
# the AdamW kernel's flag stops the run at that step, before its checkpoint, as the CPU backend's check does
# (tests/fault); under ZeRO-1 each rank's flag covers its own shard, and the ranks agree.
for name, extra, ranks in (("overflow", fp32, 1), ("overflow_zero1", fp32 + ["--comm", "nccl", "--zero", "1"], 2)):
    cmd = [f"{bin_dir}/gpt2-train", *common, "--micro-batch", str(4 // ranks), "--max-steps", "2", "--ckpt-every", "1",
           "--out", f"{work}/{name}", *cuda, *extra, "--lr", "1e38"]
    if ranks > 1:
        cmd = [mpiexec, "--oversubscribe", "-n", str(ranks), "-x", "EMU_DEVICES"] + cmd
    rc, _, err = launch(cmd, two_devices if ranks > 1 else None)
    ckpts = [f for f in os.listdir(f"{work}/{name}/ckpt")] if os.path.isdir(f"{work}/{name}/ckpt") else []
    check(f"{name}: an update that overflows on the GPU stops the run at its step, before any checkpoint",
          rc != 0 and "the update of step 1 made the weights non-finite" in err and not ckpts,
          f": exit {rc}, checkpoints {ckpts}, {next((l for l in err.splitlines() if 'error' in l), 'no error line')}")
# ... and when only one rank's shard overflows (GPT2_FAULT_NONFINITE_UPDATE=1:2: rank 1's second update check says
# so), both ranks stop at step 2 with that error, after step 1's checkpoint and before step 2's: the flag is
# all-reduced, so rank 0 neither goes on alone (and hangs in the next step's collectives) nor saves; being
# every rank's alike, the error is printed once, by rank 0 (comm/fail_together.hpp)
name = "overflow_zero1_one_rank"
cmd = [mpiexec, "--oversubscribe", "-n", "2", "-x", "EMU_DEVICES", "-x", "GPT2_FAULT_NONFINITE_UPDATE",
       f"{bin_dir}/gpt2-train", *common, "--micro-batch", "2", "--max-steps", "3", "--ckpt-every", "1", "--out",
       f"{work}/{name}", *cuda, *fp32, "--comm", "nccl", "--zero", "1"]
rc, _, err = launch(cmd, {**two_devices, "GPT2_FAULT_NONFINITE_UPDATE": "1:2"})
ckpts = sorted(f for f in os.listdir(f"{work}/{name}/ckpt") if f.endswith(".h5")) if os.path.isdir(f"{work}/{name}/ckpt") else []
stopped = err.count("the update of step 2 made the weights non-finite")
check(f"{name}: one rank's non-finite update stops both ranks at that step, after the step before's checkpoint",
      rc != 0 and stopped == 1 and ckpts == ["step_00000001.h5"],
      f": exit {rc}, the error {stopped} time(s), checkpoints {ckpts}")
# ... and without ZeRO-1 the flag is taken as every rank's alike (replicated weights, one update): should rank 1
# alone say so after all (the same fault), rank 0 never reports it, and rank 1 does after waiting 30 s for it
# (fatal_on_all_ranks), instead of waiting for a report that never comes until --comm-timeout-s
name = "overflow_one_rank_unshared"
cmd = [mpiexec, "--oversubscribe", "-n", "2", "-x", "EMU_DEVICES", "-x", "GPT2_FAULT_NONFINITE_UPDATE",
       f"{bin_dir}/gpt2-train", *common, "--micro-batch", "2", "--max-steps", "3", "--out", f"{work}/{name}", *cuda,
       *fp32, "--comm", "nccl"]
t0 = time.monotonic()
rc, _, err = launch(cmd, {**two_devices, "GPT2_FAULT_NONFINITE_UPDATE": "1:2"})
seconds = time.monotonic() - t0
line = next((l for l in err.splitlines() if "error:" in l), "no error line")
check(f"{name}: a failure only rank 1 found is reported by rank 1 after its 30 s wait for rank 0",
      rc != 0 and "rank 1 " in line and "the update of step 2 made the weights non-finite" in line and 30 <= seconds < 90,
      f": exit {rc} after {seconds:.0f} s, {line}")
# A device smaller than the estimate (most of it the GEMM workspace, 32 MiB) refuses the run before anything
# is allocated, with the numbers, on every rank, quickly
small = int(estimate) - 1
rc, _, err = launch([f"{bin_dir}/gpt2-train", *common, "--micro-batch", "4", "--max-steps", "1", "--out",
                     f"{work}/small_device", *lt], {"EMU_DEVICE_MEMORY_MIB": str(small)})
refusal = re.search(r"this run needs an estimated ([\d.]+) MiB on the GPU per rank, but cuda:0 has ([\d.]+) MiB free",
                    err)
check(f"a device of {small} MiB refuses the run with the estimate", rc != 0 and refusal is not None and
      float(refusal[1]) == estimate and float(refusal[2]) == small,
      f": exit {rc}, {next((l for l in err.splitlines() if 'error:' in l), 'no error line')}")


def lt_calls():
    """The emulated cuBLASLt's matmul calls by epilogue in the last run (its report at exit), or None."""
    m = re.search(r"cuBLASLt: matmul calls by epilogue: default (\d+), bias (\d+), gelu_aux_bias (\d+), "
                  r"dgelu (\d+), bgrada (\d+), dgelu_bgrad (\d+), bgradb (\d+)", train.log)
    return [int(x) for x in m.groups()] if m else None


# Offered every fused epilogue but the bias gradient with fp32 sums beside bf16 data (the emulator's default: the
# lent GPUs' cuBLASLt 13 has none), the wrapper takes each one and runs its bias kernel; asked for bf16 sums
# (GPT2_CUBLASLT_BIAS_GRAD=bf16) it takes the bias-gradient epilogues too (BGRADA for the weight gradients but
# MLP up's, whose bias gradient rides on MLP down's GELU gradient: DGELU_BGRAD); offered none (as a cuBLASLt without
# them would answer), its own bias, GELU and bias-gradient passes give the same training to 2e-2.
calls = lt_calls()
check("the bf16 cuBLASLt run used every fused epilogue it was offered, and the bias kernel",
      "gemm: cublaslt" in train.log and re.search(r"bias gradient: bias kernel(;|$)", train.log, re.M) and calls is not None and
      all(x > 0 for x in calls[:4]) and calls[4:] == [0, 0, 0], f": calls by epilogue {calls}")
bgrad16, _ = train("bf16_cublaslt_bgrad_bf16", steps, lt, extra_env={"GPT2_CUBLASLT_BIAS_GRAD": "bf16"})
compare("GPU bf16, cuBLASLt with the bias-gradient epilogue's bf16 sums ~ CPU", bgrad16, cpu, 2e-2)
calls = lt_calls()
bias_paths = re.search(r"bias gradient: ([^;\n]*)", train.log)
check("... and it ran those epilogues for every bias gradient of a linear layer: DGELU_BGRAD in place of DGELU, "
      "BGRADA for 3 of a layer's 4", calls is not None and calls[3] == 0 and calls[5] > 0 and calls[4] == 3 * calls[5]
      and bias_paths is not None and
      sorted(bias_paths[1].split(", ")) == ["cublaslt dgelu epilogue bf16", "cublaslt epilogue bf16"],
      f": calls by epilogue {calls}, bias gradient paths {bias_paths[1] if bias_paths else None}")
# A cuBLASLt without BGRADA (EMU_CUBLASLT_BGRADA=0): the weight gradients' bf16 sums come from BGRADB on
# row-ordered layouts instead, the same training
bgradb16, _ = train("bf16_cublaslt_bgradb_row_major", steps, lt,
                    extra_env={"GPT2_CUBLASLT_BIAS_GRAD": "bf16", "EMU_CUBLASLT_BGRADA": "0"})
compare("GPU bf16, cuBLASLt with BGRADB's bf16 sums on row-major layouts ~ CPU", bgradb16, cpu, 2e-2)
calls = lt_calls()
bias_paths = re.search(r"bias gradient: ([^;\n]*)", train.log)
check("... and it ran BGRADB where it had no BGRADA", calls is not None and calls[4] == 0 and calls[5] > 0 and
      calls[6] == 3 * calls[5] and bias_paths is not None and
      sorted(bias_paths[1].split(", ")) == ["cublaslt dgelu epilogue bf16", "cublaslt row-major epilogue bf16"],
      f": calls by epilogue {calls}, bias gradient paths {bias_paths[1] if bias_paths else None}")
# The qkv bias gradient summed by the attention backward's blocks (GPT2_ATTENTION_BIAS_SUMS=on): its chunks sit in
# the workspace after the attention's scratch (NaN-filled by the emulated cudaMalloc: a chunk left unwritten would
# show in the losses), and the qkv weight gradient runs as a plain product; with the default backward on
# cuBLASLt, and with store-ds (a larger scratch before the chunks) on the hand GEMM
for name, base, extra_env in (("bf16_cublaslt_attention_bias_sums", lt, {}),
                              ("bf16_store_ds_attention_bias_sums", cuda, {"GPT2_ATTENTION_BWD": "store-ds"})):
    sums16, _ = train(name, steps, base, extra_env=dict(extra_env, GPT2_ATTENTION_BIAS_SUMS="on"))
    compare(f"GPU {name} ~ CPU", sums16, cpu, 2e-2)
    bias_paths = re.search(r"bias gradient: ([^;\n]*)", train.log)
    check("... and the qkv bias gradient came from the attention's column sums",
          bias_paths is not None and "attention column sums" in bias_paths[1].split(", "),
          f": bias gradient paths {bias_paths[1] if bias_paths else None}")
unfused16, _ = train("bf16_cublaslt_unfused", steps, lt, extra_env={"EMU_CUBLASLT_FUSED": "0"})
compare("GPU bf16, cuBLASLt without fused epilogues (the wrapper's fallbacks) ~ CPU", unfused16, cpu, 2e-2)
calls = lt_calls()
check("... and it ran them", calls is not None and calls[0] > 0 and not any(calls[1:]), f": calls by epilogue {calls}")

resumed = f"{work}/resumed"
os.makedirs(f"{resumed}/ckpt")
shutil.copy(f"{out16}/ckpt/step_00000002.h5", f"{resumed}/ckpt/")
open(f"{resumed}/ckpt/latest", "w").write("step_00000002.h5\n")
res, _ = train("resumed", 4, cuda + ["--resume", "auto"])
check("bf16 resume continues bit for bit", sorted(res) == [3, 4] and all(res[s] == bf16[s] for s in res),
      f": {res} against {bf16}")
memory_check("bf16, hand GEMM")
recomputed, _ = train("fp32_recompute", steps, cuda + fp32 + ["--recompute", "full"])
check("fp32 --recompute full repeats bit for bit", recomputed == gpu32, f": {recomputed} against {gpu32}")

accumulated = stream_checks(gpu32)
# --profile-step: the profiled step's losses are the unprofiled run's (timing changes nothing), with
# accumulation and --cuda-graph (the profiled step runs eagerly), and on 2 ranks (the buckets' hand-off)
profiled, out = train("fp32_profiled", steps, cuda + fp32 + ["--cuda-graph", "--profile-step", "2"], micro_batch=2)
check("fp32, --profile-step with accumulation and --cuda-graph repeats the run bit for bit", profiled == accumulated,
      f": {profiled} against {accumulated}")
profile_check("fp32, 2 micro-steps", out, 2, 2)
open(f"{work}/profiled_a.log", "w").write(train.log)
profiled2, out = train("fp32_2ranks_profiled", steps, cuda + fp32 + ["--comm", "nccl", "--profile-step", "2"],
                       ranks=2, micro_batch=2, extra_env=two_devices)
compare("fp32 2 ranks, --comm nccl --profile-step 2 == 1 rank", profiled2, gpu32, 1e-4)
profile_check("fp32, 2 ranks", out, 2, 1, ranks=2)
open(f"{work}/profiled_b.log", "w").write(train.log)
# tools/gpu/profile_diff.py reads both tables (the one-rank run's ops twice as often): every op of the one-rank
# run on a row with both times, and the totals; a log without a table is an error that names it
diff_tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tools/gpu/profile_diff.py")
rc, dout, derr = launch([sys.executable, diff_tool, f"{work}/profiled_a.log", f"{work}/profiled_b.log"])
rows_ok = rc == 0 and re.search(r"^attention backward +[\d.]+ +[\d.]+ +[-+][\d.]+ +[\d.]+x  \(calls 4 -> 2\)$", dout,
                                re.M) and re.search(r"^device time +[\d.]+ +[\d.]+ ", dout, re.M)
check("profile_diff.py: both profiles op by op, with the calls that differ", bool(rows_ok), f": exit {rc}\n{dout}{derr}")
rc, dout, derr = launch([sys.executable, diff_tool, f"{work}/profiled_a.log", f"{work}/corpus.txt"])
check("profile_diff.py: a log without a table is an error naming it",
      rc == 1 and "corpus.txt holds no --profile-step table" in derr, f": exit {rc} {derr}")
graph_check("bf16_graph", [], 4, {s: bf16[s] for s in range(1, steps + 1)}, steps - 1)
graph_check("bf16_cublaslt_graph", ["--gemm", "cublaslt"], 4, lt16, steps - 1)  # its plans made in the warm-up
# 2 ranks, 2 micro-steps each: the first of a step replays the graph, the last (its backward starts the bucket
# collectives) runs eagerly, so graph launches and NCCL's stream interleave
graphed2, _ = train("fp32_2ranks_nccl_graph", steps, cuda + fp32 + ["--comm", "nccl", "--cuda-graph"], ranks=2,
                    micro_batch=1, extra_env=two_devices)
compare("fp32 2 ranks, --comm nccl --cuda-graph == 1 rank", graphed2, gpu32, 1e-4)
two16, _ = train("bf16_2ranks_nccl", steps, cuda + ["--comm", "nccl"], ranks=2, micro_batch=2, extra_env=two_devices)
compare("bf16 2 ranks, --comm nccl ~ 1 rank", two16, {s: bf16[s] for s in range(1, steps + 1)}, 2e-2)

# Sampled at temperature 1 from every token (three steps of training make greedy decoding print spaces): the
# same seed draws the same text when the two devices' logits agree.
sample = ["--ckpt", out32, "--prompt", "the lord", "--max-new-tokens", "40", "--top-k", "0", "--seed", "7"]
on_gpu = run([f"{bin_dir}/gpt2-sample", *sample, "--device", "cuda", "--precision", "fp32", "--gemm", "hand"],
             "gpt2-sample --device cuda")[0]
on_cpu = run([f"{bin_dir}/gpt2-sample", *sample, "--device", "cpu"], "gpt2-sample --device cpu")[0]
check("gpt2-sample --device cuda == --device cpu (seed 7)", on_gpu == on_cpu and len(on_gpu) > len("the lord"),
      f": {on_gpu!r} against {on_cpu!r}")

for ranks in (1, 2):
    cmd = [f"{bin_dir}/test_device_reducer"]
    if ranks > 1:
        cmd = [mpiexec, "--oversubscribe", "-n", "2", "-x", "EMU_DEVICES", "-x", "EMU_COLLECTIVE_DELAY_US"] + cmd
    # 98 buckets a case one after the other: not at the 0.5 s each of the training runs (nccl_emu.cpp)
    rc, out, _ = launch(cmd, dict(EMU_COLLECTIVE_DELAY_US="1000", **two_devices))
    cases = out.count("\nok  ") + out.startswith("ok  ")
    check(f"device reducer, {ranks} rank(s), NCCL and MPI transports", rc == 0 and cases == 13,
          f": exit {rc}, {cases} of 13 cases ok" + ("" if rc == 0 else "\n" + out[-2000:]))

# bench_allreduce's CUDA path, which the scaling sweep measures on GPUs: 2 ranks with a device each choose it on
# their own (GPT2_BENCH_DEVICE unset: auto), the DeviceGradReducer over NCCL in bf16 (the default) and fp32,
# several buckets at the largest size, and every size's result checked inside the benchmark (an error row).
if os.path.exists(f"{bin_dir}/bench_allreduce"):
    for dtype in ("bf16", "fp32"):
        js = f"{work}/allreduce_{dtype}.json"
        benv = dict(two_devices, GPT2_BENCH_MAX_MB="0.25", GPT2_BENCH_BUCKET_MB="0.0625", GPT2_BENCH_DTYPE=dtype,
                    EMU_COLLECTIVE_DELAY_US="200")
        cmd = [mpiexec, "--oversubscribe", "-n", "2"] + [a for k in benv for a in ("-x", k)] + \
              [f"{bin_dir}/bench_allreduce", "--benchmark_filter=BucketedAllreduce", f"--benchmark_out={js}",
               "--benchmark_out_format=json"]
        rc, out, err = launch(cmd, benv)
        rows = json.load(open(js))["benchmarks"] if rc == 0 and os.path.exists(js) else []
        labels = sorted({r.get("label", "") for r in rows})
        errors = [r.get("error_message") for r in rows if r.get("error_occurred")]
        check(f"bench_allreduce's device path, 2 ranks, {dtype}: 5 sizes checked, several buckets at 256 KiB",
              rc == 0 and len(rows) == 5 and labels == [f"nccl {dtype} device"] and not errors and
              max(r.get("buckets", 0) for r in rows) == 4,
              f": exit {rc}, {len(rows)} sizes, labels {labels}, errors {errors[:1]}" + ("" if rc == 0 else "\n" + (out + err)[-2000:]))
else:
    print("SKIP bench_allreduce's device path: built without Google Benchmark", flush=True)



def nccl_fault(name, tag, timeout_s, extra_env, want, flight_file="flight_rank0.nccl.json"):
    """2 ranks on NCCL with a fault: the job must end within --comm-timeout-s of the fault, non-zero, with a
    message matching `want` and rank 0's flight record. What a one-GPU lent machine cannot run (its NCCL needs
    a device per rank) and what a real NCCL would do the same: the host never blocks inside it."""
    out = f"{work}/{tag}"
    fault_env = dict(two_devices, **extra_env)
    cmd = [mpiexec, "--oversubscribe", "-n", "2"] + [a for k in fault_env for a in ("-x", k)] + \
          [f"{bin_dir}/gpt2-train", *common, *cuda, "--comm", "nccl", "--micro-batch", "2", "--max-steps", "20",
           "--comm-timeout-s", str(timeout_s), "--out", out]
    t0 = time.monotonic()
    rc, so, se = launch(cmd, fault_env, timeout=240)
    seconds = time.monotonic() - t0
    text = so + se
    for m in re.finditer(r"rank \d+ pid (\d+) stops itself", text):  # a stopped rank left behind: by its PID
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(int(m.group(1)), sig)
            except ProcessLookupError:
                pass
    found = re.search(want.replace("TIMEOUT", str(timeout_s)), text) is not None
    flight = os.path.exists(f"{out}/{flight_file}")
    # the steps before the fault (a few seconds each, emulated), the timeout, mpirun's teardown
    check(name, rc != 0 and found and flight and seconds < timeout_s + 60,
          f": exit {rc} after {seconds:.0f} s, flight record {flight}" + ("" if found else "\n" + text[-2000:]))


if not streams_only:
    # Rank 1 stops itself (SIGSTOP) before its gradient bucket of step 3: tests/gpu/test_gpu_train.py's hung
    # peer on NCCL, which needs 2 GPUs there. A longer timeout: a bucket's wait starts when backward is
    # enqueued, and the emulated device then takes seconds to run it.
    nccl_fault("NCCL: a hung peer ends the job within --comm-timeout-s, naming it", "hung_bucket", 20,
               {"GPT2_FAULT_STALL": "1:grad bucket:3"},
               r"step 3: collective #\d+ allreduce 'grad bucket [^']+' \(\d+ bytes, nccl\) did not complete within "
               r"--comm-timeout-s TIMEOUT s on rank 0; rank\(s\) 1 did not arrive")
    # ... before the ranks meet to set NCCL up: the trainer's MPI communicator names it
    nccl_fault("NCCL: a peer that never reaches NCCL's set-up ends the job, naming it", "hung_setup", 5,
               {"GPT2_FAULT_STALL": "1:nccl setup:0"},
               r"step 0: collective #\d+ barrier 'nccl setup' \(0 bytes, mpi\) did not complete within --comm-timeout-s "
               r"TIMEOUT s on rank 0; rank\(s\) 1 did not arrive", flight_file="flight_rank0.json")
    # ... before it joins NCCL's initialisation: the nonblocking communicator's initialisation is timed
    nccl_fault("NCCL: a peer that never joins the initialisation ends the job, naming it", "hung_init", 5,
               {"GPT2_FAULT_STALL": "1:nccl init:0"},
               r"step 0: collective #0 init 'nccl init' \(0 bytes, nccl\) did not complete within --comm-timeout-s "
               r"TIMEOUT s on rank 0; rank\(s\) 1 did not arrive \(rank 1 sent no word from any collective\)")
    # NCCL reports an asynchronous error on rank 1 (as on the ranks still alive when a peer dies or the network
    # fails): that rank aborts its communicator and ends the job with NCCL's reason, and its flight record
    nccl_fault("NCCL: an asynchronous error ends the job with NCCL's reason", "async_error", 20,
               {"EMU_NCCL_ASYNC_ERROR": "1:12"},
               r"NCCL failed asynchronously on rank 1: remote process exited or there was a network error "
               r"\(emulated NCCL\) \(NCCL's last error message: emulated: call 12 on rank 1 failed asynchronously",
               flight_file="flight_rank1.nccl.json")
    # every rank joins and NCCL never connects them (as with a wrong NCCL_SOCKET_IFNAME)
    nccl_fault("NCCL: an initialisation that never completes ends the job, with what to check", "stuck_init", 5,
               {"EMU_NCCL_INIT_STUCK": "1"},
               r"collective #0 init 'nccl init' \(0 bytes, nccl\) did not complete within --comm-timeout-s TIMEOUT s "
               r"on rank \d; every peer has arrived, so the transport itself is stuck \(NCCL: NCCL_SOCKET_IFNAME must")

    # MPMD: rank 0's node has 1 GPU and rank 1's 2 (EMU_DEVICES), 2 ranks a node: rank 0 falls back to --comm
    # mpi, rank 1 takes NCCL. Both must end, saying so, before the first collective of the run.
    args = [f"{bin_dir}/gpt2-train", *common, *cuda, "--micro-batch", "2", "--max-steps", "2",
            "--comm-timeout-s", "20", "--out", f"{work}/mixed"]
    t0 = time.monotonic()
    rc, so, se = launch([mpiexec, "--oversubscribe", "-n", "1", "env", "EMU_DEVICES=1", *args,
                         ":", "-n", "1", "env", "EMU_DEVICES=2", *args], timeout=240)
    seconds = time.monotonic() - t0
    found = re.findall(r"the ranks chose different backends; this one: --device cuda --precision bf16 --comm (\w+)",
                       so + se)
    check("nodes that resolve different backends (1 and 2 GPUs for 2 ranks) end the job, one line per choice",
          rc != 0 and sorted(found) == ["mpi", "nccl"] and seconds < 60, f": exit {rc} after {seconds:.0f} s, rank messages {found}" +
          ("" if found else "\n" + (so + se)[-2000:]))

# The emulator's CUDA graphs refuse what CUDA's stream capture refuses (tests/emu/src/graph_capture_test.cpp),
# with streams run in the call and asynchronously
for asynchronous in ("0", "1"):
    rc, out, _ = launch([f"{bin_dir}/test_graph_capture"], {"EMU_ASYNC_STREAMS": asynchronous})
    check(f"CUDA graph capture rules (EMU_ASYNC_STREAMS={asynchronous})", rc == 0 and "\nFAIL" not in out,
          f": exit {rc}" + ("" if rc == 0 else "\n" + out[-2000:]))

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
