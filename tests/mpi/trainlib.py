"""What the multi-rank training tests share: a seeded pseudo-English corpus, a tiny model, and
running gpt2-train under mpiexec with its losses read back from metrics.jsonl."""
import json
import os
import shutil
import subprocess

import h5py
import numpy as np


class Trainer:
    def __init__(self, bin_dir, work, mpiexec):
        self.bin_dir, self.work, self.mpiexec = bin_dir, work, mpiexec
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        self.env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
        # A pseudo-English corpus (seeded), written with h5py: the format is what DESIGN.md says.
        rng = np.random.default_rng(1)
        words = "the of and to in that he shall unto for his a lord they be is him not them it with all thou".split()
        text = " ".join(rng.choice(words, size=60000)).encode()
        with h5py.File(f"{work}/train.h5", "w") as f:
            f.create_dataset("tokens", data=np.frombuffer(text, dtype=np.uint8).astype(np.uint16), chunks=(4096,))
            f.attrs["vocab_size"] = 256
            f.attrs["tokenizer"] = "byte"
            f.attrs["format_version"] = 1
        self.common = ["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--vocab-size", "256",
                       "--max-seq-len", "32", "--seq-len", "32", "--global-batch-tokens", "256", "--lr", "3e-3",
                       "--warmup-steps", "3", "--train-data", f"{work}/train.h5", "--log-every", "100",
                       "--threads", "1"]
        self.failures = []

    def train(self, name, ranks, micro_batch, steps, extra=()):
        """Runs gpt2-train; returns ({step: loss}, out_dir)."""
        out = f"{self.work}/{name}"
        cmd = [self.mpiexec, "--oversubscribe", "-n", str(ranks), f"{self.bin_dir}/gpt2-train", *self.common,
               "--micro-batch", str(micro_batch), "--max-steps", str(steps), "--out", out, *extra]
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-2000:])
            raise SystemExit(f"FAIL: {name} exited {r.returncode}: {' '.join(cmd)}")
        rows = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}, out

    def check(self, name, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
        if not ok:
            self.failures.append(name)

    def compare(self, name, a, b, rtol, steps):
        """Loss trajectories a and b agree to rtol (relative) at every step in steps."""
        worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)
        self.check(name, worst <= rtol, f"worst relative loss difference {worst:.2e} (bound {rtol:g})")

    def finish(self):
        print(f"{len(self.failures)} failure(s)")
        raise SystemExit(1 if self.failures else 0)


def checkpoint(path):
    """{'model': {name: array}, 'm': {...}, 'v': {...}} of a checkpoint (m, v empty without optimizer)."""
    with h5py.File(path, "r") as f:
        out = {"model": {k: f["model"][k][...] for k in f["model"]}, "m": {}, "v": {}}
        if "optimizer" in f:
            out["m"] = {k: f["optimizer/m"][k][...] for k in f["optimizer/m"]}
            out["v"] = {k: f["optimizer/v"][k][...] for k in f["optimizer/v"]}
    return out


def params(path):
    return checkpoint(path)["model"]
