#!/usr/bin/env python3
"""Checks the layering of the sources: a component may include itself and the components below it,
never above it or beside it.

    app -> train -> {model, optim, comm, data} -> kernels -> core

(src/<component>/ and kernels/; the first path component of each #include "..." names the component
it reaches). model, optim, comm and data are siblings: none includes another (what they share lives
in core, e.g. core/param_segment.hpp between model and optim). Prints file:line and the rule for each
violation and exits 1; exits 0 when there is none.

usage: check_layering.py [ROOT]        check ROOT (default: the repository this script is in)
       check_layering.py --self-test   prove the check catches a violation (a temporary tree)
"""
import os
import re
import sys
import tempfile

LEVEL = {"core": 0, "kernels": 1, "model": 2, "optim": 2, "comm": 2, "data": 2, "train": 3, "app": 4}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/')


def component_of(root, path):
    rel = os.path.relpath(path, root).split(os.sep)
    if rel[0] == "kernels":
        return "kernels"
    if rel[0] == "src" and len(rel) > 2 and rel[1] in LEVEL:
        return rel[1]
    return None


def violations(root):
    found = []
    for top in ("src", "kernels"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".cpp", ".hpp", ".cu", ".cuh", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                me = component_of(root, path)
                if me is None:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) not in LEVEL:
                            continue
                        other = m.group(1)
                        if other == me or LEVEL[other] < LEVEL[me]:
                            continue
                        how = "beside it" if LEVEL[other] == LEVEL[me] else "above it"
                        found.append(f"{os.path.relpath(path, root)}:{lineno}: {me} includes {other} ({how}): "
                                     f"{line.strip()}")
    return found


def self_test():
    with tempfile.TemporaryDirectory() as root:
        for rel, text in {"src/data/reader.cpp": '#include "core/error.hpp"\n#include "model/gpt2.hpp"\n',
                          "kernels/gemm/gemm.cu": '#include "train/trainer.hpp"\n',
                          "src/train/ok.cpp": '#include "model/gpt2.hpp"\n#include "kernels/x.hpp"\n'}.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        got = violations(root)
        want = ["src/data/reader.cpp:2: data includes model (beside it)", "kernels/gemm/gemm.cu:1: kernels includes train (above it)"]
        ok = len(got) == 2 and all(any(g.startswith(w) for g in got) for w in want)
        print("\n".join(got))
        print("check_layering self-test:", "PASS" if ok else "FAIL")
        return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = violations(root)
    for v in found:
        print(v)
    print(f"check_layering: {len(found)} violation(s) of app -> train -> {{model, optim, comm, data}} -> kernels -> core")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
