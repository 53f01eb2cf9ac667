// The Hopper forward of causal attention (bf16, hs = 64, compute capability 9.0, sm_90a code), in
// FlashAttention-3's structure:
//
//   TMA (Q once; K, V per key tile) --q_full, k_full[s], v_full[s]--> 2 consumer warpgroups
//        ^                                                                   |
//        +------------------------------ empty[s] --------------------------+
//
//  * Persistent: one block per SM takes units (query tile of 128 rows, head, batch) in turn, the longest
//    causal prefixes first (unit u: query tile n_qtiles - 1 - u / (NH B)); block i takes units i, i +
//    grid, i + 2 grid, ... Warpgroup 0 is the producer: one thread issues the TMA copies, Q of each unit
//    and then K and V of each of its key tiles into a 3-stage ring that runs on across units.
//    Warpgroups 1 and 2 are consumers, 64 query rows each (one wgmma M).
//  * The next unit starts loading while this one ends: the consumers release Q (q_empty) as soon as
//    the S of their last key tile retires, and each stage as its P V retires, so Q and the first K and
//    V of the next unit land during the last P V and the output stores. At T = 1024 a unit has 4.5 key
//    tiles on average, a few microseconds: a block launched per unit would spend a good share of them
//    waiting for its first tiles.
//  * Per key tile a consumer runs S = Q K^T as 4 wgmma m64n128k16 from shared memory (64 fp32 registers a
//    thread), masks the diagonal tile, updates the online softmax in registers (fp32, log2 domain, as
//    the mma.sync kernel in attention.cu), and runs O += P V as 8 wgmma m64n64k16 with P in registers:
//    the m64n128 accumulator's registers 8j..8j+7 are the A fragment of keys 16j..16j+15 once packed to
//    bf16 (ptx.cuh, wgmma_m64n64k16_bf16_rs), so P never goes through shared memory. K and V have
//    barriers of their own: S starts while V is still arriving.
//  * Intra-warpgroup overlap (FlashAttention-3 section 3.2): S of tile j and P V of tile j - 1 are
//    issued together, and the softmax of tile j runs while P V of tile j - 1 is still on the tensor
//    cores (wgmma.wait_group 1, then 0). The registers stay at S 64 + O 32 + P 32, as without it.
//  * Out of bounds rows (the last query tile, keys past T) come in as zeros from TMA: the tensor map is
//    rank 3 (3C, T, B), so a tile never reads the next sequence's rows.
//
// NOT VERIFIED ON A GPU YET (written without one; docs/performance.md). It runs only when asked for:
// GPT2_ATTENTION_FWD=wgmma or attention_set_forward_path (attention_cuda.hpp).
//
// Layout facts (kernels/gemm/gemm_sm90.cu has the sources; the same descriptors):
//  * Every tile is 128 token rows x 64 dims of bf16 = 128 bytes a row, written by TMA with the 128-byte
//    swizzle as 16 consecutive 1024-byte atoms; tiles are 1024-aligned (descriptor base offset 0).
//  * Q (A of S, K-major) and K (B of S, K-major): SBO = 1024 (8 rows), LBO unused; the k16 step kk moves
//    the start address by 32*kk bytes. Consumer c's 64 rows of Q start 8 KB in.
//  * V (B of O += P V, MN-major: keys are K, dims are N, contiguous): SBO = 1024 (8 key rows), LBO = the
//    next 64-wide block of N (there is one: set to a tile's size, never used); the k16 step moves the
//    start by 16 rows = 2048 bytes; transpose immediate 1.
//  * Barrier phases: the block's t-th key tile (counted across its units) uses stage t % 3; consumers wait
//    k_full/v_full for parity (t/3) & 1, the producer waits empty for the opposite parity (a fresh barrier
//    passes at once). empty counts one arrival from lane 0 of each of the 8 consumer warps, after the
//    wgmma.wait_group that retires P V of the stage's tile (one iteration after its S: hence 3 stages,
//    so tile t + 1 loads during tile t). The block's n-th unit: consumers wait q_full for parity n & 1;
//    q_empty (8 arrivals, after the last S of a unit retires) completes its phase n, which the producer
//    waits for (parity n & 1) before it loads Q of unit n + 1.
//
//  * Ping-pong (kPingPong, GPT2_ATTENTION_FWD=wgmma-pingpong; FlashAttention-3 section 3.1): the two
//    consumers take turns at issuing their products, so one's softmax runs while the other's products
//    have the tensor cores. At GPT-2's head size the softmax's exp2 of a 64 x 128 tile takes about as
//    long on an SM's MUFU units as the tile's two products on its tensor cores, so the overlap matters.
//    Every issue point (S of tile 0; S of tile j with P V of tile j - 1; the last P V) is bracketed:
//    bar.sync on the consumer's own turn barrier (kTurnBarrier + c, 256 threads), then, once issued,
//    bar.arrive on the other's. Consumer 0 arrives on its own once at the start (it goes first), and
//    consumer 1 skips its very last arrive, so no arrival is left over. Both consumers have the same
//    units and tiles, so their issue points pair up one to one.
//
// Left for later (docs/performance.md): setmaxnreg register rebalancing.
#include "kernels/attention/attention_sm90.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.hpp"
#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90a_host.cuh"

namespace gpt2::kernels::attention_detail {

namespace {

using bf16 = __nv_bfloat16;

// Launch configuration (named data; the reasons in the comments).
struct WgmmaFwdConfig {
  static constexpr int kHeadDim = kWgmmaHeadSize;  // 64 bf16 = 128 bytes: one swizzle row per token
  static constexpr int kConsumers = 2;
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static constexpr int kWgRows = 64;                     // one wgmma M per consumer
  static constexpr int kBlockM = kWgRows * kConsumers;   // 128 queries a block
  static constexpr int kBlockN = 128;                    // keys a tile: S is m64n128, 64 fp32 registers
  static constexpr int kWgmmaK = 16;
  // K, V of tile j + 1 load while tiles j - 1 (its P V) and j (its S) are in use: a stage is released
  // only when P V of its tile retires, one tile after its S.
  static constexpr int kStages = 3;
  static constexpr int kTileBytes = 128 * kHeadDim * 2;  // 16 KB: a TMA box of 128 rows x 64 dims
  static constexpr int kAlign = 1024;                    // swizzle atoms start 1024-aligned
  static constexpr int kBarriers = 2 + 3 * kStages;      // q_full, q_empty, k_full[s], v_full[s], empty[s]
  static constexpr size_t kSmemBytes = kAlign + (1 + 2 * kStages) * kTileBytes + kBarriers * 8;
  static constexpr int kTurnBarrier = 1;  // ping-pong: named barriers 1 and 2, consumer c's turn at 1 + c
  static_assert(kBlockM == kBlockN, "causal: the diagonal key tile of query tile i is key tile i");
  static_assert(kHeadDim * 2 == 128, "one 128-byte swizzle row per token");
  static_assert(kTileBytes % kAlign == 0, "1024-aligned tiles");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared-memory limit per block");
};

// ---- consumer building blocks (one warpgroup; register layouts in the file comment) ----
// wgmma exists in the sm_90a device pass only (ptx.cuh), like the kernel body that calls these.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using Fwd = WgmmaFwdConfig;
constexpr uint32_t kSbo = 1024;                   // 8 rows of 128 bytes
constexpr uint32_t kLboKMajor = 16;               // unused by K-major operands (encodes as 1)
constexpr uint32_t kLboV = Fwd::kTileBytes;      // V's next 64-wide block of N: there is none

template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cuda::wgmma_fence_operand(r[i]);
}
__device__ __forceinline__ void fence_operands(uint32_t (&r)[Fwd::kBlockN / Fwd::kWgmmaK][4]) {
#pragma unroll
  for (int kk = 0; kk < Fwd::kBlockN / Fwd::kWgmmaK; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) cuda::wgmma_fence_operand(r[kk][i]);
  }
}

// S = Q K^T (raw dot products), 64 x 128: 4 wgmma m64n128k16 from shared memory (not committed).
__device__ __forceinline__ void issue_s(float (&sc)[64], uint32_t q_base, uint32_t k_base) {
#pragma unroll
  for (int kk = 0; kk < Fwd::kHeadDim / Fwd::kWgmmaK; ++kk) {
    const uint64_t da = cuda::wgmma_desc(q_base + kk * 32, kLboKMajor, kSbo, cuda::WgmmaSwizzle::k128B);
    const uint64_t db = cuda::wgmma_desc(k_base + kk * 32, kLboKMajor, kSbo, cuda::WgmmaSwizzle::k128B);
    cuda::wgmma_m64n128k16_bf16<0, 0>(sc, da, db, kk > 0 ? 1 : 0);
  }
}

// O += P V, 64 x 64: 8 wgmma m64n64k16 with P's registers as A (not committed).
__device__ __forceinline__ void issue_pv(float (&o)[32], uint32_t (&pa)[Fwd::kBlockN / Fwd::kWgmmaK][4],
                                         uint32_t v_base) {
#pragma unroll
  for (int kk = 0; kk < Fwd::kBlockN / Fwd::kWgmmaK; ++kk) {
    const uint64_t dv = cuda::wgmma_desc(v_base + kk * Fwd::kWgmmaK * 128, kLboV, kSbo, cuda::WgmmaSwizzle::k128B);
    cuda::wgmma_m64n64k16_bf16_rs<1>(o, pa[kk], dv, 1);
  }
}

// Where this thread's accumulator rows are, and the softmax scale.
struct SoftmaxRows {
  int row0, lane, T_;
  float scale_log2;
};

// Masks a key tile whose first key is col0 and turns S into P (fp32, in place) with the online softmax in
// the log2 domain; alpha[r] is how much O's row half r must shrink. The 4 threads of a quad share each
// row; register i holds row half r = (i/2) % 2: i = 4q + 2r + e.
__device__ __forceinline__ void softmax_tile(float (&sc)[64], float (&m_run)[2], float (&l_run)[2], float (&alpha)[2],
                                             bool diagonal, int col0, const SoftmaxRows& w) {
  // Only the diagonal tile has keys past a row or past T (an earlier key tile of a query tile ends
  // before the query tile starts, so before T).
  if (diagonal) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int row = w.row0 + 8 * ((i / 2) % 2);
      const int col = col0 + cuda::wgmma_acc_col(w.lane, i);
      if (col > row || col >= w.T_) sc[i] = -INFINITY;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int q = 0; q < 16; ++q) mx = fmaxf(mx, fmaxf(sc[4 * q + 2 * r], sc[4 * q + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run[r], mx * w.scale_log2);
    // Every row sees key 0 in the first tile, so m_new is finite; kept as the mma.sync kernel has it.
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    alpha[r] = cuda::ex2_approx_ftz(m_run[r] - m_use);
    m_run[r] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < 16; ++q) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = cuda::ex2_approx_ftz(fmaf(sc[4 * q + 2 * r + e], w.scale_log2, -m_use));
        sc[4 * q + 2 * r + e] = p;
        sum += p;
      }
    }
    l_run[r] = l_run[r] * alpha[r] + sum;
  }
}

__device__ __forceinline__ void rescale_o(float (&o)[32], const float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      o[4 * q + 2 * r] *= alpha[r];
      o[4 * q + 2 * r + 1] *= alpha[r];
    }
  }
}

// P as bf16 A fragments, straight from the S registers (see the file comment).
__device__ __forceinline__ void pack_p(uint32_t (&pa)[Fwd::kBlockN / Fwd::kWgmmaK][4], const float (&sc)[64]) {
#pragma unroll
  for (int kk = 0; kk < Fwd::kBlockN / Fwd::kWgmmaK; ++kk) {
    pa[kk][0] = cuda::pack_bf16x2(sc[8 * kk + 0], sc[8 * kk + 1]);
    pa[kk][1] = cuda::pack_bf16x2(sc[8 * kk + 2], sc[8 * kk + 3]);
    pa[kk][2] = cuda::pack_bf16x2(sc[8 * kk + 4], sc[8 * kk + 5]);
    pa[kk][3] = cuda::pack_bf16x2(sc[8 * kk + 6], sc[8 * kk + 7]);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Unit u of the persistent grid: every (head, batch) of the last query tile first, then of the one before
// (the longest causal prefixes first, so the short units fill in at the end).
struct FwdUnit {
  int qt, h, b;
};
__device__ __forceinline__ FwdUnit fwd_unit(int u, int n_qtiles, int NH, int heads_x_batch) {
  const int hb = u % heads_x_batch;
  return {n_qtiles - 1 - u / heads_x_batch, hb % NH, hb / NH};
}

template <bool kPingPong>
__global__ void __launch_bounds__(WgmmaFwdConfig::kThreads, 1)
    attention_fwd_wgmma_tma(const __grid_constant__ CUtensorMap tmap_qkv, bf16* out, float* lse, int B, int T_,
                            int C, int NH, float scale_log2) {
  cuda::griddep_launch_dependents_then_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = WgmmaFwdConfig;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((Cfg::kAlign - (cuda::smem_u32(smem_raw) % Cfg::kAlign)) % Cfg::kAlign);
  unsigned char* sQ = smem;
  auto sK = [&](int s) { return smem + (1 + s) * Cfg::kTileBytes; };
  auto sV = [&](int s) { return smem + (1 + Cfg::kStages + s) * Cfg::kTileBytes; };
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + (1 + 2 * Cfg::kStages) * Cfg::kTileBytes);
  uint64_t* q_empty = q_full + 1;
  uint64_t* k_full = q_full + 2;
  uint64_t* v_full = k_full + Cfg::kStages;
  uint64_t* empty = v_full + Cfg::kStages;

  const int n_qtiles = (T_ + Cfg::kBlockM - 1) / Cfg::kBlockM, heads_x_batch = NH * B;
  const int units = n_qtiles * heads_x_batch;
  const int wg = threadIdx.x / Cfg::kWarpgroupThreads;
  const int tid_wg = threadIdx.x % Cfg::kWarpgroupThreads;

  if (threadIdx.x == 0) {
    cuda::mbarrier_init(q_full, 1);
    cuda::mbarrier_init(q_empty, Cfg::kConsumers * Cfg::kWarpgroupThreads / 32);
    for (int s = 0; s < Cfg::kStages; ++s) {
      cuda::mbarrier_init(&k_full[s], 1);
      cuda::mbarrier_init(&v_full[s], 1);
      cuda::mbarrier_init(&empty[s], Cfg::kConsumers * Cfg::kWarpgroupThreads / 32);
    }
    cuda::fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on the roles run independently

  if (wg == 0) {
    // ---- producer: one thread issues every copy; coordinates are {column, token, batch} ----
    if (tid_wg != 0) return;
    cuda::tma_prefetch_descriptor(&tmap_qkv);
    int t = 0;  // the block's key tiles so far: the ring position
    for (int u = static_cast<int>(blockIdx.x), n = 0; u < units; u += static_cast<int>(gridDim.x), ++n) {
      const FwdUnit w = fwd_unit(u, n_qtiles, NH, heads_x_batch);
      const int q_col = w.h * Cfg::kHeadDim, k_col = C + q_col, v_col = 2 * C + q_col;
      if (n > 0) cuda::mbarrier_wait(q_empty, (n - 1) & 1);  // every consumer is done with the last Q
      cuda::mbarrier_arrive_expect_tx(q_full, Cfg::kTileBytes);
      cuda::tma_load_3d(sQ, &tmap_qkv, q_full, q_col, w.qt * Cfg::kBlockM, w.b);
      for (int j = 0; j <= w.qt; ++j, ++t) {  // key tiles 0 .. qt: the diagonal one is the last
        const int s = t % Cfg::kStages;
        cuda::mbarrier_wait(&empty[s], ((t / Cfg::kStages) & 1) ^ 1);
        cuda::mbarrier_arrive_expect_tx(&k_full[s], Cfg::kTileBytes);
        cuda::tma_load_3d(sK(s), &tmap_qkv, &k_full[s], k_col, j * Cfg::kBlockN, w.b);
        cuda::mbarrier_arrive_expect_tx(&v_full[s], Cfg::kTileBytes);
        cuda::tma_load_3d(sV(s), &tmap_qkv, &v_full[s], v_col, j * Cfg::kBlockN, w.b);
      }
    }
    return;
  }

  // ---- consumers ----
  const int c = wg - 1;  // rows [64c, 64c + 64) of each query tile
  const int warp = tid_wg / 32, lane = tid_wg % 32;
  const int g = lane >> 2, tq = lane & 3;
  const uint32_t q_base = cuda::smem_u32(sQ) + static_cast<uint32_t>(c * Cfg::kWgRows * 128);
  // This warp's lane 0 tells the producer that the warp has read Q (the last S of the unit retired) or a
  // stage (its P V retired) for the last time.
  auto release = [&](uint64_t* bar) {
    if (lane == 0) cuda::mbarrier_arrive(bar);
  };
  // Ping-pong: wait for this consumer's turn to issue, and hand the turn over once issued.
  constexpr int kTurnThreads = 2 * Cfg::kWarpgroupThreads;
  auto my_turn = [&] {
    if constexpr (kPingPong) cuda::named_barrier_sync(Cfg::kTurnBarrier + c, kTurnThreads);
  };
  auto their_turn = [&] {
    if constexpr (kPingPong) cuda::named_barrier_arrive(Cfg::kTurnBarrier + 1 - c, kTurnThreads);
  };
  if (kPingPong && c == 0) cuda::named_barrier_arrive(Cfg::kTurnBarrier, kTurnThreads);  // consumer 0 goes first

  float o[32], sc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) sc[i] = 0.0f;  // never read (scale-d 0 on the first k16), but defined
  uint32_t pa[Cfg::kBlockN / Cfg::kWgmmaK][4];
  int t = 0;  // the block's key tiles so far, as the producer counts them
  for (int u = static_cast<int>(blockIdx.x), n = 0; u < units; u += static_cast<int>(gridDim.x), ++n) {
    const FwdUnit w = fwd_unit(u, n_qtiles, NH, heads_x_batch);
    const int n_tiles = w.qt + 1;  // key tiles 0 .. qt: the diagonal one is the last
    // the row of registers with (i/2) % 2 == 0; +8 otherwise
    const int row0 = w.qt * Cfg::kBlockM + c * Cfg::kWgRows + 16 * warp + g;
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f}, alpha[2];
    const SoftmaxRows rows{row0, lane, T_, scale_log2};

    // Key tile 0: S alone, then its softmax. From tile 1 on, S of tile j and P V of tile j - 1 are in
    // flight together, and the softmax of tile j runs while the tensor cores finish P V (the intra-
    // warpgroup overlap of FlashAttention-3, section 3.2): the exp2 work hides behind the second product.
    // P of tile j - 1 stays in `pa` until that product retires, so the softmax writes fp32 into `sc` and
    // packs it only after the wait.
    cuda::mbarrier_wait(q_full, n & 1);
    cuda::mbarrier_wait(&k_full[t % Cfg::kStages], (t / Cfg::kStages) & 1);
    my_turn();
    cuda::wgmma_fence();
    fence_operands(sc);
    issue_s(sc, q_base, cuda::smem_u32(sK(t % Cfg::kStages)));
    cuda::wgmma_commit_group();
    their_turn();
    cuda::wgmma_wait_group<0>();
    fence_operands(sc);
    if (n_tiles == 1) release(q_empty);
    softmax_tile(sc, m_run, l_run, alpha, /*diagonal=*/w.qt == 0, 0, rows);
    pack_p(pa, sc);  // O is still zero: no rescale
    for (int j = 1; j < n_tiles; ++j) {
      const int tj = t + j, s = tj % Cfg::kStages, sp = (tj - 1) % Cfg::kStages;
      // Both waits before the first wgmma: a wait loop between two wgmma makes ptxas insert a warpgroup
      // fence of its own (C7519). V of tile j - 1 has had a whole iteration to land.
      cuda::mbarrier_wait(&k_full[s], (tj / Cfg::kStages) & 1);
      cuda::mbarrier_wait(&v_full[sp], ((tj - 1) / Cfg::kStages) & 1);
      my_turn();
      cuda::wgmma_fence();  // o was rescaled and pa packed by ordinary instructions
      fence_operands(sc);
      fence_operands(o);
      issue_s(sc, q_base, cuda::smem_u32(sK(s)));
      cuda::wgmma_commit_group();
      issue_pv(o, pa, cuda::smem_u32(sV(sp)));
      cuda::wgmma_commit_group();
      their_turn();
      cuda::wgmma_wait_group<1>();  // S of tile j; P V of tile j - 1 may still run
      fence_operands(sc);
      if (j == n_tiles - 1) release(q_empty);  // the next unit's Q may load now
      softmax_tile(sc, m_run, l_run, alpha, /*diagonal=*/j == w.qt, j * Cfg::kBlockN, rows);
      cuda::wgmma_wait_group<0>();
      fence_operands(o);
      fence_operands(pa);
      // This warp has read K and V of tile j - 1 for the last time.
      release(&empty[sp]);
      rescale_o(o, alpha);
      pack_p(pa, sc);
    }
    {  // P V of the last key tile
      const int tl = t + n_tiles - 1, sl = tl % Cfg::kStages;
      cuda::mbarrier_wait(&v_full[sl], (tl / Cfg::kStages) & 1);
      my_turn();
      cuda::wgmma_fence();
      fence_operands(o);
      issue_pv(o, pa, cuda::smem_u32(sV(sl)));
      cuda::wgmma_commit_group();
      // consumer 1's last issue point hands the turn to nobody: consumer 0 has none left
      if (c == 0 || u + static_cast<int>(gridDim.x) < units) their_turn();
      cuda::wgmma_wait_group<0>();
      fence_operands(o);
      fence_operands(pa);
      release(&empty[sl]);
    }
    t += n_tiles;

    // out = O / l (bf16), lse = (m + log2 l) * ln 2, from registers (no shared memory: the next unit's
    // tiles are already landing)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l_run[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = row0 + 8 * r;
      if (row >= T_) continue;
      const float inv = 1.0f / sum;  // >= 1 term: the row maximum contributes exp2(0)
      bf16* orow =
          out + (static_cast<size_t>(w.b) * T_ + row) * C + static_cast<size_t>(w.h) * Cfg::kHeadDim + 2 * tq;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        *reinterpret_cast<__nv_bfloat162*>(orow + 8 * q) =
            __floats2bfloat162_rn(o[4 * q + 2 * r] * inv, o[4 * q + 2 * r + 1] * inv);
      }
      if (tq == 0) lse[(static_cast<size_t>(w.b) * NH + w.h) * T_ + row] = (m_run[r] + log2f(sum)) * cuda::kLn2;
    }
  }
#else
  // Compiled for another architecture: this kernel is launched only where attention_fwd_wgmma_ready()
  // found its sm_90a code, so this body never runs.
  (void)tmap_qkv, (void)out, (void)lse, (void)B, (void)T_, (void)C, (void)NH, (void)scale_log2;
  __trap();
#endif
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool attention_fwd_wgmma_ready() {
  static const bool ready = sm90a_kernel_runs_here(reinterpret_cast<const void*>(attention_fwd_wgmma_tma<false>)) &&
                            sm90a_kernel_runs_here(reinterpret_cast<const void*>(attention_fwd_wgmma_tma<true>));
  return ready;
}

bool attention_fwd_wgmma_takes(const bf16* qkv, const bf16* out, int C, int NH) {
  return NH > 0 && C % NH == 0 && C / NH == kWgmmaHeadSize && C % 8 == 0 && aligned16(qkv) && aligned16(out);
}

void attention_fwd_wgmma(bool pingpong, bf16* out, float* lse, const bf16* qkv, int B, int T_, int C, int NH,
                         cudaStream_t stream) {
  using Cfg = WgmmaFwdConfig;
  GPT2_CHECK(attention_fwd_wgmma_takes(qkv, out, C, NH),
             "the wgmma attention forward was given a shape or pointers it does not take (C=" << C << ", NH=" << NH
                                                                                             << ")");
  // qkv as (B, T, 3C): dimension 0 the 3C columns, 1 the tokens, 2 the sequences.
  const uint64_t dims[3] = {3 * static_cast<uint64_t>(C), static_cast<uint64_t>(T_), static_cast<uint64_t>(B)};
  const uint64_t strides[2] = {3 * static_cast<uint64_t>(C) * sizeof(bf16),
                               3 * static_cast<uint64_t>(C) * T_ * sizeof(bf16)};
  const uint32_t box[3] = {Cfg::kHeadDim, Cfg::kBlockN, 1};
  const CUtensorMap map = make_bf16_tensor_map(qkv, 3, dims, strides, box, "attention qkv");
  auto kernel = pingpong ? attention_fwd_wgmma_tma<true> : attention_fwd_wgmma_tma<false>;
  cuda::allow_dynamic_smem(kernel, Cfg::kSmemBytes);
  // Persistent: at most one block per SM (its shared memory and 384 threads x 154 registers allow one).
  const long units = cuda::ceil_div(T_, Cfg::kBlockM) * static_cast<long>(NH) * B;
  const unsigned grid = static_cast<unsigned>(std::min<long>(units, sm_count()));
  const float scale_log2 = (1.0f / std::sqrt(static_cast<float>(Cfg::kHeadDim))) * cuda::kLog2e;  // as attention.cu
  cuda::launch_kernel(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, map, out, lse, B, T_, C, NH, scale_log2);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gpt2::kernels::attention_detail
