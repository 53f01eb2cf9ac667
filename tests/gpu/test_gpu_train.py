#!/usr/bin/env python3
"""gpt2-train on the GPU, end to end (exit 77 = skipped: no GPU):
  1. bf16 training makes the loss fall;
  2. the same GPU run twice gives identical losses (bit for bit);
  3. resume from a checkpoint continues bit for bit (steps after the checkpoint identical);
  4. --precision fp32 on the GPU follows the CPU backend's loss trajectory (1e-4 relative);
  5. --gemm hand follows the CPU in fp32 (1e-4); in bf16 both GEMMs follow the fp32 losses (2e-2), and
     GPT2_CUBLASLT_LOG_PLANS (which prints cuBLASLt's plans) changes no loss;
  6. 2 ranks sharing the GPU (--comm mpi) follow 1 rank with twice the micro-batch;
  7. a rank killed mid-run (GPT2_FAULT_INJECT) ends the whole job with an error, never a hang:
     with --comm mpi always, with --comm nccl when there are two GPUs (then the NCCL timeout path).
Only the standard library: the GPU machine's Python may lack h5py. The token file is made by gpt2-data.
usage: test_gpu_train.py BIN_DIR WORK_DIR MPIEXEC"""
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

bin_dir, work, mpiexec = sys.argv[1], sys.argv[2], sys.argv[3]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="2")
probe = subprocess.run([f"{bin_dir}/gpt2-train", "--device", "cuda", "--model", "d1", "--vocab-size", "256",
                        "--benchmark", "--max-steps", "1", "--seq-len", "16", "--micro-batch", "1"],
                       capture_output=True, text=True, env=env)
if probe.returncode != 0 and ("no GPU" in probe.stderr or "without the CUDA backend" in probe.stderr):
    print("skipped: no GPU (" + probe.stderr.strip().splitlines()[-1] + ")")
    sys.exit(77)

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
rnd = random.Random(1)
words = "the of and to in that he shall unto for his a lord they be is him not them it with all thou".split()
open(f"{work}/corpus.txt", "w").write(" ".join(rnd.choice(words) for _ in range(60000)))
subprocess.run([f"{bin_dir}/gpt2-data", "prepare", "--tokenizer", "byte", "--text", f"{work}/corpus.txt",
                "--out", f"{work}/data"], check=True, capture_output=True)

common = ["--n-layer", "2", "--n-head", "2", "--n-embd", "128", "--vocab-size", "256", "--max-seq-len", "64",
          "--seq-len", "64", "--global-batch-tokens", "1024", "--lr", "3e-3", "--warmup-steps", "3",
          "--train-data", f"{work}/data/train.h5", "--log-every", "100"]
failures = []


def train(name, steps, extra=(), ranks=1, micro_batch=16, env_extra=None):
    out = f"{work}/{name}"
    cmd = [f"{bin_dir}/gpt2-train", *common, "--micro-batch", str(micro_batch), "--max-steps", str(steps),
           "--out", out, *extra]
    if ranks > 1:
        cmd = [mpiexec, "--oversubscribe", "-n", str(ranks)] + cmd
    r = subprocess.run(cmd, env=dict(env, **(env_extra or {})), capture_output=True, text=True, timeout=600)
    os.makedirs(out, exist_ok=True)
    open(f"{out}/stderr.log", "w").write(r.stderr)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise SystemExit(f"FAIL: {name} exited {r.returncode}: {' '.join(cmd)}")
    rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}, out


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        failures.append(name)


def compare(name, a, b, rtol):
    worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in b)
    check(name, worst <= rtol, f": worst relative loss difference {worst:.2e} (bound {rtol:g})")


cuda = ["--device", "cuda"]
bf16, out = train("bf16", 30, cuda + ["--ckpt-every", "15"])
check("bf16 loss falls", bf16[30] < 0.8 * bf16[1], f": {bf16[1]:.3f} -> {bf16[30]:.3f}")
again, _ = train("bf16_again", 30, cuda)
check("bf16 run repeats bit for bit", again == bf16)

resumed_dir = f"{work}/resumed"
os.makedirs(f"{resumed_dir}/ckpt")
shutil.copy(f"{out}/ckpt/step_00000015.h5", f"{resumed_dir}/ckpt/")
open(f"{resumed_dir}/ckpt/latest", "w").write("step_00000015.h5\n")
res, _ = train("resumed", 30, cuda + ["--resume", "auto"])
check("bf16 resume continues bit for bit", all(res[s] == bf16[s] for s in range(16, 31)) and min(res) == 16)

cpu, _ = train("cpu", 10, ["--device", "cpu", "--threads", "2"])
gpu32, _ = train("fp32", 10, cuda + ["--precision", "fp32"])
compare("GPU fp32 == CPU", gpu32, cpu, 1e-4)
hand32, _ = train("fp32_hand", 10, cuda + ["--precision", "fp32", "--gemm", "hand"])
compare("GPU fp32 hand GEMM == CPU", hand32, cpu, 1e-4)
hand16, _ = train("bf16_hand", 10, cuda + ["--gemm", "hand"])
# bf16 follows the fp32 trajectory, with either GEMM: 2e-2 over 10 steps, each run as long as the fp32 one
# (the learning rate's decay spans --max-steps: the 30-step run above follows another schedule, and its
# first 10 losses left these by 9.6e-2 on the H100 and the H200, 2026-11-27, which was read as drift).
lt16, _ = train("bf16_10", 10, cuda)
print("step  cpu fp32   cuBLASLt bf16  hand bf16")
for s in range(1, 11):
    print(f"{s:4d}  {cpu[s]:.5f}    {lt16[s]:.5f}        {hand16[s]:.5f}")
compare("GPU bf16 (cuBLASLt) follows fp32", lt16, cpu, 2e-2)
compare("GPU bf16 hand GEMM follows fp32", hand16, cpu, 2e-2)
# How each cuBLASLt setting moves the bf16 run (printed, not checked), and the default run's plans
# (GPT2_CUBLASLT_LOG_PLANS: its losses are the default's). H200, 2026-11-27: 4.6e-3 from the fp32 losses
# by default, with either split-K setting, and 4.1e-3 with the epilogues unfused; the hand GEMM (then
# mma.sync, on 9.0 its wgmma kernel since 2026-12-02) 1.4e-3.
for var, value in (("GPT2_CUBLASLT_REDUCTION", "none"), ("GPT2_CUBLASLT_EPILOGUES", "unfused"),
                   ("GPT2_CUBLASLT_LOG_PLANS", "1")):
    diag, diag_out = train(f"bf16_{var}_{value}", 10, cuda, env_extra={var: value})
    off = max(abs(diag[s] - cpu[s]) / abs(cpu[s]) for s in range(1, 11))
    print(f"diagnosis: bf16 cuBLASLt with {var}={value}: {off:.2e} from the fp32 losses")
    if var == "GPT2_CUBLASLT_LOG_PLANS":
        check("GPT2_CUBLASLT_LOG_PLANS changes no loss", diag == lt16)
        for line in open(f"{diag_out}/stderr.log"):
            if line.startswith("cuBLASLt plan:"):
                print("  " + line.rstrip())

two, _ = train("fp32_2ranks", 10, cuda + ["--precision", "fp32", "--comm", "mpi"], ranks=2, micro_batch=8)
compare("2 ranks sharing the GPU (--comm mpi) == 1 rank", two, gpu32, 1e-4)



def lost_peer(name, comm):
    cmd = [mpiexec, "--oversubscribe", "-n", "2", f"{bin_dir}/gpt2-train", *common, "--device", "cuda",
           "--comm", comm, "--comm-timeout-s", "30", "--micro-batch", "8", "--max-steps", "50"]
    start = time.time()
    try:
        r = subprocess.run(cmd, env=dict(env, GPT2_FAULT_INJECT="1:5"), capture_output=True, text=True, timeout=240)
        check(name, r.returncode != 0, f": exit {r.returncode} after {time.time() - start:.0f} s")
    except subprocess.TimeoutExpired:
        check(name, False, ": the job hung (no exit within 240 s)")


def hung_peer(name, comm):
    """Rank 1 stops itself (SIGSTOP) before its first gradient bucket of step 3: rank 0 must end the job
    within the timeout, naming the bucket and rank 1, and write its flight record."""
    out = os.path.join(work, "hung_" + comm)
    cmd = [mpiexec, "--oversubscribe", "-n", "2", f"{bin_dir}/gpt2-train", *common, "--device", "cuda",
           "--comm", comm, "--comm-timeout-s", "10", "--micro-batch", "8", "--max-steps", "50", "--out", out]
    start = time.time()
    try:
        r = subprocess.run(cmd, env=dict(env, GPT2_FAULT_STALL="1:grad bucket:3"), capture_output=True, text=True,
                           timeout=120)
        text = r.stdout + r.stderr
        want = (rf"step 3: collective #\d+ allreduce 'grad bucket [^']+' \(\d+ bytes, {comm}\) did not complete "
                r"within --comm-timeout-s 10 s on rank 0; rank\(s\) 1 did not arrive")
        check(name, r.returncode != 0 and re.search(want, text) and glob.glob(os.path.join(out, "flight_rank0*.json")),
              f": exit {r.returncode} after {time.time() - start:.0f} s\n{text[-2000:]}")
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        check(name, False, ": the job hung (no exit within 120 s)")
    for m in re.finditer(r"rank 1 pid (\d+) stops itself", text):  # let the stopped rank go, by its PID
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(int(m.group(1)), sig)
            except ProcessLookupError:
                pass


lost_peer("lost peer ends the job (--comm mpi)", "mpi")
hung_peer("hung peer ends the job within --comm-timeout-s (--comm mpi)", "mpi")
try:
    gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU ")
except OSError:
    gpus = 1
if gpus >= 2:
    lost_peer("lost peer ends the job (--comm nccl)", "nccl")
    hung_peer("hung peer ends the job within --comm-timeout-s (--comm nccl)", "nccl")
else:
    print(f"note: {gpus} GPU(s): the NCCL lost-peer case needs 2")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
