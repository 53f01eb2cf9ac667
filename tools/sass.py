#!/usr/bin/env python3
"""SASS of our kernels without a GPU or cuobjdump: compile for one architecture, disassemble, summarize.

    tools/sass.py kernels/attention/attention_bwd_sm90.cu              per kernel: the counts below
    tools/sass.py kernels/gemm/gemm_sm90.cu --kernel persistent --dump   the disassembly of matching kernels
    tools/sass.py build/x.cubin --arch sm_90                           a cubin compiled elsewhere

This machine's CUDA 13.0 has nvcc and ptxas but no cuobjdump or nvdisasm. Debian's non-free
nvidia-cuda-toolkit (11.8) has nvdisasm, which decodes sm_90 (and so sm_90a) machine code; the first run
downloads that package (84 MB) through a private apt configuration under ~/.cache/gpt2 (the system's apt
sources are not touched) and keeps only nvdisasm. CUDA 12.8+ writes the cubin's ELF header in a newer form
(ABI version 8, the architecture in bits 8-15 of e_flags) that 11.8 rejects; the header of a copy is
rewritten into the old form (ABI version 7, sm in bits 0-7 and 16-23). The instructions are unchanged.

The summary, per kernel: instructions; HGMMA (wgmma) and the WARPGROUP.ARRIVE / WARPGROUP.DEPBAR around
them: a kernel whose arrivals are at least half its HGMMA count has its wgmma serialized (ptxas waits for
each before the next; tools/ptxas_guard.sh fails the build on ptxas's own report of it); HMMA (mma.sync);
LDL/STL (local memory: spills or indexed arrays); MUFU; BAR (named and block barriers); UTMALDG (TMA
loads); USETMAXREG. `--check` exits 1 when a kernel with HGMMA looks serialized or touches local memory
(gpu-phase.sh's sass_sm90a checks the same on the device with cuobjdump).
"""
import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "gpt2", "nvdisasm-11.8")
COUNTED = ["HGMMA", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "HMMA", "LDL", "STL", "MUFU", "BAR", "UTMALDG", "USETMAXREG"]


def find_nvdisasm():
    for path in (os.environ.get("NVDISASM"), shutil.which("nvdisasm"), "/usr/local/cuda/bin/nvdisasm",
                 os.path.join(CACHE, "nvdisasm")):
        if path and os.access(path, os.X_OK):
            return path
    os.makedirs(os.path.join(CACHE, "lists", "partial"), exist_ok=True)
    os.makedirs(os.path.join(CACHE, "archives", "partial"), exist_ok=True)
    sources = os.path.join(CACHE, "sources.list")
    with open(sources, "w") as f:
        f.write("deb http://deb.debian.org/debian bookworm non-free\n")
    opts = ["-o", f"Dir::Etc::SourceList={sources}", "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State::Lists={CACHE}/lists", "-o", f"Dir::Cache={CACHE}/cache",
            "-o", f"Dir::Cache::Archives={CACHE}/archives", "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root", "-qq"]
    print("sass.py: fetching nvdisasm (Debian non-free nvidia-cuda-toolkit 11.8, 84 MB) into " + CACHE, file=sys.stderr)
    subprocess.run(["apt-get"] + opts + ["update"], check=True)
    subprocess.run(["apt-get"] + opts + ["download", "nvidia-cuda-toolkit"], check=True, cwd=CACHE)
    debs = [d for d in os.listdir(CACHE) if d.startswith("nvidia-cuda-toolkit_") and d.endswith(".deb")]
    if not debs:
        sys.exit("sass.py: apt-get download left no nvidia-cuda-toolkit package in " + CACHE)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg", "-x", os.path.join(CACHE, debs[0]), tmp], check=True)
        shutil.copy(os.path.join(tmp, "usr", "bin", "nvdisasm"), os.path.join(CACHE, "nvdisasm"))
    for d in debs:
        os.remove(os.path.join(CACHE, d))
    return os.path.join(CACHE, "nvdisasm")


def compile_cubin(source, arch, out, defines):
    cmd = ["nvcc", "-DGPT2_HAVE_CUDA=1", "-I" + os.path.join(REPO, "src"), "-I" + REPO, "-O3", "-DNDEBUG",
           f"-arch={arch}", "-cubin", "--expt-relaxed-constexpr", "-std=c++17", "-x", "cu", source, "-o", out]
    cmd[1:1] = ["-D" + d for d in defines]
    if shutil.which("nvcc") is None and os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        cmd[0] = "/usr/local/cuda/bin/nvcc"
    subprocess.run(cmd, check=True)


def old_header_copy(cubin, out):
    data = bytearray(open(cubin, "rb").read())
    if data[:4] != b"\x7fELF":
        sys.exit(f"sass.py: {cubin} is not an ELF cubin (compile with -cubin, or give the .cu)")
    if data[8] >= 8:  # ABI version 8 (CUDA 12.8+): sm in bits 8-15 of e_flags
        sm = (struct.unpack_from("<I", data, 0x30)[0] >> 8) & 0xFF
        data[7], data[8] = 0x33, 7  # the CUDA OS/ABI and version 7
        struct.pack_into("<I", data, 0x30, (sm << 16) | 0x500 | sm)  # virtual sm, 64-bit, unified textures, sm
    open(out, "wb").write(data)


def summarize(text):
    kernels, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s+\.type\s+(\S+),@function", line)
        if m:
            name = m.group(1)
            kernels[name] = dict.fromkeys(COUNTED + ["instructions"], 0)
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m and name:
            op = m.group(1)
            kernels[name]["instructions"] += 1
            for key in COUNTED:
                if op == key or op.startswith(key + "."):
                    kernels[name][key] += 1
    return kernels


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("input", help="a .cu source (compiled here) or a .cubin")
    ap.add_argument("--arch", default="sm_90a", help="nvcc -arch for a source (default sm_90a)")
    ap.add_argument("-D", dest="defines", action="append", default=[], help="a define for the compile")
    ap.add_argument("--kernel", default="", help="only kernels whose mangled name contains this")
    ap.add_argument("--dump", action="store_true", help="print the disassembly of the matching kernels")
    ap.add_argument("--check", action="store_true", help="exit 1 if a wgmma kernel looks serialized or uses local memory")
    args = ap.parse_args()

    if not os.path.isfile(args.input):
        sys.exit(f"sass.py: {args.input}: no such file")
    if not args.input.endswith((".cu", ".cubin")):
        sys.exit(f"sass.py: {args.input}: give a .cu source or a .cubin")
    nvdisasm = find_nvdisasm()
    with tempfile.TemporaryDirectory() as tmp:
        cubin = args.input
        if args.input.endswith(".cu"):
            cubin = os.path.join(tmp, "k.cubin")
            try:
                compile_cubin(args.input, args.arch, cubin, args.defines)
            except subprocess.CalledProcessError:
                sys.exit(f"sass.py: nvcc could not compile {args.input} for {args.arch} (its errors are above)")
        old = os.path.join(tmp, "old.cubin")
        old_header_copy(cubin, old)
        text = subprocess.run([nvdisasm, "-c", old], capture_output=True, text=True, check=True).stdout

    if args.dump:
        keep, out = False, []
        for line in text.splitlines():
            m = re.match(r"\s+\.type\s+(\S+),@function", line)
            if m:
                keep = args.kernel in m.group(1)
            if keep:
                out.append(line)
        print("\n".join(out))
        return 0
    kernels = {k: v for k, v in summarize(text).items() if args.kernel in k}
    bad = 0
    print("instr  HGMMA arrive depbar  HMMA  LDL  STL  MUFU  BAR TMA-ld SETMAXREG  kernel")
    for (name, c), pretty in zip(kernels.items(), demangle(kernels.keys())):
        serialized = c["HGMMA"] > 0 and 2 * c["WARPGROUP.ARRIVE"] >= c["HGMMA"]
        local = c["LDL"] + c["STL"] > 0
        flag = ("  SERIALIZED" if serialized else "") + ("  LOCAL-MEMORY" if local and c["HGMMA"] else "")
        bad += bool(flag)
        print(f"{c['instructions']:5d} {c['HGMMA']:6d} {c['WARPGROUP.ARRIVE']:6d} {c['WARPGROUP.DEPBAR']:6d} {c['HMMA']:5d} "
              f"{c['LDL']:4d} {c['STL']:4d} {c['MUFU']:5d} {c['BAR']:4d} {c['UTMALDG']:6d} {c['USETMAXREG']:9d}  "
              f"{pretty[:150]}{flag}")
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
