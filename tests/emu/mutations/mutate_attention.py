#!/usr/bin/env python3
"""Writes mutants of attention_sm90.cu: mutate.py SRC OUT_DIR [NAME ...] writes OUT_DIR/NAME.cu for each
mutation (all by default) and prints the names; SRC is only read. Each mutation is an exact text
replacement that must match exactly once, so a change to the kernel that moves a pattern fails loudly
here instead of silently testing nothing (tests/emu/emu.sh --mutants)."""
import os, sys

WAIT_PV = ("    cuda::wgmma_commit_group();\n    cuda::wgmma_wait_group<0>();\n#pragma unroll\n"
           "    for (int i = 0; i < 32; ++i) cuda::wgmma_fence_operand(o[i]);")
ARRIVE = "    if (lane == 0) cuda::mbarrier_arrive(&empty[s]);\n"

MUTATIONS = {
    # V is MN-major: transpose immediate 0 reads it as K-major
    "v_transpose_0": [("cuda::wgmma_m64n64k16_bf16_rs<1>(o, pa[kk], dv, 1);",
                       "cuda::wgmma_m64n64k16_bf16_rs<0>(o, pa[kk], dv, 1);")],
    # causal mask lets one future key in
    "mask_off_by_one": [("if (col > row || col >= T_) sc[i] = -INFINITY;",
                         "if (col > row + 1 || col >= T_) sc[i] = -INFINITY;")],
    # consumers wait for the wrong k_full/v_full parity (a fresh barrier's parity-1 wait passes at once)
    "consumer_parity": [("const uint32_t parity = (j / Cfg::kStages) & 1;",
                         "const uint32_t parity = ((j / Cfg::kStages) & 1) ^ 1;")],
    # producer waits for the wrong empty parity: the first wait on a fresh barrier never completes
    "producer_parity": [("cuda::mbarrier_wait(&empty[s], ((j / Cfg::kStages) & 1) ^ 1);",
                         "cuda::mbarrier_wait(&empty[s], (j / Cfg::kStages) & 1);")],
    # the stage is released (empty arrive) before the P V wgmma that reads V retired
    "release_before_wait": [(ARRIVE, ""),
                            (WAIT_PV, WAIT_PV.replace("    cuda::wgmma_wait_group<0>();\n",
                                                      ARRIVE + "    cuda::wgmma_wait_group<0>();\n"))],
    # no wgmma.wait_group after S = Q K^T: the softmax reads accumulators still in flight
    "missing_s_wait": [("    cuda::wgmma_commit_group();\n    cuda::wgmma_wait_group<0>();\n#pragma unroll\n"
                        "    for (int i = 0; i < 64; ++i)",
                        "    cuda::wgmma_commit_group();\n#pragma unroll\n    for (int i = 0; i < 64; ++i)")],
    # expect_tx announces half of V's bytes
    "expect_tx_short": [("cuda::mbarrier_arrive_expect_tx(&v_full[s], Cfg::kTileBytes);",
                         "cuda::mbarrier_arrive_expect_tx(&v_full[s], Cfg::kTileBytes / 2);")],
    # A fragment registers 1 and 2 swapped (rows g+8 / k+8 confused)
    "a_fragment_swap": [("      pa[kk][1] = cuda::pack_bf16x2(sc[8 * kk + 2], sc[8 * kk + 3]);\n"
                         "      pa[kk][2] = cuda::pack_bf16x2(sc[8 * kk + 4], sc[8 * kk + 5]);",
                         "      pa[kk][1] = cuda::pack_bf16x2(sc[8 * kk + 4], sc[8 * kk + 5]);\n"
                         "      pa[kk][2] = cuda::pack_bf16x2(sc[8 * kk + 2], sc[8 * kk + 3]);")],
    # V's k16 step as 8 rows instead of 16
    "v_kstep_wrong": [("cuda::wgmma_desc(v_base + kk * Cfg::kWgmmaK * 128,",
                       "cuda::wgmma_desc(v_base + kk * 8 * 128,")],
    # the O rescale applied to the wrong register half
    "rescale_wrong_half": [("        o[4 * q + 2 * r] *= alpha;\n        o[4 * q + 2 * r + 1] *= alpha;",
                            "        o[4 * q + 2 * (1 - r)] *= alpha;\n        o[4 * q + 2 * (1 - r) + 1] *= alpha;")],
}

def main():
    if len(sys.argv) < 3:
        sys.exit("usage: mutate.py SRC OUT_DIR [NAME ...]")
    src = open(sys.argv[1]).read()
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    names = sys.argv[3:] or list(MUTATIONS)
    for name in names:
        text = src
        for old, new in MUTATIONS[name]:
            n = text.count(old)
            if n != 1:
                sys.exit(f"mutation {name}: pattern found {n} times:\n{old}")
            text = text.replace(old, new)
        open(os.path.join(out, name + ".cu"), "w").write(text)
        print(name)

if __name__ == "__main__":
    main()
