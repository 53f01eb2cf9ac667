"""Shared pieces of the fault suite (tests/fault/test_*.py): run a command with a deadline, assert
its exit status, time to exit and message, and check that every checkpoint a run left still loads.

Each case is a function that raises Failure with a message; run_cases() runs them all, prints one
line per case and exits non-zero if any failed. Standard library + h5py/numpy (/usr/bin/python3).
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


class Failure(Exception):
    pass


class Result:
    def __init__(self, cmd, rc, seconds, out):
        self.cmd, self.rc, self.seconds, self.out = cmd, rc, seconds, out

    def __repr__(self):
        return f"rc={self.rc} after {self.seconds:.1f} s: {' '.join(self.cmd)}\n--- output tail ---\n{self.out[-3000:]}"


def run(cmd, timeout=120, env=None, cwd=None):
    """Runs cmd in its own process group; on timeout kills the whole group and returns rc=None."""
    full_env = dict(os.environ, **MPI_ENV)
    full_env.update(env or {})
    t0 = time.monotonic()
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=full_env, cwd=cwd, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc = None
    return Result([str(c) for c in cmd], rc, time.monotonic() - t0, out)


def start(cmd, env=None):
    """Starts cmd in its own process group (for signal cases); returns the Popen."""
    full_env = dict(os.environ, **MPI_ENV)
    full_env.update(env or {})
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True)


def expect(res, rc=None, nonzero=False, max_s=None, message=None):
    """Asserts the exit status (exactly rc, or any non-zero), the time to exit and a message regex."""
    if res.rc is None:
        raise Failure(f"did not exit within its deadline (hang): {res!r}")
    if rc is not None and res.rc != rc:
        raise Failure(f"expected exit status {rc}: {res!r}")
    if nonzero and res.rc == 0:
        raise Failure(f"expected a non-zero exit status: {res!r}")
    if max_s is not None and res.seconds > max_s:
        raise Failure(f"took {res.seconds:.1f} s, more than {max_s} s: {res!r}")
    if message is not None and not re.search(message, res.out):
        raise Failure(f"message /{message}/ not in the output: {res!r}")


def checkpoints(out_dir):
    return sorted(glob.glob(os.path.join(out_dir, "ckpt", "step_*.h5")))


def check_checkpoints_load(bin_dir, out_dir):
    """Every step_*.h5 in out_dir/ckpt loads with our own loader (export-hf reads the whole model) and
    holds only finite numbers (h5py); `latest`, when present, names one of them. No *.tmp is left."""
    import h5py
    import numpy as np
    ckpts = checkpoints(out_dir)
    for path in ckpts:
        with tempfile.TemporaryDirectory() as tmp:
            r = run([f"{bin_dir}/gpt2-data", "export-hf", path, tmp], timeout=120)
            if r.rc != 0:
                raise Failure(f"checkpoint {path} does not load: {r!r}")
        with h5py.File(path, "r") as f:
            for group in ("model", "optimizer"):
                if group not in f:
                    continue
                bad = []
                f[group].visititems(lambda name, obj: bad.append(name) if isinstance(obj, h5py.Dataset)
                                    and not np.all(np.isfinite(obj[()])) else None)
                if bad:
                    raise Failure(f"checkpoint {path} holds non-finite values in /{group}/{bad[0]}")
    latest = os.path.join(out_dir, "ckpt", "latest")
    if os.path.exists(latest):
        name = open(latest).read().strip()
        if not name or not os.path.exists(os.path.join(out_dir, "ckpt", os.path.basename(name))):
            raise Failure(f"{latest} holds {name!r}, which is not a checkpoint")
    tmps = glob.glob(os.path.join(out_dir, "ckpt", "*.tmp"))
    if tmps:
        raise Failure(f"temporary files left behind: {tmps}")
    return ckpts


def run_cases(cases, work):
    """Runs each case(work_subdir) and prints 'ok'/'FAIL' per case; exits 1 if any failed.
    FAULT_CASES=name,name runs only those (while working on one)."""
    only = os.environ.get("FAULT_CASES")
    if only:
        cases = [c for c in cases if c.__name__ in only.split(",")]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failed = []
    for case in cases:
        sub = os.path.join(work, case.__name__)
        os.makedirs(sub)
        t0 = time.monotonic()
        try:
            case(sub)
            print(f"ok    {case.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Failure as e:
            failed.append(case.__name__)
            print(f"FAIL  {case.__name__} ({time.monotonic() - t0:.1f} s): {e}", flush=True)
    print(f"{len(cases) - len(failed)}/{len(cases)} fault cases passed")
    sys.exit(1 if failed else 0)
