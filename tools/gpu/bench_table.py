#!/usr/bin/env python3
"""Phase B's kernel table: every GPU kernel benchmark as a percentage of its ceiling and of its target.

  bench_table.py CEILINGS.json KERNELS.json     the table, then "kernels at target: N/M"
  bench_table.py --ceilings-only CEILINGS.json  one line: the copy bandwidth and the cuBLASLt ceiling

The ceilings are measured on the same device in the same call (bench_gpu_kernels --benchmark_filter
'^Ceiling/'): a 1 GiB device-to-device copy (read + write counted) and a cuBLASLt 8192^3 bf16 product.
Targets (issue 10): layernorm forward and backward >= 80% of the copy bandwidth; softmax-xent, GELU and
AdamW >= 75%; causal attention at T=1024, d=64: forward >= 230 TFLOP/s, backward >= 200; the hand GEMM
>= 80% of cuBLASLt on the same shape. Other kernels are listed with their percentage and no target.
Standard library only: the device's Python runs it, never with the bundle's libraries.
"""
import json
import re
import sys


def load(path):
    with open(path) as f:
        return [b for b in json.load(f)["benchmarks"] if b.get("run_type", "iteration") == "iteration"]


def ceilings(path):
    copy = gemm = None
    for b in load(path):
        if b["name"].startswith("Ceiling/copy_d2d"):
            copy = b.get("GB_per_s")
        elif b["name"].startswith("Ceiling/gemm_bf16_cublaslt"):
            gemm = b.get("TFLOP_per_s")
    return copy, gemm


def target_for(name):
    """(kind, bound): kind 'copy' = % of copy bandwidth, 'tflops' = absolute TFLOP/s, None = no target."""
    if re.match(r"BM_(residual_)?layernorm_(fwd|bwd)", name):
        return "copy", 80.0
    if "AdamWModel" in name and "multi:0" in name:  # one launch per tensor: the baseline, listed only
        return None, None
    if re.match(r"BM_(SoftmaxXent|GeluForward|GeluBackward|AdamW)", name):
        return "copy", 75.0
    # BM_attention_*_bf16/<B>/<force_generic>/<wgmma or accumulate_dq>/...: a 1 after B = the SIMT fallback,
    # listed only
    if re.match(r"BM_attention_forward_bf16/\d+/0/", name):
        return "tflops", 230.0
    if re.match(r"BM_attention_backward_bf16/\d+/0/", name):
        return "tflops", 200.0
    return None, None


def main(argv):
    if argv[1] == "--ceilings-only":
        copy, gemm = ceilings(argv[2])
        print(f"copy {copy / 1e3:.2f} TB/s, cuBLASLt {gemm:.0f} TFLOP/s" if copy and gemm else "ceilings missing")
        return 0
    copy, gemm = ceilings(argv[1])
    rows = load(argv[2])
    print(f"ceilings on this device: copy {copy or 0:.0f} GB/s, cuBLASLt 8192^3 bf16 {gemm or 0:.0f} TFLOP/s\n")
    by_name = {b["name"]: b for b in rows}
    met = total = 0
    lines = []
    for b in rows:
        name = b["name"]
        gbs, tfl = b.get("GB_per_s"), b.get("TFLOP_per_s")
        if name.startswith("Gemm/bf16/"):
            pct = 100.0 * tfl / gemm if gemm and tfl else 0.0
            figure = f"{tfl or 0:7.1f} TFLOP/s {pct:5.1f}% of ceiling"
            verdict = ""
            if "/hand/" in name:
                ref = by_name.get(name.replace("/hand/", "/cublaslt/"))
                if ref and ref.get("TFLOP_per_s"):
                    rel = 100.0 * tfl / ref["TFLOP_per_s"]
                    ok = rel >= 80.0
                    met, total = met + ok, total + 1
                    verdict = f"{rel:5.1f}% of cuBLASLt (target 80%) {'ok' if ok else 'MISS'}"
            lines.append(f"{name:58s} {figure}  {verdict}")
            continue
        kind, bound = target_for(name)
        if gbs is not None:
            pct = 100.0 * gbs / copy if copy else 0.0
            figure = f"{gbs:7.0f} GB/s {pct:5.1f}% of copy"
        else:
            pct = 100.0 * tfl / gemm if gemm and tfl else 0.0
            figure = f"{tfl or 0:7.1f} TFLOP/s {pct:5.1f}% of ceiling"
        verdict = ""
        if kind == "copy" and gbs is not None:
            ok = pct >= bound
            met, total = met + ok, total + 1
            verdict = f"target {bound:.0f}% of copy {'ok' if ok else 'MISS'}"
        elif kind == "tflops" and tfl is not None:
            ok = tfl >= bound
            met, total = met + ok, total + 1
            verdict = f"target {bound:.0f} TFLOP/s {'ok' if ok else 'MISS'}"
        lines.append(f"{name:58s} {figure}  {verdict}")
    print(f"kernels at target: {met}/{total}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
