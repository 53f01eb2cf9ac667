// The hand-written GEMM backend, the launcher that dispatches between the backends, and the bias
// gradient.
//
//  * fp32: a tiled SIMT kernel (128x128 block tile, 8x8 outputs per thread, true fp32 FMA).
//  * bf16: a tensor-core kernel on mma.sync.m16n8k16 (the sm_80 instruction; on sm_90 the fallback of the
//    wgmma kernel below): 128x128x32 block tiles, 4 warps of 64x64, a 4-stage cp.async pipeline into swizzled shared
//    memory, ldmatrix (.trans where the operand's memory layout is the transpose of the fragment's).
//    Row/column/K bounds are predicated (zero-fill), so any M, N, K works; when a leading dimension is not
//    a multiple of 8 or a pointer is not 16-byte aligned, the same kernel loads tiles with scalar loads.
//  * Epilogues (bias, bias+GELU with the pre-activation saved, GELU gradient, C +=) are applied to the
//    fp32 accumulators in one place (apply_epilogue4), staged through shared memory so that every store
//    is a coalesced row segment.
//  * Split-K for small output grids with a long K (the weight gradients), the factor from a cost model
//    (wave quantization against the partials' HBM traffic): each split writes fp32 partials to the
//    context's workspace; a second kernel adds them in split order and applies the epilogue.
//    Deterministic: the split factor depends on the shape only. The wgmma kernel may split only its tail
//    (GemmSplitPlan): the tiles of the whole waves of SMs unsplit, the rest split, and only theirs reduced.
//  * The bias gradient of a linear layer can ride along its weight gradient (weight_bias_grad_cuda):
//    the blocks of the first output row tile sum the columns of the dout tiles already in shared memory
//    (every kernel but mma.sync's register-staged variant, which is at the 255-register limit).
//  * On compute capability 9.0 the bf16 product runs on wgmma fed by TMA (gemm_sm90.cu), falling back to
//    mma.sync for operands TMA cannot describe (choose_hand_path): 128x256 tiles unless GPT2_GEMM_SM90
//    names another kernel (0: mma.sync). Verified on an H100 and an H200; on the H100 128x256 ran the 124M
//    step 1.30x as fast as mma.sync (docs/performance.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/common/cuda_util.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/common/env_choice.hpp"
#include "kernels/common/kernel_paths.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gemm/gemm_common.cuh"
#include "kernels/gemm/gemm_cuda.hpp"
#include "kernels/reduce/reduce_cuda.hpp"
#if defined(GPT2_HAVE_SM90A)
#include "kernels/gemm/gemm_sm90.cuh"
#endif

namespace gpt2::kernels {

namespace {

// What record_kernel_path gets for the hand GEMM's wgmma kernels (string literals).
const char* hand_wgmma_path_name(GemmWgmmaKernel k) {
  switch (k) {
    case GemmWgmmaKernel::k128x256: return "hand wgmma 128x256";
    case GemmWgmmaKernel::k128x128PingPong: return "hand wgmma 128x128-pingpong";
    default: return "hand wgmma 128x128";
  }
}

using cuda::ceil_div;
using cuda::cp_async_16;
using cuda::cp_async_commit;
using cuda::cp_async_wait;
using cuda::from_f32;
using cuda::ldmatrix_x4;
using cuda::ldmatrix_x4_trans;
using cuda::mma_bf16_16816;
using cuda::to_f32;
using gemm_detail::apply_epilogue4;
using gemm_detail::EpilogueParams;
using gemm_detail::kahan_add;
using gemm_detail::load4;
using gemm_detail::store4;
using gemm_detail::store_partial4;
using gemm_detail::tile_coords;

// ---------------------------------------------------------------------------------------------------
// Launch configuration (named data; the reasons are in the comments).

// The bf16 tensor-core kernel.
struct TcTile {
  // 128x128 output per block, K in steps of 32: 4 warps each own 64x64 (4 m16 x 8 n8 mma tiles), which
  // gives 8 ldmatrix.x4 per 32 mma per k16 step, so shared-memory bandwidth stays at about half of what
  // the tensor cores can consume. 128 threads x ~230 registers lets 2 blocks share an SM, so one block's
  // epilogue overlaps the other's main loop.
  static constexpr int kBM = 128, kBN = 128, kBK = 32;
  static constexpr int kWarpsM = 2, kWarpsN = 2;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;
  static constexpr int kMTiles = kWM / 16, kNTiles = kWN / 8;
  // 4 stages x 16 KB: three tiles in flight cover HBM latency at this tile's compute time.
  static constexpr int kStages = 4;
  static constexpr int kStageElems = (kBM + kBN) * kBK;
  // Epilogue staging: the fp32 tile with rows padded by 8 floats, so the fragment stores (float2 per
  // lane, 4 rows x 4 lanes per half-warp) hit 32 distinct banks.
  static constexpr int kCStride = kBN + 8;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageElems * sizeof(bf16) >
                                               static_cast<size_t>(kBM) * kCStride * sizeof(float)
                                           ? static_cast<size_t>(kStages) * kStageElems * sizeof(bf16)
                                           : static_cast<size_t>(kBM) * kCStride * sizeof(float);
  static_assert(kWM % 16 == 0 && kWN % 16 == 0, "warp tile: whole m16 tiles and n8 pairs");
  static_assert(kBK % 16 == 0, "K step: whole k16 mma steps");
};

// The fp32 SIMT kernel.
struct SimtTile {
  // 128x128 per block, 256 threads each computing 8x8 (two 4x4 quadrants 64 apart, so the float4 reads
  // of a warp from shared memory are contiguous); K in steps of 16 (16 KB of shared memory).
  static constexpr int kBM = 128, kBN = 128, kBK = 16;
  static constexpr int kThreads = 256;
  static constexpr int kPad = 4;  // keeps float4 alignment and spreads the transposing stores over banks
  static constexpr int kLoadsPerThread = kBM * kBK / kThreads;  // 8 (A and B alike)
};

// Split-K cost model. A wave of resident blocks advances every block by one unit of K in the same time;
// a split divides each block's K by s, multiplies the blocks by s, and costs the HBM round trip of
// s fp32 partials. The constants describe an H100 (132 SMs, ~3 TB/s) and are not read off the device, so
// the split factor, and hence the bits, depend on the shape alone, on every GPU.
constexpr int kSplitModelSms = 132;
constexpr double kSplitModelHbmBytesPerNs = 3000.0;
constexpr int kSplitMinK = 1024;  // every split keeps >= 1024 of K (prologue/epilogue stay small)
constexpr int kMaxSplits = 16;
// A split tail (choose_split_plan) launches the GEMM twice: its second launch's start (the launch, the
// barriers, the first stages' copies), and the margin by which the plan must beat the best plain split.
constexpr double kTailLaunchNs = 3000.0;
constexpr double kTailMargin = 0.95;
// 64 MiB: room for the best splits of GPT-2's weight gradients (768 x 3072 x 7 splits = 63 MiB).
constexpr size_t kSplitKWorkspaceBytes = 64ull << 20;

// Bias gradient: rows per partial column sum (scratch holds ceil(N/256) x OC floats).
constexpr int kBiasRowsPerChunk = 256;
// 32 lanes across columns (coalesced), 8 rows at a time.
constexpr int kBiasThreadsX = 32, kBiasThreadsY = 8;
constexpr int kElementwiseThreads = 256;

inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <class T>
struct GemmParams {
  const T* a;
  const T* b;
  int M, N, K;
  int lda, ldb;
  int k_per_split;  // K range of blockIdx.y: [y*k_per_split, min(K, (y+1)*k_per_split)), a multiple of kBK
  float* partial;   // split-K: fp32 partials [splits][M][N] (the epilogue runs later); nullptr otherwise
  EpilogueParams<T> ep;
  // Bias gradient fused into the weight gradient (weight_bias_grad_cuda; B not transposed): the blocks
  // of row tile 0 also sum op(B)'s columns over their K range. Without split-K into dbias (+=, as T);
  // with it into dbias_partial [splits][N] (fp32), which bias_backward_add_chunks adds up after.
  T* dbias;
  float* dbias_partial;
};

// Stores a fused bias-gradient column sum (see GemmParams::dbias); blockIdx.y is the split.
template <class T>
__device__ __forceinline__ void store_bias_grad(const GemmParams<T>& p, int col, float sum) {
  gemm_detail::store_bias_grad(p.dbias, p.dbias_partial, p.N, static_cast<int>(blockIdx.y), col, sum);
}

// Block -> (tile_m, tile_n), GROUP_M row tiles at a time (see kGroupM).
__device__ __forceinline__ void block_tile(int tiles_m, int tiles_n, int& tile_m, int& tile_n) {
  tile_coords(static_cast<int>(blockIdx.x), tiles_m, tiles_n, tile_m, tile_n);
}

// ---------------------------------------------------------------------------------------------------
// bf16 tensor-core kernel.

// Shared-memory tiles are rows of 16-byte chunks. The chunk index is XOR-swizzled with the row so that
// the 8 row addresses of one ldmatrix 8x8 matrix (8 consecutive rows, same logical chunk) fall in 8
// distinct 16-byte bank groups, and so do the cp.async writes of 8 consecutive lanes.
template <int kRowChunks>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  static_assert(kRowChunks == 4 || kRowChunks % 8 == 0, "rows of 4 or 8k chunks");
  if constexpr (kRowChunks == 4) {
    // Two rows share a 128-byte bank line: XOR with (row/2) mod 4 spreads 8 rows over 8 groups.
    return row * 4 + (chunk ^ ((row >> 1) & 3));
  } else {
    return row * kRowChunks + (chunk ^ (row & 7));
  }
}

// One operand tile of one stage, kept in the operand's own memory order. kKContiguous (A not
// transposed, B transposed): smem rows are the tile's outer (M or N) index, each holding kBK K values;
// otherwise rows are K, each holding kOuter consecutive M or N values.
template <int kOuter, int kBK, bool kKContiguous>
struct TileLayout {
  static constexpr int kRows = kKContiguous ? kOuter : kBK;
  static constexpr int kRowChunks = (kKContiguous ? kBK : kOuter) / 8;
  __device__ static __forceinline__ int offset(int row, int chunk) { return swizzle<kRowChunks>(row, chunk) * 8; }
};

// Loads the kOuter x kBK tile at (outer0, k0) of an operand with leading dimension ld into shared
// memory. kAsync: 16-byte cp.async with zero-fill (needs ld % 8 == 0 and a 16-byte aligned base, so a
// chunk never straddles a bound); otherwise element loads with per-element bounds (any ld, alignment).
template <int kOuter, int kBK, bool kKContiguous, bool kAsync, int kThreads>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* g, int ld, int outer0, int outer_end, int k0, int k_end,
                                          int tid) {
  using L = TileLayout<kOuter, kBK, kKContiguous>;
  constexpr int kChunks = L::kRows * L::kRowChunks;
  static_assert(kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = tid + it * kThreads;
    const int row = i / L::kRowChunks, chunk = i % L::kRowChunks;
    // (outer, k) of the chunk's first element; the chunk runs along k when kKContiguous, else along outer.
    const int outer = kKContiguous ? outer0 + row : outer0 + chunk * 8;
    const int k = kKContiguous ? k0 + chunk * 8 : k0 + row;
    const size_t goff = kKContiguous ? static_cast<size_t>(outer) * ld + k : static_cast<size_t>(k) * ld + outer;
    bf16* dst = s + L::offset(row, chunk);
    if constexpr (kAsync) {
      const bool valid = outer < outer_end && k < k_end;
      cp_async_16(dst, valid ? g + goff : g, valid);
    } else {
      alignas(16) bf16 v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const bool valid = kKContiguous ? (outer < outer_end && k + e < k_end) : (outer + e < outer_end && k < k_end);
        v[e] = valid ? g[goff + e] : __float2bfloat16_rn(0.0f);
      }
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
    }
  }
}

template <bool kTransA, bool kTransB, bool kAsync, GemmEpilogue kEp>
__global__ void __launch_bounds__(TcTile::kThreads, 2) gemm_bf16_mma_sync_multistage(const GemmParams<bf16> p) {
  cuda::griddep_launch_dependents_then_wait();
  using Cfg = TcTile;
  constexpr int kBM = Cfg::kBM, kBN = Cfg::kBN, kBK = Cfg::kBK, kStages = Cfg::kStages;
  // A is K-contiguous unless transposed; B is K-contiguous only when transposed.
  using LA = TileLayout<kBM, kBK, !kTransA>;
  using LB = TileLayout<kBN, kBK, kTransB>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  auto stage_a = [&](int s) { return smem + s * Cfg::kStageElems; };
  auto stage_b = [&](int s) { return smem + s * Cfg::kStageElems + kBM * kBK; };

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / Cfg::kWarpsN, wn = warp % Cfg::kWarpsN;
  int tile_m, tile_n;
  block_tile(static_cast<int>(ceil_div(p.M, kBM)), static_cast<int>(ceil_div(p.N, kBN)), tile_m, tile_n);
  const int m0 = tile_m * kBM, n0 = tile_n * kBN;
  const int k_begin = blockIdx.y * p.k_per_split;
  const int k_end = min(p.K, k_begin + p.k_per_split);
  const int k_tiles = k_end > k_begin ? static_cast<int>(ceil_div(k_end - k_begin, kBK)) : 0;
  // Fused bias gradient: thread tid sums column n0 + tid of each staged B tile (rows are K; the zero-filled
  // rows past k_end add nothing). Block-uniform, so only row tile 0 pays for it. Not in the
  // register-staged variant (kAsync false), which is at the 255-register limit already.
  static_assert(Cfg::kThreads == kBN, "one bias-gradient column per thread");
  constexpr bool kCanBiasGrad = !kTransB && kAsync;
  const bool bias_grad = kCanBiasGrad && tile_m == 0 && (p.dbias != nullptr || p.dbias_partial != nullptr);
  float bias_sum = 0.0f, bias_c = 0.0f;

  auto load_stage = [&](int s, int kt) {
    const int k0 = k_begin + kt * kBK;
    load_tile<kBM, kBK, !kTransA, kAsync, Cfg::kThreads>(stage_a(s), p.a, p.lda, m0, p.M, k0, k_end, tid);
    load_tile<kBN, kBK, kTransB, kAsync, Cfg::kThreads>(stage_b(s), p.b, p.ldb, n0, p.N, k0, k_end, tid);
  };

  float acc[Cfg::kMTiles][Cfg::kNTiles][4];
#pragma unroll
  for (int i = 0; i < Cfg::kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  // ldmatrix lane roles: lanes 8j..8j+7 give the 8 row addresses of matrix j of an x4 load.
  const int mat = lane >> 3, mat_row = lane & 7;

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt visible to all; everyone is done with the buffer refilled next
    if (kt + kStages - 1 < k_tiles) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();

    const bf16* sa = stage_a(kt % kStages);
    const bf16* sb = stage_b(kt % kStages);
    if constexpr (kCanBiasGrad) {
      if (bias_grad) {
        // A warp reads 4 distinct chunks of one swizzled row: 16 distinct banks, no conflicts.
        const int chunk = tid / 8, e = tid % 8;
        float t = 0.0f;
#pragma unroll
        for (int r = 0; r < kBK; ++r) t += to_f32(sb[LB::offset(r, chunk) + e]);
        kahan_add(bias_sum, bias_c, t);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[Cfg::kMTiles][4];
      uint32_t bfr[Cfg::kNTiles][2];
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
        const int mbase = wm * Cfg::kWM + mt * 16;
        if constexpr (!kTransA) {
          // smem [m][k]: matrices (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15) (m8-15,k8-15) = a0..a3.
          const int row = mbase + (lane & 15), chunk = kk / 8 + (lane >> 4);
          ldmatrix_x4(af[mt], sa + LA::offset(row, chunk));
        } else {
          // smem [k][m]: the same four matrices, transposed on load.
          const int row = kk + mat_row + (mat >> 1) * 8, chunk = (mbase + (mat & 1) * 8) / 8;
          ldmatrix_x4_trans(af[mt], sa + LA::offset(row, chunk));
        }
      }
#pragma unroll
      for (int np = 0; np < Cfg::kNTiles / 2; ++np) {
        const int nbase = wn * Cfg::kWN + np * 16;
        uint32_t r[4];
        if constexpr (kTransB) {
          // smem [n][k]: matrices (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7) (n8-15,k8-15).
          const int row = nbase + mat_row + (mat >> 1) * 8, chunk = kk / 8 + (mat & 1);
          ldmatrix_x4(r, sb + LB::offset(row, chunk));
        } else {
          // smem [k][n]: matrices (k0-7,n0-7) (k8-15,n0-7) (k0-7,n8-15) (k8-15,n8-15), transposed on load.
          const int row = kk + mat_row + (mat & 1) * 8, chunk = (nbase + (mat >> 1) * 8) / 8;
          ldmatrix_x4_trans(r, sb + LB::offset(row, chunk));
        }
        bfr[2 * np][0] = r[0], bfr[2 * np][1] = r[1], bfr[2 * np + 1][0] = r[2], bfr[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < Cfg::kNTiles; ++nt) mma_bf16_16816(acc[mt][nt], af[mt], bfr[nt][0], bfr[nt][1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the epilogue's staging tile

  // Accumulator fragment: c0,c1 at (row g, cols 2t,2t+1), c2,c3 at (row g+8, same cols).
  float* sc = reinterpret_cast<float*>(smem_raw);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < Cfg::kNTiles; ++nt) {
      const int r = wm * Cfg::kWM + mt * 16 + g, c = wn * Cfg::kWN + nt * 8 + 2 * t;
      *reinterpret_cast<float2*>(sc + r * Cfg::kCStride + c) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
      *reinterpret_cast<float2*>(sc + (r + 8) * Cfg::kCStride + c) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
    }
  __syncthreads();

  // A warp finishes one 128-column row segment at a time: 32 lanes x 4 columns, coalesced.
  float* part = p.partial ? p.partial + static_cast<size_t>(blockIdx.y) * p.M * p.N : nullptr;
  gemm_detail::finish_staged_tile<bf16, kEp, kBM, kBN / 4, Cfg::kThreads, 4, false>(
      sc, gemm_detail::PaddedStaging{Cfg::kCStride}, m0, n0, p.M, p.N, part, p.ep, tid);
  if (bias_grad) store_bias_grad(p, n0 + tid, bias_sum);
}

// ---------------------------------------------------------------------------------------------------
// fp32 SIMT kernel.

template <bool kTransA, bool kTransB, GemmEpilogue kEp>
__global__ void __launch_bounds__(SimtTile::kThreads) gemm_f32_simt_8x8(const GemmParams<float> p) {
  cuda::griddep_launch_dependents_then_wait();
  using Cfg = SimtTile;
  constexpr int kBM = Cfg::kBM, kBN = Cfg::kBN, kBK = Cfg::kBK, kL = Cfg::kLoadsPerThread;
  // Both tiles stored K-major ([k][m], [k][n]) so the compute loop reads float4 rows.
  __shared__ __align__(16) float sa[kBK][kBM + Cfg::kPad];
  __shared__ __align__(16) float sb[kBK][kBN + Cfg::kPad];

  const int tid = threadIdx.x;
  int tile_m, tile_n;
  block_tile(static_cast<int>(ceil_div(p.M, kBM)), static_cast<int>(ceil_div(p.N, kBN)), tile_m, tile_n);
  const int m0 = tile_m * kBM, n0 = tile_n * kBN;
  const int k_begin = blockIdx.y * p.k_per_split;
  const int k_end = min(p.K, k_begin + p.k_per_split);
  const int k_tiles = k_end > k_begin ? static_cast<int>(ceil_div(k_end - k_begin, kBK)) : 0;
  // Fused bias gradient (see the bf16 kernel): threads 0 .. kBN-1 sum one column of each B tile.
  const bool bias_grad = !kTransB && tile_m == 0 && (p.dbias != nullptr || p.dbias_partial != nullptr) && tid < kBN;
  float bias_sum = 0.0f, bias_c = 0.0f;

  // Element e of a tile: consecutive lanes walk the operand's contiguous dimension (coalesced loads).
  auto a_coords = [](int e, int& mm, int& kk) {
    if constexpr (kTransA)
      mm = e % kBM, kk = e / kBM;
    else
      kk = e % kBK, mm = e / kBK;
  };
  auto b_coords = [](int e, int& nn, int& kk) {
    if constexpr (kTransB)
      kk = e % kBK, nn = e / kBK;
    else
      nn = e % kBN, kk = e / kBN;
  };
  float ra[kL], rb[kL];
  auto load_global = [&](int kt) {
    const int k0 = k_begin + kt * kBK;
#pragma unroll
    for (int i = 0; i < kL; ++i) {
      const int e = tid + i * Cfg::kThreads;
      int mm, nn, kk, kb;
      a_coords(e, mm, kk);
      const int gm = m0 + mm, gk = k0 + kk;
      ra[i] = (gm < p.M && gk < k_end)
                  ? p.a[kTransA ? static_cast<size_t>(gk) * p.lda + gm : static_cast<size_t>(gm) * p.lda + gk]
                  : 0.0f;
      b_coords(e, nn, kb);
      const int gn = n0 + nn, gkb = k0 + kb;
      rb[i] = (gn < p.N && gkb < k_end)
                  ? p.b[kTransB ? static_cast<size_t>(gn) * p.ldb + gkb : static_cast<size_t>(gkb) * p.ldb + gn]
                  : 0.0f;
    }
  };
  auto store_shared = [&]() {
#pragma unroll
    for (int i = 0; i < kL; ++i) {
      const int e = tid + i * Cfg::kThreads;
      int mm, nn, kk, kb;
      a_coords(e, mm, kk);
      b_coords(e, nn, kb);
      sa[kk][mm] = ra[i];
      sb[kb][nn] = rb[i];
    }
  };

  const int tx = tid % 16, ty = tid / 16;
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

  if (k_tiles > 0) {
    load_global(0);
    store_shared();
    __syncthreads();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    if (kt + 1 < k_tiles) load_global(kt + 1);  // in flight while this tile is computed
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      float av[8], bv[8];
      load4(&sa[k][ty * 4], av);
      load4(&sa[k][64 + ty * 4], av + 4);
      load4(&sb[k][tx * 4], bv);
      load4(&sb[k][64 + tx * 4], bv + 4);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    if (bias_grad) {
      float t = 0.0f;
#pragma unroll
      for (int k = 0; k < kBK; ++k) t += sb[k][tid];
      kahan_add(bias_sum, bias_c, t);
    }
    __syncthreads();
    if (kt + 1 < k_tiles) {
      store_shared();
      __syncthreads();
    }
  }

  float* part = p.partial ? p.partial + static_cast<size_t>(blockIdx.y) * p.M * p.N : nullptr;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
    if (row >= p.M) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = n0 + h * 64 + tx * 4;
      if (col >= p.N) continue;
      float v[4] = {acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]};
      if (part)
        store_partial4(part, p.N, p.ep.vec4, row, col, v);
      else
        apply_epilogue4<float, kEp>(p.ep, row, col, v);
    }
  }
  if (bias_grad) store_bias_grad(p, n0 + tid, bias_sum);
}

// ---------------------------------------------------------------------------------------------------
// Split-K: C = epilogue(sum over splits s = 0, 1, ... of partial[s]), always in that order.

// Outputs (row, col .. col + 3): the splits' partials summed in split order, then the epilogue.
template <class T, GemmEpilogue kEp>
__device__ __forceinline__ void reduce_splits4(const float* __restrict__ partial, int splits, const EpilogueParams<T>& ep,
                                               int row, int col) {
  const size_t slice = static_cast<size_t>(ep.M) * ep.N, idx = static_cast<size_t>(row) * ep.N + col;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s = 0; s < splits; ++s) {
    const float* src = partial + s * slice + idx;
    if (ep.vec4) {
      float x[4];
      load4(src, x);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] += x[j];
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (col + j < ep.N) v[j] += src[j];
    }
  }
  apply_epilogue4<T, kEp>(ep, row, col, v);
}

template <class T, GemmEpilogue kEp>
__global__ void __launch_bounds__(kElementwiseThreads)
    gemm_splitk_reduce_epilogue(const float* __restrict__ partial, int splits, const EpilogueParams<T> ep) {
  cuda::griddep_launch_dependents_then_wait();
  const int n4 = static_cast<int>(ceil_div(ep.N, 4));
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long>(ep.M) * n4) return;
  reduce_splits4<T, kEp>(partial, splits, ep, static_cast<int>(i / n4), static_cast<int>(i % n4) * 4);
}

// The same for a wgmma split tail alone (gemm_hand): blocks (b, y) take output tile tile0 + b of the tile
// order (bm x bn tiles, tiles_m x tiles_n of them), rows_per_block = blockDim.x / (bn / 4) of its rows from
// y * rows_per_block on, a vector of 4 each thread; the other tiles were finished by the GEMM itself. A
// tail has few tiles (12 for the MLP's weight gradients): a block per tile would read the partials on 12
// SMs, so each tile is spread over bm / rows_per_block blocks.
template <class T, GemmEpilogue kEp>
__global__ void __launch_bounds__(kElementwiseThreads)
    gemm_splitk_reduce_tiles(const float* __restrict__ partial, int splits, const EpilogueParams<T> ep, int tile0,
                             int tiles_m, int tiles_n, int bm, int bn) {
  cuda::griddep_launch_dependents_then_wait();
  int tile_m, tile_n;
  gemm_detail::tile_coords(tile0 + static_cast<int>(blockIdx.x), tiles_m, tiles_n, tile_m, tile_n);
  const int bn4 = bn / 4, rows_per_block = static_cast<int>(blockDim.x) / bn4;
  const int r = static_cast<int>(blockIdx.y) * rows_per_block + static_cast<int>(threadIdx.x) / bn4;
  const int row = tile_m * bm + r, col = tile_n * bn + (static_cast<int>(threadIdx.x) % bn4) * 4;
  if (r < bm && row < ep.M && col < ep.N) reduce_splits4<T, kEp>(partial, splits, ep, row, col);
}

// ---------------------------------------------------------------------------------------------------
// Bias gradient.

// scratch[chunk][col] = sum of dout[row][col] over the chunk's rows (fp32, fixed order).
template <class T, bool kVec>
__global__ void __launch_bounds__(kBiasThreadsX* kBiasThreadsY)
    bias_backward_chunk_colsum(float* __restrict__ scratch, const T* __restrict__ dout, int N, int OC) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int kV = cuda::Packed128<T>::kSize;  // columns per thread
  constexpr int kCols = kBiasThreadsX * kV;      // columns per block
  __shared__ float red[kBiasThreadsY][kCols];
  const int col0 = blockIdx.x * kCols + threadIdx.x * kV;
  const int r_begin = blockIdx.y * kBiasRowsPerChunk, r_end = min(N, r_begin + kBiasRowsPerChunk);
  float s[kV];
#pragma unroll
  for (int j = 0; j < kV; ++j) s[j] = 0.0f;
  for (int r = r_begin + threadIdx.y; r < r_end; r += kBiasThreadsY) {
    const T* row = dout + static_cast<size_t>(r) * OC;
    if constexpr (kVec) {
      if (col0 < OC) {  // OC % kV == 0: the whole vector is in bounds
        const cuda::Packed128<T> x = cuda::load128cs(row + col0);
#pragma unroll
        for (int j = 0; j < kV; ++j) s[j] += to_f32(x[j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kV; ++j)
        if (col0 + j < OC) s[j] += to_f32(row[col0 + j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kV; ++j) red[threadIdx.y][threadIdx.x * kV + j] = s[j];
  __syncthreads();
  if (threadIdx.y == 0) {
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      const int col = col0 + j;
      if (col >= OC) break;
      float t = 0.0f;
#pragma unroll
      for (int y = 0; y < kBiasThreadsY; ++y) t += red[y][threadIdx.x * kV + j];
      scratch[static_cast<size_t>(blockIdx.y) * OC + col] = t;
    }
  }
}

// dbias[col] += sum over chunks c = 0, 1, ... of scratch[c * ld + col], for col < OC (ld >= OC: the
// chunks' row length, when dbias and scratch point into the last columns of wider ones). S: fp32 partial
// sums, or the bf16 sums of cuBLASLt's bias-gradient epilogue (weight_bias_grad_cuda).
template <class T, class S = float>
__global__ void __launch_bounds__(kElementwiseThreads)
    bias_backward_add_chunks(T* __restrict__ dbias, const S* __restrict__ scratch, int chunks, int OC, int ld) {
  cuda::griddep_launch_dependents_then_wait();
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= OC) return;
  float s = 0.0f;
  for (int c = 0; c < chunks; ++c) s += to_f32(scratch[static_cast<size_t>(c) * ld + col]);
  dbias[col] = from_f32<T>(to_f32(dbias[col]) + s);
}

// ---------------------------------------------------------------------------------------------------
// Host side.

// Runtime flags -> template parameters: gemm_common.cuh's dispatch_bool and dispatch_epilogue.
using gemm_detail::dispatch_bool;
using gemm_detail::dispatch_epilogue;

// Tile sizes and what the split-K model assumes of each hand kernel: resident blocks per SM (registers
// and shared memory allow) and the rate it sustains with every block slot busy.
template <class T>
struct HandTile;
template <>
struct HandTile<float> {
  static constexpr int kBM = SimtTile::kBM, kBN = SimtTile::kBN, kBK = SimtTile::kBK;
  static constexpr int kBlocksPerSm = 1;          // 256 threads x ~190 registers
  static constexpr double kSustainedTflops = 40;  // of 67 TFLOP/s fp32 FMA peak
};
template <>
struct HandTile<bf16> {
  static constexpr int kBM = TcTile::kBM, kBN = TcTile::kBN, kBK = TcTile::kBK;
  static constexpr int kBlocksPerSm = 2;           // 128 threads x ~240 registers, 68 KB shared memory
  static constexpr double kSustainedTflops = 600;  // mma.sync on H100
};

// What the split-K model knows of a kernel: its output tile and K step, the blocks resident per SM, and
// the throughput it sustains with every slot busy.
struct SplitModel {
  int bm, bn, bk, blocks_per_sm;
  double sustained_tflops;
};
template <class T>
SplitModel hand_split_model() {
  using H = HandTile<T>;
  return {H::kBM, H::kBN, H::kBK, H::kBlocksPerSm, H::kSustainedTflops};
}
// The wgmma kernel: one persistent block per SM over 128 x N tiles in K steps of 64 (its units run in
// waves of the SM count just as separate blocks would; ping-pong's two warpgroups share the SM);
// 700 TFLOP/s, a guess until a GPU measures it.
SplitModel wgmma_split_model(GemmWgmmaKernel k) {
  return {128, k == GemmWgmmaKernel::k128x256 ? 256 : 128, 64, 1, 700};
}
#if defined(GPT2_HAVE_SM90A)
static_assert(gemm_detail::kWgmmaBK == 64, "wgmma_split_model's K step");
#endif

// The split of K with the least modelled time; ties keep the smaller split. With tail_split (the wgmma
// kernel) it may also take the tiles of the whole waves of slots unsplit and split only the rest, the tail
// (GemmSplitPlan): a weight gradient of 144 tiles on 132 slots otherwise runs a second wave of K for 12 tiles
// (split 1) or writes and reads every tile's partials s times over (split s); split, only the tail's.
GemmSplitPlan choose_split_plan(const SplitModel& m, int M, int N, int K, size_t ws_bytes, bool tail_split) {
  const long tiles = ceil_div(M, m.bm) * ceil_div(N, m.bn);
  const long slots = static_cast<long>(kSplitModelSms) * m.blocks_per_sm;
  // ns for one block to advance one unit of K when every slot is busy.
  const double block_k_ns = 2.0 * m.bm * m.bn / (m.sustained_tflops * 1e3 / static_cast<double>(slots));
  const double mn_bytes = static_cast<double>(M) * N * sizeof(float);
  const auto fits = [&](int s) {
    return s == 1 || (K / s >= kSplitMinK && s * mn_bytes <= static_cast<double>(ws_bytes));
  };
  const auto k_range = [&](int s) { return static_cast<double>(ceil_div(ceil_div(K, s), m.bk) * m.bk); };
  const auto waves = [&](long units) { return static_cast<double>(ceil_div(units, slots)); };
  GemmSplitPlan best;
  double best_t = 0;
  for (int s = 1; s <= kMaxSplits && fits(s); ++s) {
    const double t = waves(tiles * s) * k_range(s) * block_k_ns + (s > 1 ? 2.0 * s * mn_bytes / kSplitModelHbmBytesPerNs : 0.0);
    if (s == 1 || t < best_t * (1.0 - 1e-9)) {
      best_t = t;
      best = {s, 0};
    }
  }
  const long full = tiles / slots * slots;  // the tiles of whole waves
  if (!tail_split || full == 0 || full == tiles) return best;
  // The tail's partials: its tiles' alone (the workspace still holds whole planes: fits() as above). The
  // second launch of the GEMM costs kTailLaunchNs more, and the plan must win by kTailMargin.
  const double tile_bytes = static_cast<double>(m.bm) * m.bn * sizeof(float);
  GemmSplitPlan tail{1, 0};
  double tail_t = 0;
  for (int s = 2; s <= kMaxSplits && fits(s); ++s) {
    const double t = waves(full) * k_range(1) * block_k_ns + waves((tiles - full) * s) * k_range(s) * block_k_ns +
                     2.0 * s * (tiles - full) * tile_bytes / kSplitModelHbmBytesPerNs + kTailLaunchNs;
    if (tail.splits == 1 || t < tail_t * (1.0 - 1e-9)) {
      tail_t = t;
      tail = {s, static_cast<int>(full)};
    }
  }
  return tail.splits > 1 && tail_t < best_t * kTailMargin ? tail : best;
}

// K per split (a multiple of the K step) and the number of non-empty splits it gives.
template <class T>
void split_k_range(int K, int splits, int& k_per_split, int& used) {
  constexpr int kBK = HandTile<T>::kBK;
  k_per_split = static_cast<int>(ceil_div(ceil_div(K, splits), kBK) * kBK);
  used = static_cast<int>(ceil_div(K, k_per_split));
}

template <bool kTransA, bool kTransB, bool kAsync, GemmEpilogue kEp>
void launch_bf16_tc(const GemmParams<bf16>& p, int splits, cudaStream_t stream) {
  auto kernel = gemm_bf16_mma_sync_multistage<kTransA, kTransB, kAsync, kEp>;
  cuda::allow_dynamic_smem(kernel, TcTile::kSmemBytes);
  const long tiles = ceil_div(p.M, TcTile::kBM) * ceil_div(p.N, TcTile::kBN);
  cuda::launch_kernel(kernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), TcTile::kThreads,
                      TcTile::kSmemBytes, stream, p);
  CUDA_CHECK_LAUNCH();
}

template <bool kTransA, bool kTransB, GemmEpilogue kEp>
void launch_f32_simt(const GemmParams<float>& p, int splits, cudaStream_t stream) {
  const long tiles = ceil_div(p.M, SimtTile::kBM) * ceil_div(p.N, SimtTile::kBN);
  cuda::launch_kernel(gemm_f32_simt_8x8<kTransA, kTransB, kEp>,
                      dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), SimtTile::kThreads, 0, stream,
                      p);
  CUDA_CHECK_LAUNCH();
}

// The bf16 kernel for these operands (see GemmHandPath). The wgmma kernel takes every transpose
// combination directly (the wgmma transpose immediates cover MN-major A and B), so the fallback to
// mma.sync is for what TMA cannot describe: a base not 16-byte aligned or a leading dimension that is not
// a multiple of 8 elements (tensor-map strides are multiples of 16 bytes); and for the scalar-loader
// test hook, which exists to exercise the mma.sync kernel.
GemmHandPath choose_hand_path(const GemmContext& ctx, const bf16* a, const bf16* b, int M, int N, int K, bool trans_a,
                              bool trans_b) {
  if (ctx.backend() != GemmBackend::kHand) return GemmHandPath::kMmaSync;
  const GemmTestHooks& hooks = ctx.test_hooks();
  if (hooks.hand_path == GemmHandPath::kMmaSync || hooks.hand_force_scalar_loads) return GemmHandPath::kMmaSync;
  if (hooks.hand_path == GemmHandPath::kWgmma) {
    GPT2_CHECK(gemm_hand_wgmma_available(),
               "the wgmma GEMM path was forced, but it needs a compute capability 9.0 device and a build whose "
               "CUDA architectures include 90");
  } else if (!ctx.hand_wgmma_enabled()) {
    return GemmHandPath::kMmaSync;
  }
#if defined(GPT2_HAVE_SM90A)
  return gemm_detail::wgmma_takes(a, b, trans_a ? M : K, trans_b ? K : N) ? GemmHandPath::kWgmma
                                                                          : GemmHandPath::kMmaSync;
#else
  (void)a, (void)b, (void)M, (void)N, (void)K, (void)trans_a, (void)trans_b;
  return GemmHandPath::kMmaSync;  // not reached: gemm_hand_wgmma_available() is false in this build
#endif
}

// Whether the mma.sync kernel stages tiles with 16-byte cp.async (leading dimensions multiples of 8,
// 16-byte aligned bases) rather than through registers.
inline bool mma_sync_async_loads(const GemmContext& ctx, const void* a, const void* b, int lda, int ldb) {
  return !ctx.test_hooks().hand_force_scalar_loads && lda % 8 == 0 && ldb % 8 == 0 && aligned_to(a, 16) &&
         aligned_to(b, 16);
}

// dbias (optional; B not transposed; the SIMT, wgmma and mma.sync kernels, the last in its cp.async variant):
// dbias += column sums of B, fused (see GemmParams::dbias); bias_scratch holds the split-K partial sums,
// kMaxSplits x N floats.
template <class T>
void gemm_hand(GemmContext& ctx, T* c, const T* a, const T* b, const T* bias, T* aux, int M, int N, int K, bool trans_a,
               bool trans_b, bool accumulate, GemmEpilogue ep, cudaStream_t stream, T* dbias = nullptr,
               float* bias_scratch = nullptr) {
  EpilogueParams<T> epp;
  epp.c = c, epp.bias = bias, epp.aux = aux, epp.M = M, epp.N = N, epp.accumulate = accumulate;
  const size_t vec_bytes = 4 * sizeof(T);
  epp.vec4 = N % 4 == 0 && aligned_to(c, vec_bytes) && (bias == nullptr || aligned_to(bias, vec_bytes)) &&
             (aux == nullptr || aligned_to(aux, vec_bytes));

  bool wgmma = false;
  if constexpr (std::is_same_v<T, bf16>)
    wgmma = choose_hand_path(ctx, a, b, M, N, K, trans_a, trans_b) == GemmHandPath::kWgmma;
  const GemmWgmmaKernel wgmma_kernel = gemm_wgmma_kernel_for(ctx.hand_wgmma_kernel(), trans_a, ep);
  record_kernel_path("gemm", wgmma                            ? hand_wgmma_path_name(wgmma_kernel)
                             : std::is_same_v<T, bf16> ? "hand mma.sync"
                                                       : "hand simt");
  const GemmSplitPlan plan =
      gemm_hand_split_plan<T>(ctx, M, N, K, wgmma ? GemmHandPath::kWgmma : GemmHandPath::kMmaSync, trans_a, ep);
  const int splits = plan.splits;
  int k_per_split = 0, used = 1;
  // A split tail (wgmma): tiles [0, tail_from) whole in a first launch; the others, split, in a second.
  int tail_from = 0;
  int tiles_m = 0, tiles_n = 0, tile_n = 0;
  // With split-K the main kernel only writes partials; the reduction applies the epilogue.
  GPT2_CHECK(dbias == nullptr || (!trans_b && ep == GemmEpilogue::kNone),
             "fused bias gradient: B not transposed, no epilogue");
  if constexpr (std::is_same_v<T, bf16>)
    GPT2_CHECK(dbias == nullptr || wgmma || mma_sync_async_loads(ctx, a, b, trans_a ? M : K, trans_b ? K : N),
               "fused bias gradient: not on the mma.sync kernel's register-staged variant");
  if (wgmma) {
#if defined(GPT2_HAVE_SM90A)
    if constexpr (std::is_same_v<T, bf16>) {
      // The split factor of the wgmma model (gemm_hand_split_plan), with ranges in the wgmma kernel's K step.
      k_per_split = static_cast<int>(ceil_div(ceil_div(K, splits), gemm_detail::kWgmmaBK) * gemm_detail::kWgmmaBK);
      used = static_cast<int>(ceil_div(K, k_per_split));
      const int tiles = gemm_detail::wgmma_tiles(wgmma_kernel, M, N);
      tile_n = gemm_detail::wgmma_tile_n(wgmma_kernel);
      tiles_m = static_cast<int>(ceil_div(M, 128)), tiles_n = static_cast<int>(ceil_div(N, tile_n));
      if (used > 1 && plan.tail_from > 0 && plan.tail_from < tiles) tail_from = plan.tail_from;
      const int max_blocks = ctx.test_hooks().wgmma_max_blocks;
      const bool tma_aux = !ctx.test_hooks().wgmma_aux_from_global;
      const bool prefetch_aux = !ctx.test_hooks().wgmma_no_aux_prefetch;
      const bool bulk_store = ctx.test_hooks().wgmma_bulk_store;
      using gemm_detail::WgmmaAuxRead;
      WgmmaAuxRead aux_read = WgmmaAuxRead::kEpilogue;
      bool bulk_stored = false;
      const auto note_aux = [&](gemm_detail::WgmmaRan r) {
        if (r.aux != WgmmaAuxRead::kEpilogue) aux_read = r.aux;
        bulk_stored = bulk_stored || r.bulk_store;
      };
      if (tail_from > 0) {  // the whole tiles, finished here (their bias-gradient columns into dbias)
        const int k_whole = static_cast<int>(ceil_div(K, gemm_detail::kWgmmaBK) * gemm_detail::kWgmmaBK);
        note_aux(gemm_detail::gemm_bf16_wgmma(wgmma_kernel, max_blocks, tma_aux, prefetch_aux, bulk_store, a, b, M, N,
                                              K, trans_a, trans_b, k_whole, 1, 0, tail_from, nullptr, epp, ep, dbias,
                                              nullptr, stream));
      }
      // Every tile, or the tail: partials into the workspace when split, the epilogue applied after.
      note_aux(gemm_detail::gemm_bf16_wgmma(wgmma_kernel, max_blocks, tma_aux, prefetch_aux, bulk_store, a, b, M, N, K,
                                            trans_a, trans_b, k_per_split, used, tail_from, tiles - tail_from,
                                            used > 1 ? ctx.splitk_workspace() : nullptr, epp,
                                            used > 1 ? GemmEpilogue::kNone : ep, used > 1 ? nullptr : dbias,
                                            used > 1 && dbias != nullptr ? bias_scratch : nullptr, stream));
      if (aux_read == WgmmaAuxRead::kTma) ++ctx.test_hooks().wgmma_aux_tma_launches;
      if (aux_read == WgmmaAuxRead::kPrefetchL2) ++ctx.test_hooks().wgmma_aux_prefetch_launches;
      if (bulk_stored) {
        ++ctx.test_hooks().wgmma_bulk_store_launches;
        record_kernel_path("gemm store", "bulk");  // only where asked for: the default line stays as it was
      }
      if (tail_from > 0) ++ctx.test_hooks().wgmma_split_tails;
    }
#endif
  } else {
    split_k_range<T>(K, splits, k_per_split, used);
    GemmParams<T> p;
    p.a = a, p.b = b, p.M = M, p.N = N, p.K = K;
    p.lda = trans_a ? M : K;
    p.ldb = trans_b ? K : N;
    p.k_per_split = k_per_split;
    p.partial = used > 1 ? ctx.splitk_workspace() : nullptr;
    p.ep = epp;
    p.dbias = used > 1 ? nullptr : dbias;
    p.dbias_partial = used > 1 && dbias != nullptr ? bias_scratch : nullptr;
    const GemmEpilogue main_ep = used > 1 ? GemmEpilogue::kNone : ep;

    dispatch_bool(trans_a, [&](auto ta) {
      dispatch_bool(trans_b, [&](auto tb) {
        dispatch_epilogue(main_ep, [&](auto e) {
          if constexpr (std::is_same_v<T, bf16>) {
            dispatch_bool(mma_sync_async_loads(ctx, a, b, p.lda, p.ldb), [&](auto as) {
              launch_bf16_tc<decltype(ta)::value, decltype(tb)::value, decltype(as)::value, decltype(e)::value>(p, used,
                                                                                                                stream);
            });
          } else {
            launch_f32_simt<decltype(ta)::value, decltype(tb)::value, decltype(e)::value>(p, used, stream);
          }
        });
      });
    });
  }

  if (used > 1) {
    dispatch_epilogue(ep, [&](auto e) {
      if (tail_from > 0) {  // the tail's tiles alone
        const int tail = tiles_m * tiles_n - tail_from;
        const int rows_per_block = kElementwiseThreads / (tile_n / 4);  // 8 (128 wide) or 4 (256 wide)
        const dim3 grid(static_cast<unsigned>(tail), static_cast<unsigned>(ceil_div(128, rows_per_block)));
        cuda::launch_kernel(gemm_splitk_reduce_tiles<T, decltype(e)::value>, grid, kElementwiseThreads, 0, stream,
                            ctx.splitk_workspace(), used, epp, tail_from, tiles_m, tiles_n, 128, tile_n);
      } else {
        const long n = static_cast<long>(M) * ceil_div(N, 4);
        cuda::launch_kernel(gemm_splitk_reduce_epilogue<T, decltype(e)::value>,
                            static_cast<unsigned>(ceil_div(n, kElementwiseThreads)), kElementwiseThreads, 0, stream,
                            ctx.splitk_workspace(), used, epp);
      }
      CUDA_CHECK_LAUNCH();
    });
    if (dbias != nullptr) {  // the splits' column sums, in split order
      GPT2_CHECK(used <= kMaxSplits, "fused bias gradient: " << used << " splits, scratch for " << kMaxSplits);
      // With a split tail, only the columns whose row-0 tile is in the tail have partial sums: the last
      // ones (gemm_common.cuh, first_row0_tile_from); the first launch added the others into dbias itself.
      const int col0 =
          tail_from > 0 ? std::min(N, gemm_detail::first_row0_tile_from(tail_from, tiles_m, tiles_n) * tile_n) : 0;
      if (col0 < N) {
        cuda::launch_kernel(bias_backward_add_chunks<T>, static_cast<unsigned>(ceil_div(N - col0, kElementwiseThreads)),
                            kElementwiseThreads, 0, stream, dbias + col0, bias_scratch + col0, used, N - col0, N);
        CUDA_CHECK_LAUNCH();
      }
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Public entry points.

bool gemm_hand_wgmma_available() {
#if defined(GPT2_HAVE_SM90A)
  return gemm_detail::wgmma_device_ready();
#else
  return false;
#endif
}

GemmContext::GemmContext(GemmBackend backend) : backend_(backend) {
  if (backend_ == GemmBackend::kHand) {
    // Unset: the wgmma kernel that ran the 124M step fastest on an H100 and an H200 (128x256: 358.0K and
    // 383.4K tok/s, mma.sync 275.9K on the H100; docs/performance.md). Checked before the workspace is
    // allocated: a harness that goes on after an error (bench_gpu_kernels) must not leak it.
    const char* env = std::getenv("GPT2_GEMM_SM90");
    const std::string choice = env != nullptr ? env : "";
    GemmWgmmaKernel kernel = choice.empty() ? GemmWgmmaKernel::k128x256 : GemmWgmmaKernel::kDefault;
    for (GemmWgmmaKernel k : {GemmWgmmaKernel::k128x128, GemmWgmmaKernel::k128x256,
                              GemmWgmmaKernel::k128x128PingPong, GemmWgmmaKernel::kByShape})
      if (choice == gemm_wgmma_kernel_name(k)) kernel = k;
    if (choice == "1") kernel = GemmWgmmaKernel::k128x128;
    GPT2_CHECK(choice == "0" || kernel != GemmWgmmaKernel::kDefault,
               "GPT2_GEMM_SM90='" << choice
                                  << "': use 128x256 (the default on compute capability 9.0: the wgmma kernel with "
                                     "128x256 tiles), 1 or 128x128 (its 128x128 tiles), 128x128-pingpong (those on "
                                     "a ping-pong schedule), by-shape (one of them for each product) or 0 (mma.sync)");
    hand_wgmma_kernel_ = gemm_hand_wgmma_available() ? kernel : GemmWgmmaKernel::kDefault;
    // GPT2_GEMM_AUX_PREFETCH=0: the wgmma kernels that read the GELU gradient's pre-activations in the
    // epilogue (128x256) do so without prefetching them into L2 first (the end-to-end A/B of that prefetch)
    hooks_.wgmma_no_aux_prefetch = !choice_from_env<bool>(
        "GPT2_GEMM_AUX_PREFETCH", "setting of the wgmma GEMM's L2 prefetch of the GELU gradient's pre-activations",
        {{"1", true}, {"0", false}});
    // GPT2_GEMM_STORE=bulk (opt-in): the wgmma epilogue copies its finished rows out with cp.async.bulk, which
    // drain under the next tile's products, instead of its threads storing them (docs/performance.md)
    hooks_.wgmma_bulk_store = choice_from_env<bool>("GPT2_GEMM_STORE", "way the wgmma GEMM's epilogue stores C",
                                                    {{"threads", false}, {"bulk", true}});
    splitk_ws_bytes_ = kSplitKWorkspaceBytes;
    splitk_ws_ = static_cast<float*>(device_alloc(splitk_ws_bytes_, "the hand GEMM's split-K workspace"));
  } else {
    // A diagnosis (docs/performance.md, the first lent GPU): GPT2_CUBLASLT_EPILOGUES=unfused runs every
    // cuBLASLt product plain and finishes bias, GELU and the bias gradient in our kernels, as the test hooks
    // do.
    hooks_.lt_force_unfused_epilogue = hooks_.unfused_bias_grad = choice_from_env<bool>(
        "GPT2_CUBLASLT_EPILOGUES", "cuBLASLt epilogue setting", {{"fused", false}, {"unfused", true}});
    // GPT2_CUBLASLT_BIAS_GRAD=bf16: the weight gradients' bias-gradient epilogue with bf16 sums (opt-in until a
    // GPU has timed it against what runs today, fp32 sums where cuBLASLt has them, else GEMM + bias kernel:
    // docs/performance.md).
    hooks_.lt_bias_grad_bf16 = choice_from_env<bool>("GPT2_CUBLASLT_BIAS_GRAD", "type of the bias-gradient sums",
                                                     {{"fp32", false}, {"bf16", true}});
    lt_.reset(detail::create_cublaslt_state());
  }
}

size_t GemmContext::workspace_bytes(GemmBackend backend) {
  return backend == GemmBackend::kHand ? kSplitKWorkspaceBytes : detail::cublaslt_workspace_bytes();
}

GemmWgmmaKernel GemmContext::hand_wgmma_kernel() const {
  if (hooks_.wgmma_kernel != GemmWgmmaKernel::kDefault) return hooks_.wgmma_kernel;
  return hand_wgmma_kernel_ != GemmWgmmaKernel::kDefault ? hand_wgmma_kernel_ : GemmWgmmaKernel::k128x128;
}


GemmContext::~GemmContext() {
  if (splitk_ws_) cudaFree(splitk_ws_);  // no CHECK: destructors may run while a fatal error unwinds
}

template <class T>
GemmSplitPlan gemm_hand_split_plan(const GemmContext& ctx, int M, int N, int K, GemmHandPath path, bool trans_a,
                                   GemmEpilogue ep) {
  if (ctx.backend() != GemmBackend::kHand || M <= 0 || N <= 0 || K <= 0) return {};
  const GemmTestHooks& hooks = ctx.test_hooks();
  if (hooks.hand_force_splits > 0) {
    GPT2_CHECK(static_cast<size_t>(hooks.hand_force_splits) * M * N * sizeof(float) <= ctx.splitk_workspace_bytes(),
               "forced split-K factor " << hooks.hand_force_splits << " needs more than the workspace for M=" << M
                                        << " N=" << N);
    return {hooks.hand_force_splits, path == GemmHandPath::kWgmma ? hooks.hand_force_tail_from : 0};
  }
  GPT2_CHECK(path != GemmHandPath::kWgmma || (std::is_same_v<T, bf16>), "the wgmma GEMM is bf16 only");
  const bool wgmma = path == GemmHandPath::kWgmma;
  const SplitModel model = wgmma ? wgmma_split_model(gemm_wgmma_kernel_for(ctx.hand_wgmma_kernel(), trans_a, ep))
                                 : hand_split_model<T>();
  return choose_split_plan(model, M, N, K, ctx.splitk_workspace_bytes(), wgmma);
}

template <class T>
int gemm_hand_splits(const GemmContext& ctx, int M, int N, int K, GemmHandPath path, bool trans_a, GemmEpilogue ep) {
  return gemm_hand_split_plan<T>(ctx, M, N, K, path, trans_a, ep).splits;
}

template <class T>
void gemm_cuda(GemmContext& ctx, T* c, const T* a, const T* b, const T* bias, T* aux, int M, int N, int K, bool trans_a,
               bool trans_b, bool accumulate, GemmEpilogue ep, cudaStream_t stream) {
  GPT2_CHECK(M >= 0 && N >= 0 && K >= 1, "gemm shape M=" << M << " N=" << N << " K=" << K);
  GPT2_CHECK(!accumulate || ep == GemmEpilogue::kNone,
             "accumulate (C +=) works with the plain epilogue only, got epilogue " << static_cast<int>(ep));
  const bool needs_bias = ep == GemmEpilogue::kBias || ep == GemmEpilogue::kBiasGelu;
  const bool needs_aux = ep == GemmEpilogue::kBiasGelu || ep == GemmEpilogue::kDGelu;
  GPT2_CHECK(!needs_bias || bias != nullptr, "epilogue " << static_cast<int>(ep) << " needs a bias pointer");
  GPT2_CHECK(!needs_aux || aux != nullptr, "epilogue " << static_cast<int>(ep) << " needs an aux pointer");
  if (M == 0 || N == 0) return;
  GPT2_CHECK(c != nullptr && a != nullptr && b != nullptr, "gemm with a null matrix pointer");
  if (ctx.backend() == GemmBackend::kCublasLt) {
    record_kernel_path("gemm", "cublaslt");
    detail::gemm_cublaslt<T>(ctx, c, a, b, bias, aux, M, N, K, trans_a, trans_b, accumulate, ep, stream);
  } else {
    gemm_hand<T>(ctx, c, a, b, bias, aux, M, N, K, trans_a, trans_b, accumulate, ep, stream);
  }
}

GemmHandPath gemm_hand_path(const GemmContext& ctx, const bf16* a, const bf16* b, int M, int N, int K, bool trans_a,
                            bool trans_b) {
  return choose_hand_path(ctx, a, b, M, N, K, trans_a, trans_b);
}

size_t bias_backward_scratch_bytes(int N, int OC) {
  if (N <= 0 || OC <= 0) return 0;
  return static_cast<size_t>(ceil_div(N, kBiasRowsPerChunk)) * OC * sizeof(float);
}

template <class T>
void bias_backward_cuda(T* dbias, void* scratch, const T* dout, int N, int OC, cudaStream_t stream) {
  GPT2_CHECK(N >= 0 && OC >= 0, "bias_backward shape N=" << N << " OC=" << OC);
  if (N == 0 || OC == 0) return;
  GPT2_CHECK(dbias != nullptr && dout != nullptr && scratch != nullptr, "bias_backward with a null pointer");
  GPT2_CHECK(aligned_to(scratch, sizeof(float)), "bias_backward scratch must be float-aligned");
  constexpr int kV = cuda::Packed128<T>::kSize;
  const int chunks = static_cast<int>(ceil_div(N, kBiasRowsPerChunk));
  const dim3 grid(static_cast<unsigned>(ceil_div(OC, kBiasThreadsX * kV)), static_cast<unsigned>(chunks));
  const dim3 block(kBiasThreadsX, kBiasThreadsY);
  float* part = static_cast<float*>(scratch);
  if (OC % kV == 0 && aligned_to(dout, 16))
    cuda::launch_kernel(bias_backward_chunk_colsum<T, true>, grid, block, 0, stream, part, dout, N, OC);
  else
    cuda::launch_kernel(bias_backward_chunk_colsum<T, false>, grid, block, 0, stream, part, dout, N, OC);
  CUDA_CHECK_LAUNCH();
  // The chunks' sums, 8 columns a block (kernels/reduce): one thread a column (bias_backward_add_chunks) ran 3 blocks
  // at OC = 768, each thread's 64 loads (16384 rows) one round of L2 latency after another
  column_sums_add_cuda<T>(dbias, nullptr, OC, part, chunks, OC, stream);
}

// dbias (n) += the n column sums a cuBLASLt bias-gradient epilogue staged (fp32 or T): one chunk
template <class T, class S>
void add_staged_bias_sums(T* dbias, const S* staged, int n, cudaStream_t stream) {
  cuda::launch_kernel(bias_backward_add_chunks<T, S>, static_cast<unsigned>(ceil_div(n, kElementwiseThreads)),
                      kElementwiseThreads, 0, stream, dbias, staged, 1, n, n);
  CUDA_CHECK_LAUNCH();
}

size_t weight_bias_grad_scratch_bytes(int rows, int OC) {
  if (rows <= 0 || OC <= 0) return 0;
  return std::max(bias_backward_scratch_bytes(rows, OC), static_cast<size_t>(kMaxSplits) * OC * sizeof(float));
}

template <class T>
bool weight_bias_grad_cuda(GemmContext& ctx, T* dw, T* dbias, void* scratch, const T* inp, const T* dout, int rows,
                           int IC, int OC, cudaStream_t stream) {
  GPT2_CHECK(rows >= 1 && IC >= 0 && OC >= 0, "weight_bias_grad shape rows=" << rows << " IC=" << IC << " OC=" << OC);
  if (OC == 0) return false;
  GPT2_CHECK(dbias != nullptr && scratch != nullptr && dout != nullptr, "weight_bias_grad with a null pointer");
  GPT2_CHECK(aligned_to(scratch, sizeof(float)), "weight_bias_grad scratch must be float-aligned");
  if (ctx.backend() == GemmBackend::kCublasLt && IC > 0 && !ctx.test_hooks().unfused_bias_grad) {
    GPT2_CHECK(dw != nullptr && inp != nullptr, "weight_bias_grad with a null pointer");
    record_kernel_path("gemm", "cublaslt");
    // cuBLASLt's column sums go to the scratch (OC floats at least: it holds that many), then one pass adds
    // them into dbias. With bf16 data they may be bf16 (lt_bias_grad_bf16).
    const auto fused_into = [&](auto* staged, const char* path) {
      const detail::LtBiasGradEpilogue ep =
          detail::weight_bias_grad_cublaslt<T>(ctx, dw, staged, inp, dout, rows, IC, OC, stream);
      if (ep == detail::LtBiasGradEpilogue::kNone) return false;
      record_kernel_path("bias gradient",
                         ep == detail::LtBiasGradEpilogue::kBgradBRowMajor ? "cublaslt row-major epilogue bf16" : path);
      add_staged_bias_sums(dbias, staged, OC, stream);
      return true;
    };
    const bool bf16_sums = std::is_same_v<T, bf16> && ctx.test_hooks().lt_bias_grad_bf16;
    if (bf16_sums ? fused_into(static_cast<T*>(scratch), "cublaslt epilogue bf16")
                  : fused_into(static_cast<float*>(scratch), "cublaslt epilogue fp32"))
      return true;
    record_kernel_path("bias gradient", "bias kernel");
  }
  bool fused = ctx.backend() == GemmBackend::kHand && IC > 0 && !ctx.test_hooks().unfused_bias_grad;
  if constexpr (std::is_same_v<T, bf16>)
    fused = fused && (choose_hand_path(ctx, inp, dout, IC, OC, rows, true, false) == GemmHandPath::kWgmma ||
                      mma_sync_async_loads(ctx, inp, dout, IC, OC));
  if (!fused) {
    gemm_cuda<T>(ctx, dw, inp, dout, nullptr, nullptr, IC, OC, rows, true, false, true, GemmEpilogue::kNone, stream);
    bias_backward_cuda<T>(dbias, scratch, dout, rows, OC, stream);
    return false;
  }
  GPT2_CHECK(dw != nullptr && inp != nullptr, "weight_bias_grad with a null pointer");
  gemm_hand<T>(ctx, dw, inp, dout, nullptr, nullptr, IC, OC, rows, true, false, true, GemmEpilogue::kNone, stream, dbias,
               static_cast<float*>(scratch));
  return true;
}

template <class T>
bool gemm_dgelu_bias_grad_cuda(GemmContext& ctx, T* c, T* dbias, void* scratch, const T* a, const T* b, T* pre, int M,
                               int N, int K, bool trans_a, bool trans_b, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bf16>) {
    const GemmTestHooks& h = ctx.test_hooks();
    if (ctx.backend() == GemmBackend::kCublasLt && h.lt_bias_grad_bf16 && !h.lt_force_unfused_epilogue &&
        !h.unfused_bias_grad && M > 0 && N > 0 && K > 0) {
      GPT2_CHECK(c != nullptr && a != nullptr && b != nullptr && pre != nullptr && dbias != nullptr &&
                     scratch != nullptr,
                 "gemm_dgelu_bias_grad with a null pointer");
      // cuBLASLt's column sums (bf16, the output's type) go to the scratch (N of them), then one pass adds
      // them into dbias, as weight_bias_grad_cuda's do
      T* staged = static_cast<T*>(scratch);
      if (detail::dgelu_bias_grad_cublaslt<T>(ctx, c, staged, a, b, pre, M, N, K, trans_a, trans_b, stream)) {
        record_kernel_path("gemm", "cublaslt");
        record_kernel_path("bias gradient", "cublaslt dgelu epilogue bf16");
        add_staged_bias_sums(dbias, staged, N, stream);
        return true;
      }
    }
  }
  gemm_cuda<T>(ctx, c, a, b, nullptr, pre, M, N, K, trans_a, trans_b, false, GemmEpilogue::kDGelu, stream);
  return false;
}

#define GPT2_GEMM_INSTANTIATE(T)                                                                                  \
  template void gemm_cuda<T>(GemmContext&, T*, const T*, const T*, const T*, T*, int, int, int, bool, bool, bool, \
                             GemmEpilogue, cudaStream_t);                                                         \
  template int gemm_hand_splits<T>(const GemmContext&, int, int, int, GemmHandPath, bool, GemmEpilogue);          \
  template GemmSplitPlan gemm_hand_split_plan<T>(const GemmContext&, int, int, int, GemmHandPath, bool,            \
                                                 GemmEpilogue);                                                   \
  template void bias_backward_cuda<T>(T*, void*, const T*, int, int, cudaStream_t);                               \
  template bool weight_bias_grad_cuda<T>(GemmContext&, T*, T*, void*, const T*, const T*, int, int, int, cudaStream_t); \
  template bool gemm_dgelu_bias_grad_cuda<T>(GemmContext&, T*, T*, void*, const T*, const T*, T*, int, int, int, bool, \
                                             bool, cudaStream_t);
GPT2_GEMM_INSTANTIATE(float)
GPT2_GEMM_INSTANTIATE(bf16)
#undef GPT2_GEMM_INSTANTIATE

}  // namespace gpt2::kernels
