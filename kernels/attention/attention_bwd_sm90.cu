// The Hopper backward of causal attention (bf16, hs = 64, compute capability 9.0, sm_90a code), in
// FlashAttention-3's structure: dK, dV and dQ from 5 matrix products per (key tile, query tile), no dQ
// recompute.
//
//   TMA (K, V once; Q, dO per query tile) --kv_full, full[s]--> 2 consumer warpgroups (64 keys each)
//        ^                                                                   |         |
//        +------------------------------ empty[s] --------------------------+         | dQ share
//                                                                   dq_empty[c]         v dq_full[c]
//   dq_acc <--bulk reduce-add, in the key tile's turn (dq_turns)-- dQ writer warp <-----+
//
//  * One block per (key tile of 128 keys, head, batch), taken from a ticket (as attention.cu's
//    attention_bwd_tc_accumulate_dq: dq_turns.cuh's order, so the key tiles whose dQ turns come before
//    this block's have started when it starts). Warpgroup 2 is the producer: one thread issues the TMA
//    copies (K and V of the key tile once; Q and dO of each 64-row query tile into a 2-stage ring), and
//    its first warp copies the tile's lse (times log2 e) and D rows into the stage with plain stores
//    before arriving on the same barrier. Its second warp is the dQ writer (below).
//    Warpgroups 0 and 1 are the consumers, 64 keys each; they take turns at the dQ share (by query tile).
//  * Registers: the producer gives its registers to the consumers (setmaxnreg: 24 for it, 240 for each
//    consumer; WgmmaBwdConfig). The consumers' barrier waits therefore have no time bound (ptx.cuh,
//    mbarrier_wait_untimed), and the producer's first warp is the watchdog: it waits, bounded, for their
//    release of the last stages and for the block's last dQ turn, so a phase or a turn that never
//    completes still ends the launch with a trap.
//  * Per query tile the consumer computes, keys on the accumulator rows (m64n64, 32 fp32 registers each):
//      S^T  = K Q^T                 A = its 64 K rows (registers, ldmatrix), B = Q (smem, K-major)
//      dP^T = V dO^T                A = its 64 V rows (registers, ldmatrix), B = dO (smem, K-major)
//      P^T  = exp2(S^T scale_log2 - lse log2 e), causal mask;  dS^T = P^T (dP^T - D)
//      dV  += P^T dO, dK += dS^T Q  A = P^T / dS^T packed to bf16 from the accumulators, B MN-major
//    writes dS^T (bf16) to shared memory, and computes the tile's share of dQ over the block's keys,
//      dQ_part = dS K               A = dS (registers, ldmatrix.trans of dS^T), B = K (smem, MN-major)
//    (consumer j % 2 for tile j: issued behind dV and dK; wait_group 1 retires those and releases the
//    stage while the dQ products run; the dS^T buffer is released once loaded), which it stores,
//    fp32, into its dQ buffer in shared memory (dq_full[c]) and goes on to the next tile.
//    The dQ writer warp adds it to the fp32 accumulator dq_acc in this key tile's turn: dq_turns counts
//    the key tiles done with a query tile, highest key tile first; key tile kt waits for dq_turn(kt, qt),
//    writes (a turn of 0) or adds, one bulk copy or bulk reduce-add per 256-byte row, frees the buffer
//    (dq_empty[c]) once they have read it, waits for them to complete and counts itself (dq_turns.cuh,
//    shared with attention.cu's bwd_add_dq_share; attention_bwd_store_dq scales dq_acc to bf16
//    afterwards). Deterministic: one block adds to a row at a time, in a fixed order; the waits only go
//    to higher key tiles, which started earlier, so they cannot deadlock. Until 2026-11-27 the consumer
//    itself waited for the turn and added with plain loads and stores, the whole warpgroup held at a
//    named barrier (ncu on the H200: the kernel issued on 13% of cycles, its top stalls "barrier" and
//    "long_scoreboard").
//  * kStoreDs (AttentionBackwardPath::kWgmmaStoreDs, the kernel's other instantiation): no dQ share, turns
//    or ticket. The consumers run 4 products a tile and leave dS^T in its buffer; the producer's second
//    warp copies it to the scratch's causal tiles (ds_tiles.cuh) and attention.cu's dQ-from-dS launch sums
//    dQ afterwards. Blocks take their key tile from blockIdx, heaviest first (see the kernel).
//  * Every product is the register-A wgmma m64n64k16 of ptx.cuh (there is no m64n64 SS wrapper): the A
//    operands that do not come out of an accumulator (K, V, dS) are loaded by ldmatrix. dS reaches wgmma
//    through registers, so wgmma needs no generic-to-async proxy fence: the shared memory it reads is
//    written by TMA alone. The one generic-to-async hand-off is the dQ buffer (the consumers' stores, the
//    writer's bulk reductions), fenced by the consumers before they arrive on dq_full; under kStoreDs the
//    dS^T buffer too (the consumers' stores, the dS^T writer's bulk copies), fenced before ds_full.
//  * Out of bounds rows (keys or queries past T) come in as zeros from TMA (rank-3 maps, (cols, T, B)):
//    keys past T are masked by causality (every valid query is before them); queries past T get lse =
//    +inf, so P^T = 0 there, and their dQ rows are not stored.
//
// Verified on the H200 (2026-11-27: its tests, synccheck and racecheck; 0.96x of the default end to end,
// docs/performance.md) before the dQ writer and the overlapped products came in (the same day, checked on
// the CPU emulator only so far; from the second of those changes until 2026-11-29 ptxas serialized every
// wgmma of the kernel, C7520, which tools/ptxas_guard.sh now turns into a build error). It runs only when
// asked for: GPT2_ATTENTION_BWD=wgmma (or wgmma-store-ds, kStoreDs: written 2026-12-02, emulator only so
// far) or attention_set_backward_path (attention_cuda.hpp). tests/emu runs its source on the CPU.
//
// Layout facts (attention_sm90.cu and kernels/gemm/gemm_sm90.cu have the sources):
//  * Every tile is token rows x 64 dims of bf16 = 128 bytes a row, written by TMA as 64-row boxes with the
//    128-byte swizzle (8-row, 1024-byte atoms; 16-byte chunk c of row r at chunk c ^ (r % 8)); tiles are
//    1024-aligned. Every tile is one 64-row box.
//  * B operands: K-major (Q, dO as B of S^T, dP^T): SBO = 1024, LBO unused, the k16 step adds 32 bytes.
//    MN-major (dO, Q as B of dV, dK; K as B of dQ): SBO = 1024 (8 token rows), LBO = the next 64-wide N
//    block (there is none: set to a tile's size), the k16 step adds 16 rows = 2048 bytes, transpose
//    immediate 1.
//  * Register A (ptx.cuh, wgmma_m64n64k16_bf16_rs) is mma.sync's A fragment per warp, so ldmatrix.x4
//    fills it: K, V rows from the swizzled tiles (non-transposed), dS from the [key][query] dS^T tile
//    (transposed; a padded pitch of 72, as attention.cu's sdS). An m64n64 accumulator's registers
//    8j..8j+7 are the A fragment of its columns 16j..16j+15 once packed (as the forward's P).
//  * Barrier phases: query tile j uses stage j % 2; consumers wait full for parity (j / 2) & 1, the
//    producer waits empty for the opposite parity (a fresh barrier passes at once). full counts the 32
//    lanes of the producer's first warp (lane 0's arrive carries the expect_tx of Q and dO); empty counts
//    the 256 consumer threads, each arriving after the wgmma.wait_group that retires dV and dK (the last
//    readers of the stage's Q and dO) and after its own lse/D reads.
//  * dS^T is double-buffered (query tile j in buffer j % 2, its use j / 2 the barriers' parity): a warp
//    may write tile j + 1's while another still reads tile j's for dQ. ds_full[i] counts the 256
//    consumer threads once they have stored their part (or skipped it), and the reader waits on it;
//    ds_empty[i] counts the reader's 128 threads once they have loaded it (kStoreDs: the dS^T writer's 32
//    lanes once their bulk copies have read it), and tile j + 2's writers wait on it. Every thread
//    arrives for its own accesses: compute-sanitizer's racecheck credits an mbarrier arrive only to the
//    arriving thread (it reported the reads of lse/D released by lane 0 after __syncwarp, and the dS^T
//    hand-off across a 256-thread named barrier, on the H200, 2026-11-27, though the PTX memory model
//    orders both). The writer's lanes each arrive on dq_empty after their own bulk
//    copies have read the buffer; its turn is acquired and released by lane 0 alone, for the warp
//    (__syncwarp orders the lanes), in global memory, which racecheck does not look at.
//
// Left for later (docs/performance.md): 128-query tiles, the dQ share as an SS wgmma from a swizzled dS^T
// (needs an m64n64 SS wrapper in ptx.cuh and a proxy fence).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/attention/attention_sm90.cuh"
#include "kernels/attention/dq_turns.cuh"
#include "kernels/attention/ds_tiles.cuh"
#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90a_host.cuh"

namespace gpt2::kernels::attention_detail {

namespace {

using bf16 = __nv_bfloat16;

// Launch configuration (named data; the reasons in the comments).
struct WgmmaBwdConfig {
  static constexpr int kHeadDim = kWgmmaHeadSize;  // 64 bf16 = 128 bytes: one swizzle row per token
  // Two consumer warpgroups, 64 keys each. A consumer needs about 210 registers without spilling (dK, dV
  // 64 + S^T, dP^T 64 + fragments and addresses), more than the 168 that __launch_bounds__(384, 1) gives
  // every thread (with 168, ptxas spilled and serialized the wgmma: C7512). So the producer, which only
  // issues copies, gives its registers to the consumers with setmaxnreg (ptx.cuh): 24 + 2 x 240 = 3 x 168.
  static constexpr int kConsumers = 2;
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kConsumerThreads = kWarpgroupThreads * kConsumers;
  static constexpr int kThreads = kConsumerThreads + kWarpgroupThreads;  // the producer warpgroup last
  static constexpr int kEntryRegs = 65536 / kThreads / 8 * 8;            // the launch bound's cap: 168
  static constexpr int kProducerRegs = 24;                               // setmaxnreg's least
  static constexpr int kConsumerRegs = 240;
  static constexpr int kWgKeys = 64;                      // one wgmma M of keys per consumer
  static constexpr int kBlockN = kWgKeys * kConsumers;    // 128 keys a block
  static constexpr int kBlockM = 64;                      // queries a tile: every product is m64n64, 32 registers
  static constexpr int kWgmmaK = 16;
  static constexpr int kStages = 2;                       // Q, dO of tile j + 1 load while tile j is used
  static constexpr int kRowBytes = kHeadDim * 2;          // 128
  static constexpr int kBoxRows = 64;                     // one TMA box: 64 rows x 64 dims = 8 KB
  static constexpr int kBoxBytes = kBoxRows * kRowBytes;
  static constexpr int kKvTileBytes = kBlockN * kRowBytes;  // 16 KB: K or V, two boxes
  static constexpr int kQTileBytes = kBlockM * kRowBytes;   // 8 KB: Q or dO, one box
  static constexpr int kDsPitch = kBlockM + 8;              // bf16; 144-byte rows spread ldmatrix over banks
  static constexpr int kDsBytes = kBlockN * kDsPitch * 2;
  static constexpr int kAlign = 1024;                       // swizzle atoms start 1024-aligned
  // offsets from the aligned base
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKvTileBytes;
  static constexpr int kOffQ = kOffV + kKvTileBytes;                   // stage s at + s * kQTileBytes
  static constexpr int kOffDo = kOffQ + kStages * kQTileBytes;
  static constexpr int kOffDs = kOffDo + kStages * kQTileBytes;        // buffer i at + i * kDsBytes
  // The dQ shares on their way to dq_acc: one fp32 [query][dim] tile per consumer (consumer c takes the
  // tiles j with j % 2 == c), rows padded so that the accumulator's float2 stores of a half-warp (rows
  // g = 0..3, columns 2 tq) hit 16 different bank pairs (word 72 g + 2 tq: banks 8 g + 2 tq, +1; a pitch
  // of 68 would give 4 g + 2 tq, two-way conflicts); the writer sends it one 256-byte row per bulk
  // reduction.
  static constexpr int kDqPitch = kHeadDim + 8;                       // floats: 288-byte rows, 16-byte aligned
  static constexpr int kDqBytes = kBlockM * kDqPitch * 4;
  static constexpr int kOffDq = kOffDs + 2 * kDsBytes;                 // consumer c's at + c * kDqBytes
  static constexpr int kOffLse = kOffDq + kConsumers * kDqBytes;       // [stage][64] fp32, lse * log2 e
  static constexpr int kOffD = kOffLse + kStages * kBlockM * 4;        // [stage][64] fp32
  // kv_full, full[s], empty[s], ds_full[i], ds_empty[i], dq_full[c], dq_empty[c]
  static constexpr int kOffBar = kOffD + kStages * kBlockM * 4;
  static constexpr int kBarriers = 1 + 2 * kStages + 2 * 2 + 2 * kConsumers;
  static constexpr int kOffWork = kOffBar + kBarriers * 8;             // the block's ticket
  static constexpr size_t kSmemBytes = kAlign + kOffWork + 16;
  static_assert(kBlockN == kWgmmaBwdKeyTile, "the key tile attention_sm90.cuh announces");
  static_assert(kConsumers == 2 && kBlockN / 2 == kWgKeys, "the dQ share's two halves are the two consumers' keys");
  static_assert(kBlockN % kBlockM == 0, "a query tile starts inside one key tile");
  static_assert(kBlockM == kBoxRows, "Q, dO tiles are one box");
  static_assert(kHeadDim * 2 == 128, "one 128-byte swizzle row per token");
  static_assert(kQTileBytes % kAlign == 0 && kKvTileBytes % kAlign == 0, "1024-aligned tiles");
  static_assert(kDsBytes % 16 == 0 && kOffBar % 8 == 0, "aligned dS^T buffers and barriers");
  static_assert(kOffDq % 16 == 0 && (kDqPitch * 4) % 16 == 0, "bulk copies read 16-byte aligned rows");
  static_assert(kBlockM % 32 == 0, "the writer's lanes take the tile's rows in steps of 32");
  static_assert(kBlockM >= 16, "turn counters (attention.cu) are sized for query tiles of >= 16 rows");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared-memory limit per block");
  static_assert(kProducerRegs + kConsumers * kConsumerRegs == (1 + kConsumers) * kEntryRegs,
                "the warpgroups' setmaxnreg counts sum to the block's register pool (ptx.cuh, setmaxnreg_inc)");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using Bwd = WgmmaBwdConfig;
constexpr uint32_t kSbo = 1024;                  // 8 rows of 128 bytes
constexpr uint32_t kLboKMajor = 16;              // unused by K-major operands (encodes as 1)
constexpr uint32_t kLboMnMajor = Bwd::kKvTileBytes;  // the next 64-wide block of N: there is none
constexpr int kKSteps = Bwd::kHeadDim / Bwd::kWgmmaK;  // 4 k16 steps over the head dimension
constexpr int kQSteps = Bwd::kBlockM / Bwd::kWgmmaK;   // 4 k16 steps over a query tile
constexpr int kNSteps = Bwd::kBlockN / Bwd::kWgmmaK;   // k16 steps over the block's keys

__device__ __forceinline__ void fence_acc(float (&r)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) cuda::wgmma_fence_operand(r[i]);
}
template <int N>
__device__ __forceinline__ void fence_frags(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int kk = 0; kk < N; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) cuda::wgmma_fence_operand(r[kk][i]);
  }
}

// A fragments of this warp's 16 rows (row0 = the warpgroup's first) of a swizzled K or V tile, k16 steps
// kk0 .. kk0 + kSteps - 1 of the head dimension. Lane l addresses row (l % 16), 16-byte chunk 2kk + l / 16.
template <int kSteps>
__device__ __forceinline__ void load_rows_a(uint32_t (&a)[kSteps][4], const unsigned char* tile, int row0, int lane,
                                            int kk0) {
  const int row = row0 + (lane & 15);
  const unsigned char* r = tile + row * Bwd::kRowBytes;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const int chunk = (2 * (kk0 + kk) + (lane >> 4)) ^ (row & 7);
    cuda::ldmatrix_x4(a[kk], r + chunk * 16);
  }
}

// D (+)= A B^T over k16 steps kk0 .. kk0 + kSteps - 1 of the head dimension: A in registers, B = a K-major
// tile (Q or dO); kk0 == 0 starts D. Not committed.
template <int kSteps>
__device__ __forceinline__ void issue_rows_dot(float (&d)[32], uint32_t (&a)[kSteps][4], uint32_t b_base, int kk0) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint64_t db = cuda::wgmma_desc(b_base + (kk0 + kk) * 32, kLboKMajor, kSbo, cuda::WgmmaSwizzle::k128B);
    cuda::wgmma_m64n64k16_bf16_rs<0>(d, a[kk], db, (kk0 + kk) > 0 ? 1 : 0);
  }
}

// D += A B over kSteps k16 steps of tokens: A in registers, B = an MN-major token tile (dO, Q or K).
template <int kSteps>
__device__ __forceinline__ void issue_tokens_dot(float (&d)[32], uint32_t (&a)[kSteps][4], uint32_t b_base,
                                                 bool accumulate) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint64_t db =
        cuda::wgmma_desc(b_base + kk * Bwd::kWgmmaK * Bwd::kRowBytes, kLboMnMajor, kSbo, cuda::WgmmaSwizzle::k128B);
    cuda::wgmma_m64n64k16_bf16_rs<1>(d, a[kk], db, (accumulate || kk > 0) ? 1 : 0);
  }
}

// An m64n64 accumulator as bf16 A fragments of its 4 column blocks of 16.
__device__ __forceinline__ void pack_a(uint32_t (&a)[kQSteps][4], const float (&acc)[32]) {
#pragma unroll
  for (int kk = 0; kk < kQSteps; ++kk) {
    a[kk][0] = cuda::pack_bf16x2(acc[8 * kk + 0], acc[8 * kk + 1]);
    a[kk][1] = cuda::pack_bf16x2(acc[8 * kk + 2], acc[8 * kk + 3]);
    a[kk][2] = cuda::pack_bf16x2(acc[8 * kk + 4], acc[8 * kk + 5]);
    a[kk][3] = cuda::pack_bf16x2(acc[8 * kk + 6], acc[8 * kk + 7]);
  }
}

// Where this thread's accumulator elements are: register i is key row `key0 + 8 ((i / 2) % 2)` and query
// column `q0 + wgmma_acc_col(lane, i)`.
struct TileRows {
  int key0, lane;
};

// S^T -> P^T in place: masked (query < key) or exp2(S^T scale_log2 - lse log2 e). lse2 is the stage's row
// (+inf past T). Only tiles that start before the key tile ends can hold query < key: the others take a
// copy of the loop without the per-element compare and select (64 of the tile's ~600 instructions).
__device__ __forceinline__ void probabilities(float (&s)[32], const float* lse2, int q0, bool diagonal,
                                              const TileRows& w, float scale_log2) {
  auto exp_tile = [&](auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int col = cuda::wgmma_acc_col(w.lane, i);
      const int key = w.key0 + 8 * ((i / 2) % 2);
      const float p = cuda::ex2_approx_ftz(fmaf(s[i], scale_log2, -lse2[col]));
      s[i] = (kMasked && q0 + col < key) ? 0.0f : p;
    }
  };
  if (diagonal)
    exp_tile(std::true_type{});
  else
    exp_tile(std::false_type{});
}

// dP^T -> dS^T in place: P^T (dP^T - D).
__device__ __forceinline__ void score_grads(float (&dp)[32], const float (&p)[32], const float* d_row, int lane) {
#pragma unroll
  for (int i = 0; i < 32; ++i) dp[i] = p[i] * (dp[i] - d_row[cuda::wgmma_acc_col(lane, i)]);
}

// The packed dS^T fragments into the [key][query] tile: register kk, r holds key row 8 (r % 2) and query
// columns 16 kk + 8 (r / 2) + 2 tq, +1 of this thread's pair.
__device__ __forceinline__ void store_ds(bf16* sds, const uint32_t (&ds)[kQSteps][4], int key_row, int tq) {
#pragma unroll
  for (int kk = 0; kk < kQSteps; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      bf16* dst = sds + (key_row + 8 * (r % 2)) * Bwd::kDsPitch + 16 * kk + 8 * (r / 2) + 2 * tq;
      *reinterpret_cast<uint32_t*>(dst) = ds[kk][r];
    }
  }
}

// dS (this warp's 16 queries x the block's keys) as A fragments, from the [key][query] dS^T tile
// transposed on load: lanes 0-7 address (keys 0-7, queries 0-7), 8-15 (keys 0-7, queries 8-15), 16-23
// (keys 8-15, queries 0-7), 24-31 (keys 8-15, queries 8-15) of each k16 step.
__device__ __forceinline__ void load_ds_a(uint32_t (&a)[kNSteps / 2][4], const bf16* sds, int half, int warp,
                                          int lane) {
#pragma unroll
  for (int kk = 0; kk < kNSteps / 2; ++kk) {
    const int key = (half * kNSteps / 2 + kk) * 16 + (lane & 7) + ((lane >> 4) << 3);
    cuda::ldmatrix_x4_trans(a[kk], sds + key * Bwd::kDsPitch + warp * 16 + ((lane >> 3) & 1) * 8);
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The kernel's pointers and sizes (attention_bwd_wgmma's and attention_bwd_wgmma_store_ds's arguments).
struct WgmmaBwdArgs {
  bf16* dqkv;          // (B,T,3C): dK, dV written here
  float* dq_acc;       // (B,T,C) fp32: dQ summed in turn order (dq_turns.cuh); null under kStoreDs
  int* dq_turns;       // (B,NH,ceil(T/64)) zeroed: key tiles done per query tile; null under kStoreDs
  int* ticket;         // zeroed: the next (key tile, head, batch); null under kStoreDs
  bf16* ds;            // kStoreDs: the causal dS^T tiles (ds_tiles.cuh); null otherwise
  const float* lse;    // (B,NH,T), natural log
  const float* D;      // (B,NH,T) rowsum(dout * out)
  int T_, C, NH;
  float scale_log2, scale;
};

// kStoreDs (AttentionBackwardPath::kWgmmaStoreDs): no dQ share. The consumers leave dS^T in shared
// memory as before; the producer's second warp, the dS^T writer, copies each tile's two 64-key halves to
// their causal tiles of args.ds (DsTiles: bulk copies of 128-byte rows) and frees the buffer, and
// attention.cu's attention_bwd_tc_dq_from_ds sums dQ = dS K afterwards. The consumers then run 4 products
// a tile and never wait on another block: no turns, no dQ accumulator, no ticket (blockIdx, heaviest key
// tiles first). dK and dV are the same bits as without.
template <bool kStoreDs>
__global__ void __launch_bounds__(WgmmaBwdConfig::kThreads, 1)
    attention_bwd_wgmma_tma(const __grid_constant__ CUtensorMap tmap_qkv, const __grid_constant__ CUtensorMap tmap_dout,
                            const WgmmaBwdArgs args) {
  cuda::griddep_launch_dependents_then_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = WgmmaBwdConfig;
  const int T_ = args.T_, C = args.C, NH = args.NH;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((Cfg::kAlign - (cuda::smem_u32(smem_raw) % Cfg::kAlign)) % Cfg::kAlign);
  unsigned char* sK = smem + Cfg::kOffK;
  unsigned char* sV = smem + Cfg::kOffV;
  auto sQ = [&](int s) { return smem + Cfg::kOffQ + s * Cfg::kQTileBytes; };
  auto sDo = [&](int s) { return smem + Cfg::kOffDo + s * Cfg::kQTileBytes; };
  auto sDs = [&](int i) { return reinterpret_cast<bf16*>(smem + Cfg::kOffDs + i * Cfg::kDsBytes); };
  auto sLse = [&](int s) { return reinterpret_cast<float*>(smem + Cfg::kOffLse) + s * Cfg::kBlockM; };
  auto sD = [&](int s) { return reinterpret_cast<float*>(smem + Cfg::kOffD) + s * Cfg::kBlockM; };
  auto sDq = [&](int c) { return reinterpret_cast<float*>(smem + Cfg::kOffDq + c * Cfg::kDqBytes); };
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + Cfg::kOffBar);
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + Cfg::kStages;
  uint64_t* ds_full = empty + Cfg::kStages;  // dS^T buffer i holds both consumers' halves
  uint64_t* ds_empty = ds_full + 2;          // buffer i's reader has loaded it
  uint64_t* dq_full = ds_empty + 2;          // consumer c's dQ share is in its buffer
  uint64_t* dq_empty = dq_full + Cfg::kConsumers;  // the writer has added it to dq_acc
  int* work = reinterpret_cast<int*>(smem + Cfg::kOffWork);

  if (threadIdx.x == 0) {
    *work = kStoreDs ? static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))
                     : atomicAdd(args.ticket, 1);
    cuda::mbarrier_init(kv_full, 1);
    for (int s = 0; s < Cfg::kStages; ++s) {
      cuda::mbarrier_init(&full[s], 32);
      cuda::mbarrier_init(&empty[s], Cfg::kConsumerThreads);
    }
    for (int i = 0; i < 2; ++i) {
      cuda::mbarrier_init(&ds_full[i], Cfg::kConsumerThreads);
      cuda::mbarrier_init(&ds_empty[i], kStoreDs ? 32 : Cfg::kWarpgroupThreads);  // its reader: the writer warp
    }
    for (int c = 0; c < Cfg::kConsumers; ++c) {
      cuda::mbarrier_init(&dq_full[c], Cfg::kWarpgroupThreads);
      cuda::mbarrier_init(&dq_empty[c], 32);
    }
    cuda::fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on the roles run independently

  const int n_kv = static_cast<int>(gridDim.x);
  // kStoreDs: nothing waits on another block, so the heaviest key tiles go first across every head (key
  // tile 0 of every head, then key tile 1, ...), as tile_order.hpp orders the mma.sync kernels: the
  // lightest come last and fill the tail. With turns, the highest (lightest) key tile of a head must start
  // first (dq_turns.cuh).
  const int heads = NH * static_cast<int>(gridDim.z);
  const DqTurnWork w =
      kStoreDs ? DqTurnWork{*work / heads, (*work % heads) % NH, (*work % heads) / NH} : dq_turn_work(*work, n_kv, NH);
  const int kt = w.kt, h = w.h, b = w.b;
  const int k0 = kt * Cfg::kBlockN;
  const int nq = static_cast<int>(cuda::ceil_div(T_, Cfg::kBlockM));
  const int qt0 = k0 / Cfg::kBlockM;  // the first query tile that sees these keys
  const int n_tiles = nq - qt0;
  const int wg = threadIdx.x / Cfg::kWarpgroupThreads;
  const int tid_wg = threadIdx.x % Cfg::kWarpgroupThreads;
  const int warp = tid_wg / 32, lane = tid_wg % 32;

  if (wg == Cfg::kConsumers) {
    // ---- producer: its first warp; coordinates are {column, token, batch} ----
    cuda::setmaxnreg_dec<Cfg::kProducerRegs>();  // the whole warpgroup, before any of its warps returns
    if (kStoreDs && warp == 1) {
      // ---- the dS^T writer: each tile's halves to their DsTiles tiles (key block a, query block qt) ----
      // Half i is consumer i's 64 keys, key block a = 2 kt + i of DsTiles, whose tiles (a, a), (a, a + 1),
      // .. follow one another: each half's destination advances a tile per query tile. Consumer 1 skips
      // tile 0 (those keys all come after its queries) and DsTiles has no such tile. Lane l copies rows l and
      // l + 32 of each half. 24 registers (setmaxnreg): two pointers that advance, no index arithmetic.
      const int head = b * NH + h;
      bf16* dst[Cfg::kConsumers];
#pragma unroll
      for (int half = 0; half < Cfg::kConsumers; ++half)
        dst[half] = args.ds + DsTiles::tile(head, 2 * kt + half, 2 * kt + half, T_) + lane * DsTiles::kSide;
      for (int j = 0; j < n_tiles; ++j) {
        const bf16* sds = sDs(j % 2) + lane * Cfg::kDsPitch;
        cuda::mbarrier_wait(&ds_full[j % 2], (j / 2) & 1);  // both consumers stored (or skipped) their half
#pragma unroll
        for (int half = 0; half < Cfg::kConsumers; ++half) {
          if (half > j) continue;
#pragma unroll
          for (int r = 0; r < Cfg::kWgKeys; r += 32)
            cuda::bulk_store_global(dst[half] + r * DsTiles::kSide, sds + (half * Cfg::kWgKeys + r) * Cfg::kDsPitch,
                                    DsTiles::kSide * sizeof(bf16));
          dst[half] += DsTiles::kElems;
        }
        cuda::bulk_commit_group();
        cuda::bulk_wait_group_read<0>();          // this lane's rows are read from the buffer:
        cuda::mbarrier_arrive(&ds_empty[j % 2]);  // tile j + 2 may be written into it
      }
      cuda::bulk_wait_group<0>();  // the writes are complete before the block ends
      return;
    }
    if (!kStoreDs && warp == 1) {
      // ---- the dQ writer: each tile's share, in this key tile's turn (dq_turns.cuh) ----
      // The consumers leave the share in shared memory and go on; this warp waits for the turn and adds
      // the share to dq_acc by bulk reductions (the highest key tile writes it: a turn of 0), so no
      // consumer waits on another block or on L2 (FlashAttention-3's dQ writer, made deterministic by the
      // turns).
      // 24 registers (setmaxnreg): the loop keeps only pointers that advance by a tile
      int* turn = args.dq_turns + (static_cast<size_t>(b) * NH + h) * nq + qt0;
      float* dq_rows = args.dq_acc + (static_cast<size_t>(b) * T_ + qt0 * Cfg::kBlockM + lane) * C +
                       static_cast<size_t>(h) * Cfg::kHeadDim;
      int rows_left = T_ - qt0 * Cfg::kBlockM - lane;  // of this lane's first row of the tile
      for (int j = 0; j < n_tiles; ++j, ++turn, dq_rows += static_cast<size_t>(Cfg::kBlockM) * C,
               rows_left -= Cfg::kBlockM) {
        const int c = j % Cfg::kConsumers;
        const int my_turn = dq_turn(kt, qt0 + j, Cfg::kBlockM, Cfg::kBlockN, n_kv);
        cuda::mbarrier_wait(&dq_full[c], (j / Cfg::kConsumers) & 1);
        // The key tiles above kt that see qt have added theirs (acquire); a turn that never comes traps.
        if (lane == 0) cuda::wait_flag_at_least(turn, my_turn);
        __syncwarp();
        cuda::fence_proxy_async_global();  // their adds, seen through the acquire, before ours (async proxy)
#pragma unroll
        for (int r = 0; r < Cfg::kBlockM / 32; ++r) {  // rows lane and lane + 32 (those before T)
          if (32 * r >= rows_left) break;
          float* dst = dq_rows + static_cast<size_t>(32 * r) * C;
          const float* src = sDq(c) + (lane + 32 * r) * Cfg::kDqPitch;
          if (my_turn > 0) cuda::bulk_reduce_add_f32(dst, src, Cfg::kHeadDim * 4);
          else cuda::bulk_store_global(dst, src, Cfg::kHeadDim * 4);
        }
        cuda::bulk_commit_group();
        cuda::bulk_wait_group_read<0>();      // this lane's rows are read from the buffer:
        cuda::mbarrier_arrive(&dq_empty[c]);  // the consumer may refill it while the adds complete
        cuda::bulk_wait_group<0>();           // this lane's rows are in dq_acc
        cuda::fence_proxy_async_global();     // those writes (async proxy) before the generic release below
        __syncwarp();
        if (lane == 0) cuda::red_release_gpu_add(turn, 1);  // every lane's rows precede the new count
      }
      return;
    }
    if (warp != 0) return;
    const int q_col = h * Cfg::kHeadDim;
    if (lane == 0) {
      cuda::tma_prefetch_descriptor(&tmap_qkv);
      cuda::tma_prefetch_descriptor(&tmap_dout);
      cuda::mbarrier_arrive_expect_tx(kv_full, 2 * Cfg::kKvTileBytes);
      for (int half = 0; half < Cfg::kBlockN / Cfg::kBoxRows; ++half) {
        const int row = k0 + half * Cfg::kBoxRows;
        cuda::tma_load_3d(sK + half * Cfg::kBoxBytes, &tmap_qkv, kv_full, C + q_col, row, b);
        cuda::tma_load_3d(sV + half * Cfg::kBoxBytes, &tmap_qkv, kv_full, 2 * C + q_col, row, b);
      }
    }
    const float* lse_bh = args.lse + (static_cast<size_t>(b) * NH + h) * T_;
    const float* d_bh = args.D + (static_cast<size_t>(b) * NH + h) * T_;
    for (int j = 0; j < n_tiles; ++j) {
      const int s = j % Cfg::kStages;
      const int q0 = (qt0 + j) * Cfg::kBlockM;
      cuda::mbarrier_wait(&empty[s], ((j / Cfg::kStages) & 1) ^ 1);
      for (int r = lane; r < Cfg::kBlockM; r += 32) {
        const bool in = q0 + r < T_;
        sLse(s)[r] = in ? lse_bh[q0 + r] * cuda::kLog2e : INFINITY;
        sD(s)[r] = in ? d_bh[q0 + r] : 0.0f;
      }
      if (lane == 0) {
        cuda::mbarrier_arrive_expect_tx(&full[s], 2 * Cfg::kQTileBytes);
        cuda::tma_load_3d(sQ(s), &tmap_qkv, &full[s], q_col, q0, b);
        cuda::tma_load_3d(sDo(s), &tmap_dout, &full[s], q_col, q0, b);
      } else {
        cuda::mbarrier_arrive(&full[s]);
      }
    }
    // The watchdog. The consumers' waits have no time bound (they raised their registers: ptx.cuh,
    // mbarrier_wait_untimed), so this warp waits, bounded, until they have released the last stages it
    // filled: the waits for tiles n_tiles .. n_tiles + kStages - 1 that the loop would make next. A phase
    // that never completes (a copy that never lands, an arrival count that is off) traps here, ending
    // the launch, instead of hanging it. Then until the last dQ turn (at the last query tile, which every
    // key tile visits) is counted: a consumer that never hands the writer its last share (the writer's
    // own waits are bounded too) traps here. Under kStoreDs there are no turns: the dS^T writer's waits for
    // the consumers' halves are bounded.
    for (int j = n_tiles; j < n_tiles + Cfg::kStages; ++j)
      cuda::mbarrier_wait(&empty[j % Cfg::kStages], ((j / Cfg::kStages) & 1) ^ 1);
    if (!kStoreDs && lane == 0)
      cuda::wait_flag_at_least(args.dq_turns + (static_cast<size_t>(b) * NH + h) * nq + nq - 1,
                               dq_turn(kt, nq - 1, Cfg::kBlockM, Cfg::kBlockN, n_kv) + 1);
    return;
  }

  // ---- consumers ----
  cuda::setmaxnreg_inc<Cfg::kConsumerRegs>();  // waits until the producer has given its registers back
  const int c = wg;  // keys [64c, 64c + 64) of the key tile
  const int g = lane >> 2, tq = lane & 3;
  const int wrow = c * Cfg::kWgKeys + 16 * warp;  // this warp's first key row in the tile
  const uint32_t k_base = cuda::smem_u32(sK);
  const int c3 = 3 * C;

  float dv[32], dk[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dv[i] = dk[i] = 0.0f;

  cuda::mbarrier_wait_untimed(kv_full, 0);
  for (int j = 0; j < n_tiles; ++j) {
    const int s = j % Cfg::kStages;
    const int qt = qt0 + j;
    const int q0 = qt * Cfg::kBlockM;
    const bool diagonal = q0 < k0 + Cfg::kBlockN;
    cuda::mbarrier_wait_untimed(&full[s], (j / Cfg::kStages) & 1);
    // j < c: every query of the tile precedes every key of this consumer (consumer 1 on the first tile):
    // P^T = dS^T = 0, so dV and dK stay as they are and its half of dS^T is not written (the dQ share
    // skips it). It still releases the stage and arrives on ds_full. The dQ share is consumer
    // j % kConsumers's, never one that skips.
    bf16* sds = sDs(j % 2);                 // this tile's dS^T buffer
    const uint32_t ds_phase = (j / 2) & 1;  // its use j / 2
    const bool computes = j >= c;
    const bool dq_share = !kStoreDs && c == j % Cfg::kConsumers;  // kStoreDs: the dS^T writer copies it out
    // P^T and dS^T as the A operands of dV and dK: those products may still read them while the dQ share
    // is issued, so they live until the wait that retires both.
    uint32_t pa[kQSteps][4], dsa[kQSteps][4];
    if (computes) {
      // Per tile, so they are not live across the dQ share; zeroed: scale-d 0 ignores them, but defined.
      float st[32], dpt[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) st[i] = dpt[i] = 0.0f;
      {  // S^T = K Q^T and dP^T = V dO^T, both issued at once; P^T is computed while dP^T runs
        uint32_t ka[kKSteps][4], va[kKSteps][4];
        load_rows_a<kKSteps>(ka, sK, wrow, lane, 0);
        load_rows_a<kKSteps>(va, sV, wrow, lane, 0);
        cuda::wgmma_fence();
        fence_acc(st);
        fence_acc(dpt);
        issue_rows_dot<kKSteps>(st, ka, cuda::smem_u32(sQ(s)), 0);
        cuda::wgmma_commit_group();
        issue_rows_dot<kKSteps>(dpt, va, cuda::smem_u32(sDo(s)), 0);
        cuda::wgmma_commit_group();
        cuda::wgmma_wait_group<1>();  // S^T
        fence_acc(st);
        fence_frags(ka);
        probabilities(st, sLse(s), q0 - k0, diagonal, TileRows{wrow + g, lane}, args.scale_log2);
        cuda::wgmma_wait_group<0>();  // dP^T
        fence_acc(dpt);
        fence_frags(va);
      }
      score_grads(dpt, st, sD(s), lane);

      // dS^T to shared memory for the dQ share, then dV += P^T dO, dK += dS^T Q. The store comes first: dsa
      // is the dK product's A operand, and the PTX ISA makes reading it before the wait that retires the
      // product undefined (as FlashAttention-3 orders it too).
      pack_a(pa, st);
      pack_a(dsa, dpt);
      cuda::mbarrier_wait_untimed(&ds_empty[j % 2], ds_phase ^ 1);  // tile j - 2's reader is done (fresh: passes)
      store_ds(sds, dsa, wrow + g, tq);
      if constexpr (kStoreDs) cuda::fence_proxy_async_shared();  // the writer's bulk copies (async proxy) read it
    }
    cuda::mbarrier_arrive(&ds_full[j % 2]);  // this thread's part of dS^T is stored (or skipped)
    if (computes) {
      cuda::wgmma_fence();
      fence_acc(dv);
      fence_acc(dk);
      issue_tokens_dot<kQSteps>(dv, pa, cuda::smem_u32(sDo(s)), true);
      issue_tokens_dot<kQSteps>(dk, dsa, cuda::smem_u32(sQ(s)), true);
      cuda::wgmma_commit_group();  // retired below, before the dQ share's products where this consumer makes it
    }

    // One branch on dq_share from here to the end of the tile, each side with its own waits: ptxas follows
    // the wgmma groups along straight paths only. Split over two branches on the same condition, it
    // serialized every wgmma of the kernel (C7520: it cannot tell that both branches go the same way).
    if (dq_share) {  // implies computes (j % 2 == c, so j >= c)
      // dQ[query tile qt] (+)= dS K over the block's keys, issued behind dV and dK: the wait for the other
      // consumer's half of dS^T and the dQ products overlap them.
      float dq[32];
      uint32_t da[2][kNSteps / 2][4];  // dS as A fragments; half h: consumer h's keys
      cuda::mbarrier_wait_untimed(&ds_full[j % 2], ds_phase);  // both halves of dS^T are in
#pragma unroll
      for (int i = 0; i < 32; ++i) dq[i] = 0.0f;
      load_ds_a(da[0], sds, 0, warp, lane);
      if (j > 0) {
        load_ds_a(da[1], sds, 1, warp, lane);
      } else {
        // consumer 1 skipped tile 0 (its half of dS^T is zero and was not written): zero fragments, so
        // the second half's products are issued on every tile and no wgmma sits in a branch of its own
        // (ptxas injected a warpgroup.arrive there, C7519)
#pragma unroll
        for (int kk = 0; kk < kNSteps / 2; ++kk) da[1][kk][0] = da[1][kk][1] = da[1][kk][2] = da[1][kk][3] = 0u;
      }
      cuda::mbarrier_arrive(&ds_empty[j % 2]);  // this thread's dS^T loads are done: tile j + 2 may write
      cuda::wgmma_fence();
      fence_acc(dq);
      issue_tokens_dot<kNSteps / 2>(dq, da[0], k_base, false);
      issue_tokens_dot<kNSteps / 2>(dq, da[1], k_base + (kNSteps / 2) * Bwd::kWgmmaK * Bwd::kRowBytes, true);
      cuda::wgmma_commit_group();
      cuda::wgmma_wait_group<1>();  // dV and dK (the older group); the dQ share may still run
      fence_acc(dv);
      fence_acc(dk);
      fence_frags(pa);
      fence_frags(dsa);
      // This thread has read Q, dO, lse and D of the stage for the last time (the dQ share reads K, dS^T).
      cuda::mbarrier_arrive(&empty[s]);

      cuda::wgmma_wait_group<0>();  // the dQ share
      fence_acc(dq);
      fence_frags(da[0]);
      fence_frags(da[1]);

      // Hand the share to the writer warp: into this consumer's buffer once the writer's copies have read
      // the last one (its use j / 2 - 1; a fresh barrier passes), then on to the next tile.
      float* sdq = sDq(c);
      cuda::mbarrier_wait_untimed(&dq_empty[c], ((j / Cfg::kConsumers) & 1) ^ 1);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float* row = sdq + (16 * warp + g + 8 * r) * Cfg::kDqPitch + 2 * tq;
#pragma unroll
        for (int q = 0; q < 8; ++q)
          *reinterpret_cast<float2*>(row + 8 * q) = make_float2(dq[4 * q + 2 * r], dq[4 * q + 2 * r + 1]);
      }
      cuda::fence_proxy_async_shared();  // the writer's bulk reductions (async proxy) read these stores
      cuda::mbarrier_arrive(&dq_full[c]);
    } else {
      cuda::wgmma_wait_group<0>();  // dV, dK
      if (computes) {
        fence_acc(dv);
        fence_acc(dk);
        fence_frags(pa);
        fence_frags(dsa);
      }
      cuda::mbarrier_arrive(&empty[s]);  // this thread has read Q, dO, lse and D of the stage for the last time
    }
  }

  // dK (times the softmax scale) and dV of this thread's two key rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = k0 + wrow + g + 8 * r;
    if (key >= T_) continue;
    bf16* krow =
        args.dqkv + (static_cast<size_t>(b) * T_ + key) * c3 + C + static_cast<size_t>(h) * Cfg::kHeadDim + 2 * tq;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      *reinterpret_cast<__nv_bfloat162*>(krow + 8 * q) =
          __floats2bfloat162_rn(dk[4 * q + 2 * r] * args.scale, dk[4 * q + 2 * r + 1] * args.scale);
      *reinterpret_cast<__nv_bfloat162*>(krow + C + 8 * q) = __floats2bfloat162_rn(dv[4 * q + 2 * r], dv[4 * q + 2 * r + 1]);
    }
  }
#else
  // Compiled for another architecture: this kernel is launched only where attention_bwd_wgmma_ready()
  // found its sm_90a code, so this body never runs.
  (void)tmap_qkv, (void)tmap_dout, (void)args;
  __trap();
#endif
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool attention_bwd_wgmma_ready() {
  static const bool ready = sm90a_kernel_runs_here(reinterpret_cast<const void*>(attention_bwd_wgmma_tma<false>)) &&
                            sm90a_kernel_runs_here(reinterpret_cast<const void*>(attention_bwd_wgmma_tma<true>));
  return ready;
}

bool attention_bwd_wgmma_takes(const bf16* dqkv, const bf16* dout, const bf16* qkv, int C, int NH) {
  return NH > 0 && C % NH == 0 && C / NH == kWgmmaHeadSize && C % 8 == 0 && aligned16(dqkv) && aligned16(dout) &&
         aligned16(qkv);
}

namespace {

// Both variants' launch: args carries dq_acc, dq_turns and ticket (kStoreDs false) or ds (true).
template <bool kStoreDs>
void launch_bwd_wgmma(const WgmmaBwdArgs& partial, const bf16* dout, const bf16* qkv, int B, int T_, int C, int NH,
                      cudaStream_t stream) {
  using Cfg = WgmmaBwdConfig;
  GPT2_CHECK(
      attention_bwd_wgmma_takes(partial.dqkv, dout, qkv, C, NH),
      "the wgmma attention backward was given a shape or pointers it does not take (C=" << C << ", NH=" << NH << ")");
  // qkv as (B, T, 3C) and dout as (B, T, C): dimension 0 the columns, 1 the tokens, 2 the sequences.
  const uint32_t box[3] = {Cfg::kHeadDim, Cfg::kBoxRows, 1};
  const uint64_t dims_qkv[3] = {3 * static_cast<uint64_t>(C), static_cast<uint64_t>(T_), static_cast<uint64_t>(B)};
  const uint64_t strides_qkv[2] = {3 * static_cast<uint64_t>(C) * sizeof(bf16),
                                   3 * static_cast<uint64_t>(C) * T_ * sizeof(bf16)};
  const CUtensorMap map_qkv = make_bf16_tensor_map(qkv, 3, dims_qkv, strides_qkv, box, "attention backward qkv");
  const uint64_t dims_do[3] = {static_cast<uint64_t>(C), static_cast<uint64_t>(T_), static_cast<uint64_t>(B)};
  const uint64_t strides_do[2] = {static_cast<uint64_t>(C) * sizeof(bf16), static_cast<uint64_t>(C) * T_ * sizeof(bf16)};
  const CUtensorMap map_do = make_bf16_tensor_map(dout, 3, dims_do, strides_do, box, "attention backward dout");
  cuda::allow_dynamic_smem(attention_bwd_wgmma_tma<kStoreDs>, Cfg::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(cuda::ceil_div(T_, Cfg::kBlockN)), static_cast<unsigned>(NH),
                  static_cast<unsigned>(B));
  const float scale = 1.0f / std::sqrt(static_cast<float>(Cfg::kHeadDim));  // as attention.cu
  WgmmaBwdArgs args = partial;
  args.T_ = T_, args.C = C, args.NH = NH, args.scale_log2 = scale * cuda::kLog2e, args.scale = scale;
  cuda::launch_kernel(attention_bwd_wgmma_tma<kStoreDs>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, map_qkv, map_do,
                      args);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_bwd_wgmma(bf16* dqkv, float* dq_acc, int* dq_turns, int* ticket, const bf16* dout, const bf16* qkv,
                         const float* lse, const float* D, int B, int T_, int C, int NH, cudaStream_t stream) {
  launch_bwd_wgmma<false>(WgmmaBwdArgs{dqkv, dq_acc, dq_turns, ticket, nullptr, lse, D, 0, 0, 0, 0.0f, 0.0f}, dout, qkv,
                          B, T_, C, NH, stream);
}

void attention_bwd_wgmma_store_ds(bf16* dqkv, bf16* ds, const bf16* dout, const bf16* qkv, const float* lse,
                                  const float* D, int B, int T_, int C, int NH, cudaStream_t stream) {
  GPT2_CHECK(aligned16(ds), "the wgmma attention backward's dS^T tiles are not 16-byte aligned");
  launch_bwd_wgmma<true>(WgmmaBwdArgs{dqkv, nullptr, nullptr, nullptr, ds, lse, D, 0, 0, 0, 0.0f, 0.0f}, dout, qkv, B,
                         T_, C, NH, stream);
}

}  // namespace gpt2::kernels::attention_detail
