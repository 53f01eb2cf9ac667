#!/usr/bin/env python3
"""Writes mutants of a kernel file: mutate.py KERNEL SRC OUT_DIR [NAME ...] (KERNEL: attention, attention_bwd or
gemm, the sm_90a kernels; gemm_mma, attention_mma or attention_decode, the default path's kernels/gemm/gemm.cu,
kernels/attention/attention.cu and kernels/attention/attention_decode.cu, and attention_bwd_storeds, the wgmma
backward's dS^T writer in kernels/attention/attention_bwd_sm90.cu, which emu.sh --mutants runs through the GPU
test suites; nccl_comm, device_reducer or model_cuda, the training code's stream ordering in
src/comm/nccl_communicator.cpp, src/comm/device_reducer.cpp and src/model/gpt2_cuda.cu, which it runs through
the emulated training programs)
writes OUT_DIR/NAME.cu for each of that kernel's mutations (all by default) and prints the names; SRC is
only read. Each mutation is an exact text replacement that must match exactly once, so a change to the
kernel that moves a pattern fails loudly here instead of silently testing nothing (tests/emu/emu.sh
--mutants). Every mutant must make the emulator fail."""
import os, sys

# ---- attention_sm90.cu ---------------------------------------------------------------------------
LOOP_PV_WAIT = ("      cuda::wgmma_wait_group<0>();\n      fence_operands(o);\n      fence_operands(pa);\n"
                "      // This warp has read K and V of tile j - 1 for the last time.\n"
                "      release(&empty[sp]);\n")
LOOP_TAIL = "      rescale_o(o, alpha);\n      pack_p(pa, sc);\n    }\n"
LOOP_S_WAIT = ("      cuda::wgmma_wait_group<1>();  // S of tile j; P V of tile j - 1 may still run\n"
               "      fence_operands(sc);\n"
               "      if (j == n_tiles - 1) release(q_empty);  // the next unit's Q may load now\n")

ATTENTION = {
    # V is MN-major: transpose immediate 0 reads it as K-major
    "v_transpose_0": [("cuda::wgmma_m64n64k16_bf16_rs<1>(o, pa[kk], dv, 1);",
                       "cuda::wgmma_m64n64k16_bf16_rs<0>(o, pa[kk], dv, 1);")],
    # causal mask lets one future key in
    "mask_off_by_one": [("if (col > row || col >= w.T_) sc[i] = -INFINITY;",
                         "if (col > row + 1 || col >= w.T_) sc[i] = -INFINITY;")],
    # consumers wait for the wrong k_full parity (a fresh barrier's parity-1 wait passes at once)
    "consumer_parity": [("cuda::mbarrier_wait(&k_full[s], (tj / Cfg::kStages) & 1);",
                         "cuda::mbarrier_wait(&k_full[s], ((tj / Cfg::kStages) & 1) ^ 1);")],
    # producer waits for the wrong empty parity: the first wait on a fresh barrier never completes
    "producer_parity": [("cuda::mbarrier_wait(&empty[s], ((t / Cfg::kStages) & 1) ^ 1);",
                         "cuda::mbarrier_wait(&empty[s], (t / Cfg::kStages) & 1);")],
    # the stage is released (empty arrive) before the P V wgmma that reads V retired
    "release_before_wait": [(LOOP_PV_WAIT,
                             "      // This warp has read K and V of tile j - 1 for the last time.\n"
                             "      release(&empty[sp]);\n"
                             "      cuda::wgmma_wait_group<0>();\n      fence_operands(o);\n      fence_operands(pa);\n")],
    # no wgmma.wait_group 1 in the loop: the softmax reads S still in flight
    "missing_s_wait": [("      cuda::wgmma_wait_group<1>();  // S of tile j; P V of tile j - 1 may still run\n", "")],
    # P of tile j packed into the A registers while P V of tile j - 1 still reads them
    "pack_before_pv_wait": [(LOOP_PV_WAIT + LOOP_TAIL,
                             "      pack_p(pa, sc);\n" + LOOP_PV_WAIT + "      rescale_o(o, alpha);\n    }\n")],
    # O rescaled while P V of tile j - 1 still accumulates into it
    "rescale_before_pv_wait": [(LOOP_PV_WAIT + LOOP_TAIL,
                                "      rescale_o(o, alpha);\n" + LOOP_PV_WAIT + "      pack_p(pa, sc);\n    }\n")],
    # expect_tx announces half of V's bytes
    "expect_tx_short": [("cuda::mbarrier_arrive_expect_tx(&v_full[s], Cfg::kTileBytes);",
                         "cuda::mbarrier_arrive_expect_tx(&v_full[s], Cfg::kTileBytes / 2);")],
    # A fragment registers 1 and 2 swapped (rows g+8 / k+8 confused)
    "a_fragment_swap": [("    pa[kk][1] = cuda::pack_bf16x2(sc[8 * kk + 2], sc[8 * kk + 3]);\n"
                         "    pa[kk][2] = cuda::pack_bf16x2(sc[8 * kk + 4], sc[8 * kk + 5]);",
                         "    pa[kk][1] = cuda::pack_bf16x2(sc[8 * kk + 4], sc[8 * kk + 5]);\n"
                         "    pa[kk][2] = cuda::pack_bf16x2(sc[8 * kk + 2], sc[8 * kk + 3]);")],
    # V's k16 step as 8 rows instead of 16
    "v_kstep_wrong": [("cuda::wgmma_desc(v_base + kk * Fwd::kWgmmaK * 128,",
                       "cuda::wgmma_desc(v_base + kk * 8 * 128,")],
    # the O rescale applied to the wrong register half
    "rescale_wrong_half": [("      o[4 * q + 2 * r] *= alpha[r];\n      o[4 * q + 2 * r + 1] *= alpha[r];",
                            "      o[4 * q + 2 * (1 - r)] *= alpha[r];\n      o[4 * q + 2 * (1 - r) + 1] *= alpha[r];")],
    # P V of the last key tile left out: the diagonal tile's values never reach O
    "last_pv_missing": [("      issue_pv(o, pa, cuda::smem_u32(sV(sl)));\n", "")],
    # persistent: Q released before the last S that reads it retired (the next unit's Q lands under it)
    "q_released_before_s_wait": [(LOOP_S_WAIT,
                                  "      if (j == n_tiles - 1) release(q_empty);\n"
                                  "      cuda::wgmma_wait_group<1>();  // S of tile j; P V of tile j - 1 may still run\n"
                                  "      fence_operands(sc);\n")],
    # persistent: the producer loads the next unit's Q without waiting for the consumers to release it
    "q_empty_not_waited": [("      if (n > 0) cuda::mbarrier_wait(q_empty, (n - 1) & 1);", "")],
    # persistent: consumers wait for Q's first phase on every unit (passes at once from the second unit on)
    "q_full_parity_fixed": [("cuda::mbarrier_wait(q_full, n & 1);", "cuda::mbarrier_wait(q_full, 0);")],
    # persistent: the consumers' ring position restarts at every unit while the producer's runs on
    "ring_restarts_per_unit": [("    t += n_tiles;\n", "")],
    # ping-pong: consumer 1 hands its last turn to consumer 0, which has none left (an arrival left over)
    "pingpong_last_turn_handed": [("      if (c == 0 || u + static_cast<int>(gridDim.x) < units) their_turn();",
                                   "      their_turn();")],
    # ping-pong: consumer 0 does not give itself the first turn: both wait for the other
    "pingpong_nobody_first": [("  if (kPingPong && c == 0) cuda::named_barrier_arrive(Cfg::kTurnBarrier, kTurnThreads);", "")],
    # ping-pong: a consumer hands the turn to itself
    "pingpong_turn_to_self": [("cuda::named_barrier_arrive(Cfg::kTurnBarrier + 1 - c, kTurnThreads);",
                               "cuda::named_barrier_arrive(Cfg::kTurnBarrier + c, kTurnThreads);")],
    # persistent: the online softmax state carried over from the block's previous unit
    "state_not_reset": [("    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f}, alpha[2];\n", ""),
                        ("  int t = 0;  // the block's key tiles so far, as the producer counts them\n",
                         "  int t = 0;\n  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f}, alpha[2];\n")],
}


# ---- gemm_sm90.cu --------------------------------------------------------------------------------
MMA_128 = "cuda::wgmma_m64n128k16_bf16<kTransA ? 1 : 0, kTransB ? 0 : 1>(acc[rb], da, db, scale_d);"
MMA_256 = MMA_128.replace("m64n128k16", "m64n256k16")

GEMM = {
    # the L2 prefetch of the GELU gradient's pre-activations (128x256) also for boxes wholly past C's tails: the
    # emulator fails a prefetch outside the tensor (a wrong coordinate would be one)
    "aux_prefetch_past_tail": [("if (row < p.M && u.n0 + j * kBox < p.N) cuda::tma_prefetch_l2_2d(",
                                "if (true) cuda::tma_prefetch_l2_2d(")],
    # ... never issued (the driver counts every box once), or the second consumer's rows fetched by the first
    "aux_prefetch_dropped": [("      if (aux_prefetch && tid_wg == 0) {", "      if (false && tid_wg == 0) {")],
    "aux_prefetch_rows_of_c0": [("const int row = u.m0 + (rb0 + rb) * Cfg::kWgRows;", "const int row = u.m0 + rb * Cfg::kWgRows;")],
    # ... and with its coordinates swapped (rows inner)
    "aux_prefetch_swapped": [("cuda::tma_prefetch_l2_2d(&tmap_aux, u.n0 + j * kBox, row);",
                              "cuda::tma_prefetch_l2_2d(&tmap_aux, row, u.n0 + j * kBox);")],
    # B's transpose immediate inverted: the bug the emulator found on 2026-11-25, before any GPU ran it
    "b_transpose_inverted": [(m, m.replace("kTransB ? 0 : 1", "kTransB ? 1 : 0")) for m in (MMA_128, MMA_256)],
    # A's descriptor says 64-byte swizzle while TMA wrote the 128-byte pattern
    "desc_swizzle_64B": [("""const uint64_t da = cuda::wgmma_desc(a_base + rb * Cfg::kBoxBytes + kk * kKStepA, kLboA, kSbo,
                                               cuda::WgmmaSwizzle::k128B);""",
                          """const uint64_t da = cuda::wgmma_desc(a_base + rb * Cfg::kBoxBytes + kk * kKStepA, kLboA, kSbo,
                                               cuda::WgmmaSwizzle::k64B);""")],
    # stride between 8-row core-matrix groups doubled
    "sbo_x2": [("constexpr uint32_t kSbo = 1024;", "constexpr uint32_t kSbo = 2048;")],
    # MN-major B: the second 64-wide N block at 16 bytes instead of the next box
    "lbo_b_wrong": [("constexpr uint32_t kLboB = kTransB ? 16 : Cfg::kBoxBytes;",
                     "constexpr uint32_t kLboB = kTransB ? 16 : Cfg::kBoxBytes / 2;")],
    # K-major A: k16 step of 64 bytes instead of 32
    "kstep_a_x2": [("constexpr uint32_t kKStepA = kTransA ? Cfg::kWgmmaK * 128 : Cfg::kWgmmaK * 2;",
                    "constexpr uint32_t kKStepA = kTransA ? Cfg::kWgmmaK * 128 : Cfg::kWgmmaK * 4;")],
    # consumers wait for the wrong full parity (a fresh barrier's parity-1 wait passes at once)
    "consumer_parity": [("cuda::mbarrier_wait(&full[s], (it / kStages) & 1);",
                         "cuda::mbarrier_wait(&full[s], ((it / kStages) & 1) ^ 1);")],
    # producer waits for the wrong empty parity: its first wait on a fresh barrier never completes
    "producer_parity": [("cuda::mbarrier_wait(&empty[s], ((it / kStages) & 1) ^ 1);",
                         "cuda::mbarrier_wait(&empty[s], (it / kStages) & 1);")],
    # wait_group<1> where 0 is needed: the epilogue reads accumulators still in flight
    "end_wait_1": [("    cuda::wgmma_wait_group<0>();\n#pragma unroll\n    for (int rb = 0; rb < Cfg::kRowBlocks; ++rb)",
                    "    cuda::wgmma_wait_group<1>();\n#pragma unroll\n    for (int rb = 0; rb < Cfg::kRowBlocks; ++rb)")],
    # two groups kept in flight but the previous stage still released: a stage freed before its wgmma retired
    "loop_wait_2": [("      cuda::wgmma_wait_group<1>();", "      cuda::wgmma_wait_group<2>();")],
    # expect_tx announces half of the stage's bytes
    "expect_tx_half": [("cuda::mbarrier_arrive_expect_tx(&full[s], Cfg::kStageBytes);",
                        "cuda::mbarrier_arrive_expect_tx(&full[s], Cfg::kStageBytes / 2);")],
    # empty barrier expects 4 arrivals instead of 8 (one consumer warpgroup can free a stage alone)
    "empty_count_half": [("cuda::mbarrier_init(&empty[s], Cfg::kUnitConsumers * Cfg::kWarpgroupThreads / 32);",
                          "cuda::mbarrier_init(&empty[s], Cfg::kWarpgroupThreads / 32);")],
    # scale-d never 0: each unit accumulates on top of the previous unit's tile
    "scale_d_always_1": [("const int scale_d = (kt > 0 || kk > 0) ? 1 : 0;", "const int scale_d = 1;")],
    # both consumers take the first 64 rows of A
    "a_rows_offset_0": [("const int rb0 = Cfg::kPingPong ? 0 : c;", "const int rb0 = 0;")],
    # accumulator fragment: registers 4j+2,4j+3 (row +8) swapped with 4j,4j+1
    "acc_fragment_rows": [("layout.at(r, col)) = make_float2(acc[rb][i], acc[rb][i + 1]);",
                           "layout.at(r, col)) = make_float2(acc[rb][i + 2], acc[rb][i + 3]);"),
                          ("layout.at(r + 8, col)) = make_float2(acc[rb][i + 2], acc[rb][i + 3]);",
                           "layout.at(r + 8, col)) = make_float2(acc[rb][i], acc[rb][i + 1]);")],
    # 128x256: the epilogue's second pass writes over the first pass's columns (128 of 256 never written)
    "epilogue_pass_column": [("u.n0 + pass * Cfg::kStageCols, p.M, p.N, part", "u.n0, p.M, p.N, part")],
    # 128x256: B loaded as two boxes (128 columns), the stage's expect_tx still counting four
    "b_boxes_as_a": [("for (int j = 0; j < Cfg::kBBoxes; ++j) {", "for (int j = 0; j < Cfg::kABoxes; ++j) {")],
    # ping-pong: no wait for the other warpgroup's mainloop (a parity wait then passes on a stage's use
    # two ahead: the bug the emulator found on 2026-11-25, before any GPU ran it)
    "pingpong_unordered": [("      if (nth > 0) cuda::mbarrier_wait(&mainloop_done[1 - c], ((nth - 1) / Cfg::kConsumers) & 1);\n", "")],
    # ping-pong: both row blocks of a unit read A's first 64 rows
    "pingpong_row_block_0": [("a_base + rb * Cfg::kBoxBytes + kk * kKStepA", "a_base + kk * kKStepA")],
    # ping-pong: the empty barrier expects both warpgroups (only the unit's one arrives): the producer hangs
    "pingpong_empty_count": [("cuda::mbarrier_init(&empty[s], Cfg::kUnitConsumers * Cfg::kWarpgroupThreads / 32);",
                              "cuda::mbarrier_init(&empty[s], Cfg::kConsumers * Cfg::kWarpgroupThreads / 32);")],
    # fused bias gradient: B's column read without the 128-byte swizzle (another column's values)
    "bias_sum_no_swizzle": [("rows + r * 128 + ((chunk ^ (r % 8)) * 16) + byte", "rows + r * 128 + (chunk * 16) + byte")],
    # the GELU gradient's pre-activations read from their TMA staging without the 128-byte swizzle
    # (this was bias_sum_no_swizzle's pattern until the bias sum's rewrite moved it: uncaught, 2026-11-28)
    "aux_no_swizzle": [("box + r * 128 + ((chunk ^ (r % 8)) * 16) + byte", "box + r * 128 + (chunk * 16) + byte")],
    # fused bias gradient: the column summed from the next stage of the ring, not the one just waited for
    "bias_sum_wrong_stage": [("b_pair_sum<Cfg>(stage_b(s), bias_pair, bias_slice)",
                              "b_pair_sum<Cfg>(stage_b((s + 1) % kStages), bias_pair, bias_slice)")],
    # fused bias gradient: every row tile adds its column sums, not row tile 0 alone
    "bias_every_row_tile": [("const bool bias_grad = bias_grad_wanted && u.m0 == 0;", "const bool bias_grad = bias_grad_wanted;")],
    # fused bias gradient with split-K: every split's sums written to split 0's row of the partials
    "bias_split_index_0": [("p.N, u.split, u.n0 + 2 * bias_pair, total.x);", "p.N, 0, u.n0 + 2 * bias_pair, total.x);"),
                           ("p.N, u.split, u.n0 + 2 * bias_pair + 1, total.y);", "p.N, 0, u.n0 + 2 * bias_pair + 1, total.y);")],
    # a split tail's launches both start at tile 0: the tail's launch redoes the whole tiles' first ones and
    # never computes its own
    "tail_offset_ignored": [("tile_coords(p.tile0 + unit % p.tiles, tiles_m, tiles_n, tile_m, tile_n);",
                             "tile_coords(unit % p.tiles, tiles_m, tiles_n, tile_m, tile_n);")],
    # units counted over every tile of the product, as before the split tail: the whole tiles' launch
    # runs the tail's tiles too (their partials not applied: C written twice, the bias sums added twice)
    "tail_units_all_tiles": [("  const int units = p.tiles * p.splits;\n",
                              "  const int units = tiles_m * tiles_n * p.splits;\n")],
    # the bulk-store epilogue: the staging rows written again before the copies of the unit before have read them
    "bulk_no_read_wait": [("            if (copier) cuda::bulk_wait_group_read<0>();\n", "")],
    # ... the bias left out of the fragment's second row (r + 8)
    "bulk_bias_row8": [("lo.x += b.x, lo.y += b.y, hi.x += b.x, hi.y += b.y;", "lo.x += b.x, lo.y += b.y;")],
    # ... every copy a whole tile wide, past N in the last column tile
    "bulk_row_bytes_tile": [("static_cast<uint32_t>(min(Cfg::kBN, p.N - u.n0)) * 2;", "static_cast<uint32_t>(Cfg::kBN) * 2;")],
    # ... the block ends with copies whose source (its shared memory) nothing has waited for
    "bulk_no_final_wait": [("  if (kBulkable && p.bulk_store && tid_wg < Cfg::kWgRows) cuda::bulk_wait_group<0>();\n", "")],
    # ... two copiers' rows swapped
    "bulk_rows_swapped": [("rows + tid_wg * kRow, row_bytes);", "rows + (tid_wg ^ 1) * kRow, row_bytes);")],
    # ... the rows' generic stores not made visible to the async proxy before the copies read them
    "bulk_no_proxy_fence": [("            cuda::fence_proxy_async_shared();  // the rows' stores, before the copies (the async proxy) read them\n", "")],
}


# ---- attention_bwd_sm90.cu -----------------------------------------------------------------------
# the stage's release on each side of the dq_share branch: the dQ consumer's, and the other's
BWD_ARRIVE_DQ = ("      // This thread has read Q, dO, lse and D of the stage for the last time (the dQ share reads K, dS^T).\n"
                 "      cuda::mbarrier_arrive(&empty[s]);\n")
BWD_ARRIVE_OTHER = "      cuda::mbarrier_arrive(&empty[s]);  // this thread has read Q, dO, lse and D of the stage for the last time\n"
BWD_DVDK = ("      issue_tokens_dot<kQSteps>(dk, dsa, cuda::smem_u32(sQ(s)), true);\n"
            "      cuda::wgmma_commit_group();  // retired below, before the dQ share's products where this consumer makes it\n")

ATTENTION_BWD = {
    # consumers wait for the wrong full parity (a fresh barrier's parity-1 wait passes at once)
    "consumer_parity": [("cuda::mbarrier_wait_untimed(&full[s], (j / Cfg::kStages) & 1);",
                         "cuda::mbarrier_wait_untimed(&full[s], ((j / Cfg::kStages) & 1) ^ 1);")],
    # producer waits for the wrong empty parity: its first wait on a fresh barrier never completes
    "producer_parity": [("cuda::mbarrier_wait(&empty[s], ((j / Cfg::kStages) & 1) ^ 1);",
                         "cuda::mbarrier_wait(&empty[s], (j / Cfg::kStages) & 1);")],
    # the stage is released before dV += P^T dO and dK += dS^T Q retired (they read its dO and Q)
    # (the consumer that skips the tile still arrives where it did)
    "early_stage_release": [(BWD_ARRIVE_DQ, ""),
                            (BWD_ARRIVE_OTHER, "      if (!computes) cuda::mbarrier_arrive(&empty[s]);\n"),
                            (BWD_DVDK, BWD_DVDK + "      cuda::mbarrier_arrive(&empty[s]);\n")],
    # the dQ share reads dS^T without waiting for both consumers' halves
    "ds_read_before_full": [("      cuda::mbarrier_wait_untimed(&ds_full[j % 2], ds_phase);", "")],
    # dO as B of dV read K-major: the transpose immediate of an MN-major operand dropped
    "transpose_immediate_0": [("cuda::wgmma_m64n64k16_bf16_rs<1>(d, a[kk], db, (accumulate || kk > 0) ? 1 : 0);",
                               "cuda::wgmma_m64n64k16_bf16_rs<0>(d, a[kk], db, (accumulate || kk > 0) ? 1 : 0);")],
    # no causal mask: keys after the query get probability
    "causal_mask_off": [("s[i] = (kMasked && q0 + col < key) ? 0.0f : p;", "s[i] = p;")],
    # the query tiles that start inside the key tile take the unmasked copy of the exponentials
    "diagonal_unmasked": [("const bool diagonal = q0 < k0 + Cfg::kBlockN;", "const bool diagonal = q0 < k0;")],
    # dQ turns broken: the writer adds without waiting for the key tiles above it
    "turn_order_broken": [("if (lane == 0) cuda::wait_flag_at_least(turn, my_turn);",
                           "if (lane == 0) cuda::wait_flag_at_least(turn, 0);")],
    # the highest key tile of a query tile adds to dq_acc (never written: NaN) instead of writing it
    "dq_first_adds": [("if (my_turn > 0) cuda::bulk_reduce_add_f32", "if (my_turn >= 0) cuda::bulk_reduce_add_f32")],
    # the writer counts its turn and frees the buffer before its bulk reductions completed
    "dq_release_before_complete": [("        cuda::bulk_wait_group<0>();           // this lane's rows are in dq_acc",
                                    "        // (no wait)                          this lane's rows are in dq_acc")],
    # the writer frees the consumer's buffer before its bulk copies have read it
    "dq_free_before_read": [("        cuda::bulk_wait_group_read<0>();      // this lane's rows are read from the buffer:\n"
                             "        cuda::mbarrier_arrive(&dq_empty[c]);  // the consumer may refill it while the adds complete\n",
                             "        cuda::mbarrier_arrive(&dq_empty[c]);\n")],
    # the consumers' dQ stores not made visible to the async proxy before the writer's bulk reductions read them
    "dq_no_proxy_fence": [("      cuda::fence_proxy_async_shared();  // the writer's bulk reductions (async proxy) read these stores\n", "")],
    # the writer sends a consumer's dQ buffer before the consumer filled it (the wrong dq_full parity)
    "dq_full_parity": [("cuda::mbarrier_wait(&dq_full[c], (j / Cfg::kConsumers) & 1);",
                        "cuda::mbarrier_wait(&dq_full[c], ((j / Cfg::kConsumers) & 1) ^ 1);")],
    # a consumer refills its dQ buffer without waiting for the writer to have sent the last share
    "dq_buffer_no_wait": [("      cuda::mbarrier_wait_untimed(&dq_empty[c], ((j / Cfg::kConsumers) & 1) ^ 1);\n", "")],
    # the swizzle of the K/V A-fragment loads forgotten
    "ldmatrix_no_swizzle": [("const int chunk = (2 * (kk0 + kk) + (lane >> 4)) ^ (row & 7);",
                             "const int chunk = (2 * (kk0 + kk) + (lane >> 4));")],
    # the transposed dS loads swapped (queries and keys confused)
    "ds_ldmatrix_not_transposed": [("cuda::ldmatrix_x4_trans(a[kk], sds", "cuda::ldmatrix_x4(a[kk], sds")],
    # S^T used before its wgmma retired (no wait)
    "missing_s_wait": [("        cuda::wgmma_wait_group<1>();  // S^T\n", "")],
    # dS^T computed from dP^T before its wgmma retired
    "missing_dp_wait": [("        cuda::wgmma_wait_group<0>();  // dP^T\n", "")],
    # expect_tx announces half of Q's and dO's bytes
    "expect_tx_short": [("cuda::mbarrier_arrive_expect_tx(&full[s], 2 * Cfg::kQTileBytes);",
                         "cuda::mbarrier_arrive_expect_tx(&full[s], Cfg::kQTileBytes);")],
    # lse taken as log2 already (the log2 e factor dropped)
    "lse_scale_wrong": [("sLse(s)[r] = in ? lse_bh[q0 + r] * cuda::kLog2e : INFINITY;",
                         "sLse(s)[r] = in ? lse_bh[q0 + r] : INFINITY;")],
    # the consumers ask for more registers than the producer gave back: the second one's inc never returns
    "setmaxnreg_above_pool": [("cuda::setmaxnreg_inc<Cfg::kConsumerRegs>();",
                               "cuda::setmaxnreg_inc<Cfg::kConsumerRegs + 8>();")],
    # the producer's dec after warps 1-3 returned: not every thread of the warpgroup executes it
    "setmaxnreg_after_return": [("    cuda::setmaxnreg_dec<Cfg::kProducerRegs>();  // the whole warpgroup, before any of its warps returns\n", ""),
                                ("    if (warp != 0) return;\n    const int q_col",
                                 "    if (warp != 0) return;\n    cuda::setmaxnreg_dec<Cfg::kProducerRegs>();\n    const int q_col")],
    # consumer 0 skips its diagonal tile too: wrong dK/dV, and tile 0's dQ share read from an unwritten half
    "masked_skip_off_by_one": [("const bool computes = j >= c;", "const bool computes = j > c;")],
    # the dQ share reads consumer 1's half of dS^T on the tile where consumer 1 skipped (never written)
    "dq_reads_skipped_half": [("      if (j > 0) {\n        load_ds_a(da[1]", "      if (j >= 0) {\n        load_ds_a(da[1]")],
    # the consumer without the dQ share releases the stage and P^T, dS^T before dV and dK retired
    "dvdk_wait_missing": [("      cuda::wgmma_wait_group<0>();  // dV, dK\n", "")],
    # the dQ consumer's wait retires neither group: the stage is released while dV and dK still read it
    "dq_share_wait_2": [("cuda::wgmma_wait_group<1>();  // dV and dK (the older group)",
                         "cuda::wgmma_wait_group<2>();  // dV and dK (the older group)")],
    # K and V announce more bytes than land: the consumers' untimed kv_full wait never returns, and the
    # launch must still end (the producer's bounded waits, its watchdog among them, trap)
    "kv_expect_tx_long": [("cuda::mbarrier_arrive_expect_tx(kv_full, 2 * Cfg::kKvTileBytes);",
                           "cuda::mbarrier_arrive_expect_tx(kv_full, 2 * Cfg::kKvTileBytes + 16);")],
}

# ---- gemm.cu: the hand GEMM's mma.sync kernel (cp.async pipeline; the default off compute capability 9.0),
# through tests/gpu/test_gemm.cpp (its [mma.sync] variants on the emulated 9.0 device) ----------------------
GEMM_MMA = {
    # waits for one cp.async group too few: the tile about to be read has not landed
    "cp_wait_one_short": [("    cp_async_wait<kStages - 2>();\n    __syncthreads();  // tile kt visible",
                           "    cp_async_wait<kStages - 1>();\n    __syncthreads();  // tile kt visible")],
    # no barrier between the landing of tile kt and its use (and the refill of the stage read last)
    "no_barrier_in_mainloop": [("    __syncthreads();  // tile kt visible to all; everyone is done with the buffer refilled next\n", "")],
    # B from an [n][k] tile: the four 8x8 matrices taken in the wrong order
    "b_nk_matrix_order": [("const int row = nbase + mat_row + (mat >> 1) * 8, chunk = kk / 8 + (mat & 1);",
                           "const int row = nbase + mat_row + (mat & 1) * 8, chunk = kk / 8 + (mat >> 1);")],
    # A from a [k][m] tile (transposed A): the four matrices in the wrong order
    "a_km_matrix_order": [("const int row = kk + mat_row + (mat >> 1) * 8, chunk = (mbase + (mat & 1) * 8) / 8;",
                           "const int row = kk + mat_row + (mat & 1) * 8, chunk = (mbase + (mat >> 1) * 8) / 8;")],
    # the B fragments of two adjacent n-tiles crossed
    "b_fragment_swap": [("bfr[2 * np][0] = r[0], bfr[2 * np][1] = r[1], bfr[2 * np + 1][0] = r[2]",
                         "bfr[2 * np][0] = r[0], bfr[2 * np][1] = r[2], bfr[2 * np + 1][0] = r[1]")],
    # accumulator rows g+8 staged at g+4
    "epilogue_row_half": [("*reinterpret_cast<float2*>(sc + (r + 8) * Cfg::kCStride + c)",
                           "*reinterpret_cast<float2*>(sc + (r + 4) * Cfg::kCStride + c)")],
    # the staging tile read before every warp wrote its accumulators
    "no_barrier_before_epilogue": [("  __syncthreads();\n\n  // A warp finishes one 128-column row segment",
                                    "\n  // A warp finishes one 128-column row segment")],
    # the next tile loaded into the stage being read (the ring's index one off)
    "refill_current_stage": [("if (kt + kStages - 1 < k_tiles) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);",
                              "if (kt + kStages - 1 < k_tiles) load_stage(kt % kStages, kt + kStages - 1);")],
    # (Not a mutant: dropping the cp_async_wait<0>() before the epilogue. The groups still open there are
    # the empty ones committed after the last load, so it changes nothing; the emulator agrees.)
    # a split's K range one short (mma.sync and the fp32 SIMT kernel): the last k of each split is never multiplied
    "splitk_range_short": [("  const int k_end = min(p.K, k_begin + p.k_per_split);\n  const int k_tiles = k_end > k_begin ? static_cast<int>(ceil_div(k_end - k_begin, kBK)) : 0;\n  // Fused bias gradient",
                            "  const int k_end = min(p.K, k_begin + p.k_per_split - 1);\n  const int k_tiles = k_end > k_begin ? static_cast<int>(ceil_div(k_end - k_begin, kBK)) : 0;\n  // Fused bias gradient", 2)],
}

# ---- attention.cu: the default attention (mma.sync forward, recompute-dq, accumulate-dq and store-ds backward) ----
ATTENTION_MMA = {
    # forward: the causal mask lets one future key in
    "fwd_mask_off_by_one": [("if (col > row || col >= T_) s[mt][nb][e] = -INFINITY;",
                             "if (col > row + 1 || col >= T_) s[mt][nb][e] = -INFINITY;")],
    # forward (and recompute-dq's dQ kernel, which loads K, V the same way): the current K, V stage read
    # before its cp.async group landed
    "fwd_wait_short": [("      cp_async_commit();\n      cp_async_wait<1>();\n    } else {\n      cp_async_wait<0>();\n    }\n    __syncthreads();\n    const bf16* cK",
                        "      cp_async_commit();\n      cp_async_wait<2>();\n    } else {\n      cp_async_wait<0>();\n    }\n    __syncthreads();\n    const bf16* cK", 2)],
    # forward: the next iteration refills the stage other warps still read
    "fwd_no_barrier_after_tile": [("    __syncthreads();  // all warps are done with `stage` before the next iteration refills it\n", "")],
    # P as the A operand: its first two registers crossed (rows g and g+8)
    "acc_to_a_swap": [("  a[0] = pack_bf16x2(lo[0], lo[1]);\n  a[1] = pack_bf16x2(lo[2], lo[3]);",
                       "  a[0] = pack_bf16x2(lo[2], lo[3]);\n  a[1] = pack_bf16x2(lo[0], lo[1]);")],
    # B from a [k][n] tile (V, K in dQ) loaded without the transpose
    "b_kn_not_transposed": [("ldmatrix_x4_trans(r, tile + (lane & 15) * kPitch + (lane >> 4) * 8);",
                             "ldmatrix_x4(r, tile + (lane & 15) * kPitch + (lane >> 4) * 8);")],
    # backward: the causal mask lets one future key in
    "bwd_mask_off_by_one": [("if (kMasked && (col > row || col >= T_)) p = 0.0f;",
                             "if (kMasked && (col > row + 1 || col >= T_)) p = 0.0f;")],
    # backward (dQ): a warp of a query tile (the last one at hs <= 96) takes the unmasked copy on its diagonal key tile
    "bwd_dq_diagonal_unmasked": [("if (k0 + kBN - 1 > wq0 || k0 + kBN > T_)\n        score_grads(std::true_type{});",
                                  "if (k0 + kBN - 1 > wq0 + 15 || k0 + kBN > T_)\n        score_grads(std::true_type{});")],
    # backward (dK, dV): the first warp of a key tile takes the unmasked copy on its diagonal query tile
    "bwd_dkdv_diagonal_unmasked": [("if (qs0 < wk0 + 15 || qs0 + kBM > T_)\n        probabilities_and_grads",
                                    "if (qs0 < wk0 || qs0 + kBM > T_)\n        probabilities_and_grads")],
    # backward (dK, dV): the current Q, dO stage read before its cp.async group landed
    "bwd_wait_short": [("      cp_async_commit();\n      cp_async_wait<1>();\n    } else {\n      cp_async_wait<0>();\n    }\n    __syncthreads();\n    const bf16* cQ",
                        "      cp_async_commit();\n      cp_async_wait<2>();\n    } else {\n      cp_async_wait<0>();\n    }\n    __syncthreads();\n    const bf16* cQ")],
    # accumulate-dq: a key tile adds its dQ share without waiting for its turn
    "dq_turn_not_waited": [("if (threadIdx.x == 0) cuda::wait_flag_at_least(turn, my_turn);",
                            "if (false && threadIdx.x == 0) cuda::wait_flag_at_least(turn, my_turn);")],
    # accumulate-dq: dS^T read by the dQ product before every warp wrote its rows
    "dq_no_barrier_before_ds": [("  __syncthreads();                                        // every warp's dS^T rows are in sdS\n", "")],
    # store-ds: a warp with no visible (query, key) pair leaves its dS^T rows unwritten (keys >= T: the dQ
    # launch reads the poisoned scratch there)
    "ds_rows_not_zeroed": [("      put_ds_rows(nullptr);  // no visible", "      (void)0;  // no visible")],
    # store-ds: every query tile of a key tile stores its dS^T into the diagonal tile (the others are read unwritten)
    "ds_tile_index_off": [("DsTiles::tile(b * NH + h, kt, qs0 / DsTiles::kSide, T_)", "DsTiles::tile(b * NH + h, kt, kt, T_)")],
    # store-ds (dQ): every key step of a 64-key tile reads the tile's first dS^T rows (hs = 128: 32-key steps)
    "ds_dq_key_offset_dropped": [("ds + DsTiles::tile(head, k0 / DsTiles::kSide, qt, T_) + (k0 % DsTiles::kSide) * DsTiles::kSide);",
                                  "ds + DsTiles::tile(head, k0 / DsTiles::kSide, qt, T_));")],
    # store-ds (dQ): the current stage read before its cp.async group landed
    "ds_dq_wait_short": [("      load(kt + 1, stage ^ 1);\n      cp_async_wait<1>();", "      load(kt + 1, stage ^ 1);\n      cp_async_wait<2>();")],
    # store-ds (dQ): the next iteration refills the stage other warps still read
    "ds_dq_no_barrier_after_tile": [("    __syncthreads();  // every warp is done with `stage` before the next iteration refills it\n", "")],
    # store-ds (dQ): the diagonal key tile left out of the sum
    "ds_dq_skips_diagonal": [("  for (int kt = 0; kt < n_kt; ++kt) {\n    const int stage = kt & 1;\n    if (kt + 1 < n_kt) {\n      load(",
                              "  for (int kt = 0; kt < n_kt - 1; ++kt) {\n    const int stage = kt & 1;\n    if (kt + 1 < n_kt) {\n      load(")],
}

# ---- attention_bwd_sm90.cu under kWgmmaStoreDs: the dS^T writer warp (through the GPU test suite's
# AttentionWgmmaStoreDs cases, as the default path's kernels; the scratch is poisoned with NaN) ----------
ATTENTION_BWD_STOREDS = {
    # consumer 1's half of dS^T is never copied out (its tiles are read unwritten)
    "writer_skips_half1": [("          if (half > j) continue;", "          if (half > 0) continue;")],
    # each half's destination stays at its diagonal tile: every query tile lands there
    "writer_does_not_advance": [("          dst[half] += DsTiles::kElems;\n", "")],
    # half 1 is copied to key block 2 kt's row of tiles (one tile to the right of half 0's)
    "writer_half1_wrong_row": [("DsTiles::tile(head, 2 * kt + half, 2 * kt + half, T_)", "DsTiles::tile(head, 2 * kt, 2 * kt + half, T_)")],
    # rows 32..63 of each half are never copied
    "writer_rows_half": [("          for (int r = 0; r < Cfg::kWgKeys; r += 32)", "          for (int r = 0; r < 32; r += 32)")],
    # ds_empty expects the reader's 128 arrivals, as with the dQ share: the writer's 32 never complete a phase,
    # the consumers wait for tile j + 2's buffer forever (the watchdog traps)
    "writer_empty_count": [("kStoreDs ? 32 : Cfg::kWarpgroupThreads", "Cfg::kWarpgroupThreads")],
    # the consumers' dS^T stores not made visible to the async proxy before the writer's bulk copies read them
    "ds_no_proxy_fence": [("      if constexpr (kStoreDs) cuda::fence_proxy_async_shared();  // the writer's bulk copies (async proxy) read it\n", "")],
}

# ---- attention_decode.cu: one query row against the key/value cache (generation) ------------------------
ATTENTION_DECODE = {
    # a warp reads cache position len, which is not written yet (the test poisons it with NaN when len < maxT)
    "reads_position_len": [("for (int t = warp; t < len; t += kWarps) {", "for (int t = warp; t <= len; t += kWarps) {")],
    # the online softmax does not rescale the running sum of values when the maximum grows
    "no_rescale": [("acc[i] = acc[i] * correction + (d < hs", "acc[i] = acc[i] + (d < hs")],
    # the merge reads the other warps' partial results before they are written
    "no_barrier_before_merge": [("  }\n  __syncthreads();\n\n  // Merge in warp order", "  }\n\n  // Merge in warp order")],
    # the merge adds the warps' sums without their exp(m_w - m_all) weights
    "merge_sum_unweighted": [("sum += warp_l[w] * wgt;", "sum += warp_l[w];")],
    # the warps' positions overlap: every 7th position is counted twice
    "positions_overlap": [("for (int t = warp; t < len; t += kWarps) {", "for (int t = warp; t < len; t += kWarps - 1) {")],
    # the warps' partial sums are written only for the head dimensions of the first lane group (d < 32)
    "partial_acc_written": [("    if (d < hs) warp_acc[warp][d] = acc[i];", "    if (d < hs && i == 0) warp_acc[warp][d] = acc[i];")],
}


# ---- the training code's ordering between streams and the host (src/, through train_emu.py --streams with
# EMU_ASYNC_STREAMS=1: on a GPU each is a race that gives wrong gradients only when the timing is unlucky) ----
NCCL_COMM = {
    # a bucket's collective may start before backward has written the bucket's gradients
    "collective_before_grads": [("    CUDA_CHECK(cudaStreamWaitEvent(state_.stream(), ready_.get(), 0));\n", "")],
    # an all-reduce's completion event is recorded before its call has settled (ncclInProgress: the nonblocking
    # communicator has not put it on the stream yet), so the optimizer does not wait for it
    "event_before_settled": [('  if (state_->in_progress(rc, "ncclAllReduce")) settle(seq);\n  req->enqueued();\n',
                              '  req->enqueued();\n  if (state_->in_progress(rc, "ncclAllReduce")) settle(seq);\n',
                              2)],
    # (Not a mutant: on_complete()'s stream wait. DeviceGradReducer::finish() waits on the host for every
    # bucket before the optimizer is enqueued, so without the wait nothing changes.)
}
DEVICE_REDUCER = {
    # the host-staged path copies the gradients down before backward has finished writing them
    "download_before_backward": [(
        "  CUDA_CHECK(cudaStreamSynchronize(compute_));  // backward done: what follows is all communication\n", "")],
    # the averaged gradients go back up from pageable memory; the optimizer may run before they land
    "optimizer_before_upload": [("  CUDA_CHECK(cudaDeviceSynchronize());\n  return t.ms();", "  return t.ms();")],
}
MODEL_CUDA = {
    # ZeRO-1: a layer's forward may read parameters that the previous step's all-gather has not brought yet
    "forward_before_params": [(
        "        CUDA_CHECK(cudaStreamWaitEvent(stream_, a.ready, 0));\n",
        "")],
    # gradient accumulation: a micro-step's tokens overwrite the staging buffer the previous one's copy reads
    "staging_reused_early": [("    CUDA_CHECK(cudaEventSynchronize(staging_free_->get()));\n", "")],
    # --cuda-graph: the micro-step that captures the graph does not launch it (capture only records the work)
    "captured_step_not_run": [("      graphs_.push_back({key, capture(device_work)});\n      hit = graphs_.end() - 1;",
                               "      graphs_.push_back({key, capture(device_work)});\n      return;")],
    # --cuda-graph: a synchronisation inside the captured micro-step (harmless eagerly; CUDA refuses it while
    # the stream is captured, so the capture fails and the run stops with the error)
    "sync_inside_capture": [("    forward(B, T_);\n    const double N = static_cast<double>(B) * T_;\n",
                             "    forward(B, T_);\n    CUDA_CHECK(cudaStreamSynchronize(stream_));\n"
                             "    const double N = static_cast<double>(B) * T_;\n")],
    # (Not a mutant: capturing without the eager warm-up. On the hand GEMM path nothing the first micro-step
    # does is refused during capture (the emulator invalidates a capture that allocates or synchronises), so
    # the bits are the same and only the emulator's launch count differs; the warm-up is for cuBLASLt.)
}


MUTATIONS = {"attention": ATTENTION, "attention_bwd": ATTENTION_BWD, "gemm": GEMM, "gemm_mma": GEMM_MMA,
             "attention_mma": ATTENTION_MMA, "attention_bwd_storeds": ATTENTION_BWD_STOREDS,
             "attention_decode": ATTENTION_DECODE, "nccl_comm": NCCL_COMM,
             "device_reducer": DEVICE_REDUCER, "model_cuda": MODEL_CUDA}
# The file each kernel's mutations apply to, relative to the repository (emu.sh's src_of asks here).
SOURCES = {"attention": "kernels/attention/attention_sm90.cu", "attention_bwd": "kernels/attention/attention_bwd_sm90.cu",
           "gemm": "kernels/gemm/gemm_sm90.cu", "gemm_mma": "kernels/gemm/gemm.cu",
           "attention_mma": "kernels/attention/attention.cu", "attention_decode": "kernels/attention/attention_decode.cu",
           "attention_bwd_storeds": "kernels/attention/attention_bwd_sm90.cu",
           "nccl_comm": "src/comm/nccl_communicator.cpp", "device_reducer": "src/comm/device_reducer.cpp",
           "model_cuda": "src/model/gpt2_cuda.cu"}


def mutate(base, name, replacements):
    """base with the mutation's replacements made; an error naming the pattern if one matches other than its
    expected number of times (a third element: that count, all replaced; one otherwise) or changes nothing."""
    text = base
    for old, new, *times in replacements:
        n = text.count(old)
        if n != (times[0] if times else 1):
            raise ValueError(f"mutation {name}: pattern found {n} times:\n{old}")
        text = text.replace(old, new)
    if text == base:
        raise ValueError(f"mutation {name} changes nothing")
    return text


def check(repo):
    """Every mutation of every kernel against the repository's sources, nothing written: run by CI
    (lint.emu_mutants) so that a kernel change that moves a pattern fails there, not when someone next runs
    emu.sh --mutants (a GEMM change of 2026-11-27 left 5 of its 23 mutants stale until 2026-11-28)."""
    stale = []
    total = 0
    for kernel, table in MUTATIONS.items():
        base = open(os.path.join(repo, SOURCES[kernel])).read()
        for name, replacements in table.items():
            total += 1
            try:
                mutate(base, name, replacements)
            except ValueError as e:
                stale.append(f"{kernel}/{e}")
    for s in stale:
        print("STALE", s)
    print(f"{total - len(stale)} of {total} mutations of {len(MUTATIONS)} files apply to the sources")
    return 1 if stale else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2]))
    if len(sys.argv) == 3 and sys.argv[1] == "--source" and sys.argv[2] in SOURCES:
        print(SOURCES[sys.argv[2]])
        return
    if len(sys.argv) < 4 or sys.argv[1] not in MUTATIONS:
        sys.exit("usage: mutate.py " + "|".join(MUTATIONS) + " SRC OUT_DIR [NAME ...]\n"
                 "       mutate.py --check REPO      every mutation against the repository's sources\n"
                 "       mutate.py --source KERNEL   the file KERNEL's mutations apply to")
    table = MUTATIONS[sys.argv[1]]
    base = open(sys.argv[2]).read()
    out = sys.argv[3]
    os.makedirs(out, exist_ok=True)
    for name in sys.argv[4:] or list(table):
        try:
            text = mutate(base, name, table[name])
        except ValueError as e:
            sys.exit(str(e))
        open(os.path.join(out, name + ".cu"), "w").write(text)
        print(name)


if __name__ == "__main__":
    main()
