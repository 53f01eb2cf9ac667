#!/usr/bin/env python3
"""Phase A's kernel table: every GPU kernel benchmark as a percentage of its ceiling and of its target.

  bench_table.py CEILINGS.json KERNELS.json [MORE.json ...]
                                                the table, then "kernels at target: N/M", then each
                                                opt-in kernel against the default it would replace
  bench_table.py --ceilings-only CEILINGS.json  one line: the copy bandwidth and the cuBLASLt ceiling

The ceilings are measured on the same device in the same call (bench_gpu_kernels --benchmark_filter
'^Ceiling/'): a 1 GiB device-to-device copy (read + write counted) and a cuBLASLt 8192^3 bf16 product.
Targets (issue 10): layernorm forward and backward >= 80% of the copy bandwidth; softmax-xent, GELU and
AdamW >= 75%; causal attention at T=1024, d=64: forward >= 230 TFLOP/s, backward >= 200; the hand GEMM
>= 80% of cuBLASLt on the same shape (mma.sync, `hand`, and the wgmma kernel: `hand_wgmma` with 128x128
tiles, `hand_wgmma256` with 128x256, the hand backend's default on compute capability 9.0, and
`hand_wgmma_pingpong` on the ping-pong schedule). Other kernels are listed with their percentage and no
target. The alternatives (the wgmma GEMM's tiles and attention forward, accumulate-dq, the fused bias
gradients, the multi-tensor AdamW, the layernorm backward with two rows in flight a warp) become defaults
only when they beat what they replace: the last section gives each one's time against its default's on the
same shape.
Standard library only: the device's Python runs it, never with the bundle's libraries.
"""
import json
import re
import sys


def load(path):
    """The benchmarks of one --benchmark_out file. A run that `timeout` ended (the phase step's limit) leaves
    the file cut short: Google Benchmark flushes it after each benchmark (a full stream buffer can also
    end it inside one) and writes the closing "]}" only at the end. The benchmarks it finished are read
    (each ends with a line "    }" in the reporter's layout), and the cut is said."""
    with open(path) as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        last = text.rfind("\n    }")
        head = text[:last + 6] if last >= 0 else text[:text.find("[", text.find('"benchmarks"')) + 1]
        try:
            doc = json.loads(head + "]}")
        except json.JSONDecodeError:
            print(f"{path}: not benchmark JSON, nothing read from it", file=sys.stderr)
            return []
        print(f"{path}: cut short (its step ran out of time): the {len(doc['benchmarks'])} benchmarks it finished "
              f"are read", file=sys.stderr)
    return [b for b in doc.get("benchmarks", []) if b.get("run_type", "iteration") == "iteration"]


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
    # BM_attention_*_bf16/<B>/<force_generic>/<path>/...: path 1 = the wgmma forward or accumulate-dq, 2 = the
    # wgmma forward's ping-pong or the wgmma backward, 3 = store-ds, 4 = wgmma-store-ds (backward); a 1 after B = the SIMT
    # fallback, listed only
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
    rows = [b for path in argv[2:] for b in load(path)]
    print(f"ceilings on this device: copy {copy or 0:.0f} GB/s, cuBLASLt 8192^3 bf16 {gemm or 0:.0f} TFLOP/s\n")
    by_name = {b["name"]: b for b in rows}
    met = total = 0
    lines = []
    for b in rows:
        name = b["name"]
        if name.startswith(tuple(prefix for prefix, *_ in DIAGNOSES)):  # in the diagnosis sections below
            continue
        if b.get("error_occurred"):  # SkipWithError: no counters (the wgmma GEMM off compute capability 9.0)
            lines.append(f"{name:58s} not run: {b.get('error_message', '?')}")
            continue
        gbs, tfl = b.get("GB_per_s"), b.get("TFLOP_per_s")
        if name.startswith("Gemm/bf16/"):
            pct = 100.0 * tfl / gemm if gemm and tfl else 0.0
            figure = f"{tfl or 0:7.1f} TFLOP/s {pct:5.1f}% of ceiling"
            verdict = ""
            hand = re.search(r"/hand(_wgmma|_wgmma256|_wgmma_pingpong)?/", name)
            if hand:
                ref = by_name.get(name.replace(hand.group(0), "/cublaslt/"))
                if tfl and ref and ref.get("TFLOP_per_s"):
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
        # The layernorm rows also time a copy of their own size (pct_of_copy): below ~64 MB the copy itself
        # stays under the 1 GiB ceiling (launch and tail), which the target does not allow for.
        if b.get("pct_of_copy") is not None:
            verdict += f" ({b['pct_of_copy']:.0f}% of a same-size copy)"
        lines.append(f"{name:58s} {figure}  {verdict}")
    print(f"kernels at target: {met}/{total}")
    print("\n".join(lines))
    print("\nopt-in kernels against the default they would replace (time per call; > 1.00x: the opt-in is faster)")
    for optin, default, what in opt_in_pairs(by_name):
        t_opt, t_def = optin.get("real_time"), default.get("real_time")
        if optin.get("error_occurred") or not t_opt or not t_def:
            print(f"{optin['name']:58s} no time ({optin.get('error_message', 'missing')})")
            continue
        print(f"{optin['name']:58s} {t_def / t_opt:5.2f}x {what}")
    diagnoses(by_name)
    return 0


def attention_default_row(name):
    """AttentionTileOrder/bf16/<fwd|bwd>/<order>/B:<B>/... -> the default row of that pass and B."""
    return re.sub(r"^AttentionTileOrder/bf16/(fwd|bwd)/\w+/B:(\d+)/",
                  lambda m: f"BM_attention_{'forward' if m.group(1) == 'fwd' else 'backward'}_bf16/{m.group(2)}/0/0/",
                  name)


# Diagnosis rows: what another row measures, run another way: (prefix, the other row's name, whether the line
# names the other row (else the diagnosis row itself), whether the table prints time(row) / time(other) (else
# the inverse), heading).
DIAGNOSES = [
    ("GemmNoEpilogue/", lambda n: n.replace("GemmNoEpilogue/", "Gemm/", 1), True, False,
     "epilogue cost (time with the epilogue / time without it; 1.00x: the epilogue is free)"),
    ("GemmAuxFromGlobal/", lambda n: n.replace("GemmAuxFromGlobal/", "Gemm/", 1), True, True,
     "GELU gradient's pre-activations by TMA during the products (time when the epilogue reads them / time by TMA; "
     "> 1.00x: TMA is faster)"),
    ("GemmNoAuxPrefetch/", lambda n: n.replace("GemmNoAuxPrefetch/", "Gemm/", 1), True, True,
     "GELU gradient's pre-activations prefetched into L2 during the products, 128x256 (time without the prefetch / "
     "time with it; > 1.00x: the prefetch pays)"),
    ("GemmBulkStore/", lambda n: n.replace("GemmBulkStore/", "Gemm/", 1), True, False,
     "wgmma epilogue's bulk stores, 128x256 (time with the threads' stores / time with bulk copies; > 1.00x: the "
     "bulk copies pay)"),
    ("AttentionTileOrder/", attention_default_row, False, True,
     "attention block order (time in this order / time in the default: the forward's groups of heads sized for L2, "
     "the backward's one group; "
     "> 1.00x: the default is faster)"),
]


def diagnoses(by_name):
    for prefix, other_of, name_other, row_over_other, heading in DIAGNOSES:
        pairs = [(b, by_name.get(other_of(name))) for name, b in by_name.items() if name.startswith(prefix)]
        if not pairs:
            continue
        print(f"\n{heading}")
        for row, other in pairs:
            t_row, t_other = row.get("real_time"), other.get("real_time") if other else None
            name = other_of(row["name"]) if name_other else row["name"]
            if row.get("error_occurred") or not other or other.get("error_occurred") or not t_row or not t_other:
                why = row.get("error_message") or (other or {}).get("error_message", "missing")
                print(f"{name:58s} no time ({why})")
                continue
            print(f"{name:58s} {(t_row / t_other if row_over_other else t_other / t_row):5.2f}x")


# (opt-in name pattern, how to name its default, what the default is); a name may match more than one
OPT_INS = [
    (r"^Gemm/bf16/hand_wgmma/", lambda n: n.replace("/hand_wgmma/", "/hand/"), "vs mma.sync"),
    (r"^Gemm/bf16/hand_wgmma256/", lambda n: n.replace("/hand_wgmma256/", "/hand_wgmma/"), "vs wgmma 128x128 tiles"),
    (r"^Gemm/bf16/hand_wgmma_pingpong/", lambda n: n.replace("/hand_wgmma_pingpong/", "/hand_wgmma/"),
     "vs wgmma cooperative"),
    (r"^BM_attention_forward_bf16/\d+/0/1", lambda n: re.sub(r"^(BM_attention_forward_bf16/\d+/0/)1", r"\g<1>0", n),
     "vs mma.sync forward"),
    (r"^BM_attention_forward_bf16/\d+/0/2", lambda n: re.sub(r"^(BM_attention_forward_bf16/\d+/0/)2", r"\g<1>1", n),
     "vs wgmma cooperative forward"),
    (r"^BM_attention_backward_bf16/\d+/0/[1234]",
     lambda n: re.sub(r"^(BM_attention_backward_bf16/\d+/0/)[1234]", r"\g<1>0", n), "vs recompute-dq backward"),
    # wgmma-store-ds also against the same wgmma kernel with its dQ turns: what the turns cost
    (r"^BM_attention_backward_bf16/\d+/0/4", lambda n: re.sub(r"^(BM_attention_backward_bf16/\d+/0/)4", r"\g<1>2", n),
     "vs wgmma backward (dQ turns)"),
    (r"^WeightBiasGrad/bf16/(hand|hand_wgmma|hand_wgmma256|cublaslt)/",
     lambda n: re.sub(r"/(hand|hand_wgmma|hand_wgmma256|cublaslt)/", r"/\g<1>_unfused/", n, count=1),
     "vs GEMM + bias kernel"),
    # cuBLASLt's bias-gradient epilogue with bf16 sums against the default, which on the lent GPUs so far is the
    # GEMM + bias kernel (no algorithm for fp32 sums beside bf16 data)
    (r"^WeightBiasGrad/bf16/cublaslt_bgrad_bf16/", lambda n: n.replace("/cublaslt_bgrad_bf16/", "/cublaslt/", 1),
     "vs cuBLASLt's default bias gradient"),
    # its fallback, BGRADB on row-ordered layouts, against the same default and against BGRADA's bf16 sums
    (r"^WeightBiasGrad/bf16/cublaslt_bgrad_bf16_row_major/",
     lambda n: n.replace("/cublaslt_bgrad_bf16_row_major/", "/cublaslt/", 1), "vs cuBLASLt's default bias gradient"),
    (r"^WeightBiasGrad/bf16/cublaslt_bgrad_bf16_row_major/",
     lambda n: n.replace("/cublaslt_bgrad_bf16_row_major/", "/cublaslt_bgrad_bf16/", 1), "vs BGRADA's bf16 sums"),
    # MLP up's bias gradient on MLP down's GELU gradient (DGELU_BGRAD, bf16 sums) against that product, then the
    # bias kernel over its result (the default's second read)
    (r"^DGeluBiasGrad/bf16/cublaslt_bgrad_bf16/", lambda n: n.replace("/cublaslt_bgrad_bf16/", "/cublaslt/", 1),
     "vs GELU gradient + bias kernel"),
    (r"^BM_AdamWModel.*multi:1", lambda n: n.replace("multi:1", "multi:0"), "vs one launch per tensor"),
    # the qkv bias gradient from the attention backward's own column sums against the bias kernel's pass over dqkv
    (r"^AttentionQkvBiasGrad/bf16/attention_sums/", lambda n: n.replace("/attention_sums/", "/bias_kernel/", 1),
     "vs backward + bias kernel"),
    (r"^BM_layernorm_bwd_prefetch_bf16/", lambda n: n.replace("_prefetch_bf16/", "_bf16/", 1),
     "vs one row in flight a warp"),
    # a chain of launches with programmatic dependent launch (GPT2_PDL=on) against the same chain in stream order
    (r"^LaunchChain/.*/pdl:1", lambda n: n.replace("/pdl:1", "/pdl:0", 1), "vs stream order (GPT2_PDL off)"),
]


def opt_in_pairs(by_name):
    for name, b in by_name.items():
        for pattern, default_name, what in OPT_INS:
            if re.search(pattern, name):
                d = by_name.get(default_name(name))
                if d is not None:
                    yield b, d, what


if __name__ == "__main__":
    sys.exit(main(sys.argv))
