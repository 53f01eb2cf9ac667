#!/usr/bin/env python3
"""The next lent GPU's command (docs/performance.md, the line after `<!-- next-gpu-command`) holds up.

A lent GPU comes rarely, with 15 device minutes, and its session runs this command as written. Each phase's
--steps must name steps that phase has (tools/gpu-phase.sh --list, which runs nothing): a misspelt name
selects nothing, and the call would pass without the step it meant. The phases' deadlines must fit one device
call (600 s, and a machine's start before it). And --list itself must fail on a name no phase has.
  test_next_gpu_command.py REPO
"""
import re
import subprocess
import sys

repo = sys.argv[1]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


lines = open(f"{repo}/docs/performance.md").read().splitlines()
at = [i for i, l in enumerate(lines) if l.startswith("<!-- next-gpu-command")]
check(len(at) == 1, "docs/performance.md marks exactly one next-GPU command")
command = lines[at[0] + 1].strip().strip("`") if len(at) == 1 else ""
calls = re.findall(r"bash tools/gpu-phase\.sh ([A-D])((?: --[a-z-]+(?: '[^']*'| [^ ;']+)?)*)", command)
check(len(calls) >= 2, f"the command runs phases ({', '.join(p for p, _ in calls)})")
deadlines = 0
for phase, args in calls:
    steps = re.search(r"--steps '([^']*)'", args)
    deadline = re.search(r"--deadline-s (\d+)", args)
    check(deadline is not None, f"phase {phase}: a --deadline-s shares the call out")
    deadlines += int(deadline[1]) if deadline else 0
    argv = ["bash", f"{repo}/tools/gpu-phase.sh", phase, "--list"] + (["--steps", steps[1]] if steps else [])
    p = subprocess.run(argv, capture_output=True, text=True)
    check(p.returncode == 0, f"phase {phase}: every step of --steps exists {p.stderr.strip()}")
check(0 < deadlines <= 590, f"the phases' deadlines ({deadlines} s) fit one device call of 600 s")

p = subprocess.run(["bash", f"{repo}/tools/gpu-phase.sh", "C", "--list", "--steps", "opt_pdl|opt_pdll"],
                   capture_output=True, text=True)
check(p.returncode == 1 and "opt_pdll" in p.stderr and "opt_pdl\n" in p.stdout,
      "--list fails naming a --steps entry that no step of the phase has")
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
