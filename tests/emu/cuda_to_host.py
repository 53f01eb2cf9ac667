#!/usr/bin/env python3
"""Rewrites a CUDA source file so that g++ compiles it against the emulator (tests/emu/README.md).

Only CUDA syntax that C++ cannot express changes, and every line keeps its number (a rewritten construct
is followed by the newlines it spanned), so compiler messages and emulator reports name the real source:

  * a launch `CALLEE<<<CFG>>>(ARGS)` becomes `::emu::Launch(CFG).run(CALLEE, ARGS)`;
  * `extern __shared__ [__align__(N)] T NAME[];` becomes a pointer to the block's dynamic shared memory;
  * `__shared__ [__align__(N)] T NAME DIMS, ...;` becomes a reference to storage the emulator places in the
    block's shared window (EMU_STATIC_SHARED, prelude.h), one per declaration and block.

usage: cuda_to_host.py SRC OUT    (prints what it rewrote on stderr; fails on a construct it cannot parse)
"""
import re
import sys


def fail(src, pos, text, why):
    line = text.count("\n", 0, pos) + 1
    sys.exit(f"cuda_to_host: {src}:{line}: {why}")


def match_back(text, i, open_c, close_c):
    """text[i] == close_c: the index of its matching open_c, scanning backwards."""
    depth = 0
    while i >= 0:
        if text[i] == close_c:
            depth += 1
        elif text[i] == open_c:
            depth -= 1
            if depth == 0:
                return i
        i -= 1
    return -1


def match_fwd(text, i, open_c, close_c):
    """text[i] == open_c: the index of its matching close_c."""
    depth = 0
    while i < len(text):
        if text[i] == open_c:
            depth += 1
        elif text[i] == close_c:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def rewrite_launches(src, text):
    out, pos, count = [], 0, 0
    while True:
        lt = text.find("<<<", pos)
        if lt < 0:
            break
        # The callee: identifiers, `::` and template argument lists, ending just before `<<<` (spaces allowed).
        j = lt - 1
        while j >= 0 and text[j].isspace():
            j -= 1
        end = j + 1
        while j >= 0:
            c = text[j]
            if c == ">":
                j = match_back(text, j, "<", ">") - 1
            elif c.isalnum() or c in "_:":
                j -= 1
            else:
                break
        start = j + 1
        callee = text[start:end].strip()
        if not re.match(r"^[A-Za-z_:]", callee):
            fail(src, lt, text, "a launch whose kernel expression is not a name")
        gt = text.find(">>>", lt)
        if gt < 0:
            fail(src, lt, text, "<<< without >>>")
        cfg = text[lt + 3:gt]
        k = gt + 3
        while k < len(text) and text[k].isspace():
            k += 1
        if k >= len(text) or text[k] != "(":
            fail(src, lt, text, "a launch without its argument list")
        close = match_fwd(text, k, "(", ")")
        if close < 0:
            fail(src, lt, text, "a launch's argument list does not close")
        args = text[k + 1:close]
        spanned = text[start:close + 1]
        flat = lambda s: " ".join(s.split())
        call = f"::emu::Launch({flat(cfg)}).run({callee}" + (f", {flat(args)})" if args.strip() else ")")
        out.append(text[pos:start])
        out.append(call + "\n" * spanned.count("\n"))
        pos = close + 1
        count += 1
    out.append(text[pos:])
    return "".join(out), count


SHARED = re.compile(r"(?P<extern>extern\s+)?__shared__\s+(?:__align__\((?P<align>\d+)\)\s+)?(?P<rest>[^;]*);")


def split_top(s):
    """Splits at commas outside brackets and parentheses."""
    parts, depth, cur = [], 0, ""
    for c in s:
        if c in "([<":
            depth += 1
        elif c in ")]>":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts]


def rewrite_shared(src, text):
    counts = {"dynamic": 0, "static": 0}

    def repl(m):
        align = m.group("align") or "16"
        rest = " ".join(m.group("rest").split())
        decls = split_top(rest)
        # The type is the first declarator's text before its name: `float sa[4][8]` -> `float`.
        first = re.match(r"^(?P<type>.*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]*\])*)$", decls[0])
        if not first or not first.group("type"):
            fail(src, m.start(), text, f"a __shared__ declaration not understood: {m.group(0)!r}")
        typ = first.group("type")
        names = [(first.group("name"), first.group("dims"))]
        for d in decls[1:]:
            dm = re.match(r"^(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]*\])*)$", d)
            if not dm:
                fail(src, m.start(), text, f"a __shared__ declarator not understood: {d!r}")
            names.append((dm.group("name"), dm.group("dims")))
        stmts = []
        for name, dims in names:
            if m.group("extern"):
                if dims != "[]":
                    fail(src, m.start(), text, "extern __shared__ that is not an unsized array")
                stmts.append(f"{typ}* const {name} = reinterpret_cast<{typ}*>(::emu::dynamic_smem());")
                counts["dynamic"] += 1
            else:
                if "[]" in dims:
                    fail(src, m.start(), text, "a static __shared__ array without a size")
                stmts.append(f"EMU_STATIC_SHARED({typ}, {name}, {dims or ' '}, {align});")
                counts["static"] += 1
        return " ".join(stmts) + "\n" * m.group(0).count("\n")

    return SHARED.sub(repl, text), counts


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    text = open(src).read()
    text, launches = rewrite_launches(src, text)
    text, shared = rewrite_shared(src, text)
    if "<<<" in text or "__shared__" in text:
        sys.exit(f"cuda_to_host: {src}: CUDA syntax left after the rewrite")
    open(dst, "w").write(text)
    print(f"cuda_to_host: {src}: {launches} launch(es), {shared['static']} static and {shared['dynamic']} "
          f"dynamic shared declaration(s)", file=sys.stderr)


if __name__ == "__main__":
    main()
