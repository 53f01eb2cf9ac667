#!/usr/bin/env python3
"""Oracle only the GPU machine has: Hugging Face transformers loads what `gpt2-data export-hf` wrote,
and its logits equal ours to 1e-4.

  oracle_transformers.py BUNDLE_BIN WORK_DIR

Trains a small model for a few steps on the bundle's token file (so the weights are not the
initialisation's), exports it, loads it with GPT2LMHeadModel.from_pretrained in fp64, and compares
its logits with our CPU forward (hf_logits) on random token ids. Exit 77 when transformers is absent.
"""
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import torch
    from transformers import GPT2LMHeadModel
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

bin_dir, work = sys.argv[1], sys.argv[2]
data = os.path.join(os.path.dirname(bin_dir), "data")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="4")


def run(*cmd):
    r = subprocess.run(list(cmd), capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {r.returncode}")
    return r.stdout


n_head = 4
run(f"{bin_dir}/gpt2-train", "--n-layer", "2", "--n-head", str(n_head), "--n-embd", "64", "--vocab-size", "256",
    "--max-seq-len", "64", "--seq-len", "64", "--micro-batch", "4", "--global-batch-tokens", "256",
    "--max-steps", "5", "--ckpt-every", "5", "--device", "cpu", "--train-data", f"{data}/train.h5",
    "--out", f"{work}/run")
ckpt = sorted(f for f in os.listdir(f"{work}/run/ckpt") if f.endswith(".h5"))[-1]
run(f"{bin_dir}/gpt2-data", "export-hf", f"{work}/run/ckpt/{ckpt}", f"{work}/hf")

B, T, V = 2, 48, 256
rng = np.random.default_rng(7)
tokens = rng.integers(0, V, size=(B, T), dtype=np.int32)
tokens.tofile(f"{work}/tokens.i32")
run(f"{bin_dir}/hf_logits", "logits", f"{work}/run/ckpt/{ckpt}", f"{work}/tokens.i32", str(B), str(T),
    f"{work}/ours.f32", str(n_head))
ours = np.fromfile(f"{work}/ours.f32", dtype=np.float32).reshape(B, T, V).astype(np.float64)

# Loaded as stored, then widened to fp64, which is exact: from_pretrained's dtype argument was renamed
# (torch_dtype, then dtype) across the transformers versions a device may hold, and one it ignored would
# have compared in fp32 without a word.
model = GPT2LMHeadModel.from_pretrained(f"{work}/hf").to(torch.float64).eval()
assert next(model.parameters()).dtype == torch.float64
with torch.no_grad():
    theirs = model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()[:, :, :V]
diff = float(np.max(np.abs(ours - theirs)))
print(f"max |ours - transformers| = {diff:.2e} over {ours.size} logits (bound 1e-4; logits span "
      f"{theirs.min():.2f}..{theirs.max():.2f})")
sys.exit(0 if diff <= 1e-4 else 1)
