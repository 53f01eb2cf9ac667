#!/usr/bin/env python3
"""Checks the two rules that make programmatic dependent launch safe (kernels/common/launch.cuh, ptx.cuh):

  1. every kernel of the project (a `__global__` function defined in kernels/ or src/) opens with
     `cuda::griddep_launch_dependents_then_wait();`, before anything that could read or write memory;
  2. no kernel is launched there with `<<<...>>>`: every launch goes through cuda::launch_kernel, which
     alone sets the programmatic attribute (GPT2_PDL=on).

A kernel that broke rule 1 and was launched with the attribute could read its inputs before the kernel
that writes them has finished (or write what that kernel still reads): a race no test here can see, since
the CPU emulator runs kernels one after another. A launch that broke rule 2 would not be overlapped, and
would hide from GPT2_PDL.

usage: check_launches.py [ROOT]          (ROOT: the repository, by default this file's parent's parent)
       check_launches.py --self-test     (each rule catches a file that breaks it; a clean file passes)
Exit status 1 with one line per violation, naming file:line.
"""
import os
import re
import sys
import tempfile

PROLOGUE = "cuda::griddep_launch_dependents_then_wait();"
LAUNCH_HELPER = os.path.join("kernels", "common", "launch.cuh")
SUFFIXES = (".cu", ".cuh")


def strip_comments(text):
    """Comments and string literals blanked to spaces (newlines kept, so offsets and line numbers hold)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text[i] in "\"'":  # a string or character literal (a quote inside '"' must not open a string)
            q, j = text[i], i + 1
            while j < n and text[j] != q and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        for k in range(i, min(j, n)):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def kernel_bodies(code):
    """(name, position of `{`) for every `__global__` function definition in comment-free code."""
    for m in re.finditer(r"\b__global__\b", code):
        # only parentheses and brackets nest here: a template's <...> holds no `;` or `{`, while a `>>` or
        # `->` in __launch_bounds__ or a parameter's default would unbalance angle brackets
        depth, i = 0, m.end()
        while i < len(code):
            c = code[i]
            if c in "([":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif depth == 0 and c == ";":
                break  # a declaration
            elif depth == 0 and c == "{":
                head = code[m.end():i]
                names = re.findall(r"([A-Za-z_]\w*)\s*\(", head)
                names = [x for x in names if x not in ("__launch_bounds__", "__maxnreg__")]
                yield (names[-1] if names else "?"), i
                break
            i += 1


def check_file(path, rel):
    """(problems, number of kernels defined) in one file."""
    text = open(path, encoding="utf-8").read()
    code = strip_comments(text)
    problems = []
    bodies = list(kernel_bodies(code))
    for name, brace in bodies:
        first = code[brace + 1:].lstrip()
        # preprocessor lines (an architecture guard) may not come first either: the prologue must run on
        # every architecture the kernel is compiled for
        if not first.startswith(PROLOGUE):
            problems.append(f"{rel}:{line_of(code, brace)}: kernel {name} does not open with {PROLOGUE}")
    if rel != LAUNCH_HELPER:
        for m in re.finditer(r"<<<", code):
            problems.append(f"{rel}:{line_of(code, m.start())}: a <<<...>>> launch: use cuda::launch_kernel "
                            "(kernels/common/launch.cuh)")
    return problems, len(bodies)


def check_tree(root):
    """(problems, number of kernels) over kernels/ and src/."""
    problems, kernels = [], 0
    for top in ("kernels", "src"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith(SUFFIXES):
                    path = os.path.join(dirpath, f)
                    found, n = check_file(path, os.path.relpath(path, root))
                    problems += found
                    kernels += n
    return problems, kernels


def self_test():
    good = ("// a comment with __global__ void x() { and <<<a, b>>>(c) in it\n"
            "template <int N>\n__global__ void __launch_bounds__(128, 2) good(const int* p, Params<N> q) {\n"
            "  " + PROLOGUE + "\n  use(p);\n}\n__global__ void declared_only(int);\n")
    cases = {
        "clean": (good, 0),
        "no prologue": ("__global__ void k(int* p) {\n  p[0] = 1;\n  " + PROLOGUE + "\n}\n", 1),
        "guard first": ("__global__ void k(int* p) {\n#if __CUDA_ARCH__ >= 900\n  " + PROLOGUE + "\n#endif\n}\n", 1),
        "raw launch": (good + "void f() { good<4><<<1, 32, 0, s>>>(p, q); }\n", 1),
        "two kernels, one bad": (good + "__global__ void bad() { return; }\n", 1),
        "shift in launch bounds": ("__global__ void __launch_bounds__(kT >> 1) k(int* p) {\n  for (;;) p[0] = 1;\n}\n", 1),
        "quote in a char literal": ("void f() { char q = '\"'; }\n__global__ void k(int* p) {\n  p[0] = 1;\n}\n", 1),
    }
    failed = 0
    with tempfile.TemporaryDirectory() as d:
        for what, (text, want) in cases.items():
            path = os.path.join(d, "k.cu")
            open(path, "w").write(text)
            got, _ = check_file(path, "kernels/x/k.cu")
            if len(got) != want:
                print(f"self-test '{what}': {len(got)} problem(s), expected {want}: {got}")
                failed += 1
    print("self-test:", "FAILED" if failed else f"{len(cases)} cases pass")
    return 1 if failed else 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems, kernels = check_tree(root)
    for p in problems:
        print(p)
    print(f"check_launches: {kernels} kernels, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
