#!/usr/bin/env python3
"""Two profiled steps side by side, op by op: where an opt-in kernel (or any change) gained or lost time in the
whole step, not only in its own kernel benchmark.

Reads the table that gpt2-train --profile-step prints (every 124M run of tools/gpu-phase.sh profiles its step 11:
logs/<step>.log in a phase's logs archive) from two logs, and prints for each op its ms in both, the difference and
the ratio, largest difference first, then the device time, the idle time and the step's wall time of each.

  profile_diff.py BASE_LOG OTHER_LOG [--top N]
  e.g. profile_diff.py logs/train_124m_cublaslt_mb16.log logs/opt_attention_bwd_wgmma.log

Exits 1, naming the log, when a log holds no profile table (or one that does not parse)."""
import argparse
import re
import sys

ROW = re.compile(r"^  (.+?)\s+(\d+)\s+(\d+\.\d+)\s+(\d+\.\d)%(?:\s+\d+\.\d)*\s*$")
IDLE = re.compile(r"^  \(device idle: waiting for the host\)\s+(\d+\.\d+)\s+\d+\.\d%\s*$")
TOTAL = re.compile(r"^  device time (\d+\.\d+) ms \(ops (\d+\.\d+), idle (\d+\.\d+)\); the step took (\d+\.\d+) ms")


def read_profile(path):
    """{op: (calls, ms)} and (device, ops, idle, step ms) of the first profile table in the log at path."""
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError as e:
        sys.exit(f"profile_diff: cannot read {path}: {e}")
    start = next((i for i, l in enumerate(lines) if l.startswith("profile of step ")), None)
    if start is None or start + 1 >= len(lines) or not lines[start + 1].lstrip().startswith("op "):
        sys.exit(f"profile_diff: {path} holds no --profile-step table")
    ops, totals = {}, None
    for line in lines[start + 2:]:
        if IDLE.match(line):
            continue
        m = TOTAL.match(line)
        if m:
            totals = tuple(float(x) for x in m.groups())
            break
        m = ROW.match(line)
        if not m:
            sys.exit(f"profile_diff: {path}: a row of its profile table does not parse: {line!r}")
        ops[m[1]] = (int(m[2]), float(m[3]))
    if totals is None or not ops:
        sys.exit(f"profile_diff: {path}: its profile table has no rows or no 'device time' line")
    return ops, totals


def main(argv):
    ap = argparse.ArgumentParser(description="Two --profile-step tables side by side, op by op.")
    ap.add_argument("base_log")
    ap.add_argument("other_log")
    ap.add_argument("--top", type=int, default=None, help="only the N ops whose time changed most")
    opts = ap.parse_args(argv)
    args = [opts.base_log, opts.other_log]
    top = opts.top
    (a_ops, a_tot), (b_ops, b_tot) = read_profile(args[0]), read_profile(args[1])
    names = list(dict.fromkeys(list(a_ops) + list(b_ops)))
    diff = lambda n: b_ops.get(n, (0, 0.0))[1] - a_ops.get(n, (0, 0.0))[1]
    names.sort(key=lambda n: -abs(diff(n)))
    if top is not None:
        names = names[:top]
    w = max([len(n) for n in names] + [len("(device idle: waiting for the host)")])
    print(f"base:  {args[0]}\nother: {args[1]}")
    print(f"{'op':<{w}} {'base ms':>9} {'other ms':>9} {'diff':>9} {'ratio':>7}")

    def cell(ops, n):
        return f"{ops[n][1]:9.3f}" if n in ops else f"{'-':>9}"

    for n in names:
        a, b = a_ops.get(n), b_ops.get(n)
        ratio = f"{b[1] / a[1]:6.2f}x" if a and b and a[1] > 0 else f"{'':>7}"
        calls = "" if not (a and b) or a[0] == b[0] else f"  (calls {a[0]} -> {b[0]})"
        print(f"{n:<{w}} {cell(a_ops, n)} {cell(b_ops, n)} {diff(n):+9.3f} {ratio}{calls}")
    for label, k in (("(device idle: waiting for the host)", 2), ("device time", 0), ("step (host wall time)", 3)):
        ratio = f"{b_tot[k] / a_tot[k]:6.2f}x" if a_tot[k] > 0 else ""
        print(f"{label:<{w}} {a_tot[k]:9.3f} {b_tot[k]:9.3f} {b_tot[k] - a_tot[k]:+9.3f} {ratio}")


if __name__ == "__main__":
    main(sys.argv[1:])
