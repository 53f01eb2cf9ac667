// CUDA layernorm: forward, forward fused with the residual add, backward. See layernorm_cuda.hpp.
//
// Layout of the work:
//   forward   one warp per row; the row is loaded once with 128-bit loads into registers, mean and
//             then var = mean((x - mean)^2) are reduced from those registers, and the output is
//             written from them: the row crosses HBM exactly once each way.
//   backward  one warp per row computes dinp the same way. dweight/dbias need a sum over rows:
//             each lane owns fixed channels, so each warp accumulates its rows into its own slice
//             of shared memory (no races, no atomics); a block adds its warps' slices in warp
//             order into one fp32 partial per block (scratch), and a second kernel adds the
//             partials in a fixed order (column_sums_add_cuda, kernels/reduce). Row chunks per block
//             depend on N only -> the same bits in every run (for a given path: the alignments pick it).
//   fallback  any C, any alignment: scalar warp-per-row kernels that re-read the row from global
//             memory (L1/L2) for each pass, and a channel-per-thread kernel for the partials.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/layernorm/layernorm.hpp"
#include "kernels/layernorm/layernorm_cuda.hpp"
#include "kernels/reduce/reduce_cuda.hpp"

namespace gpt2::kernels {
namespace {

using cuda::ceil_div;
using cuda::from_f32;
using cuda::kWarpSize;
using cuda::load128;
using cuda::load128cs;
using cuda::Packed128;
using cuda::store128;
using cuda::to_f32;
using cuda::warp_sum;

// ---- launch configuration ------------------------------------------------------------------------

// Warp-per-row kernels (forward, fallback dinp): 8 rows per 256-thread block. Small blocks keep the
// tail of the last wave short; 8 warps per block is enough to fill an SM with a few blocks.
struct RowLaunch {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * kWarpSize;
};

// Why the register-path kernels name the blocks an SM must hold (__launch_bounds__' second argument,
// which caps ptxas at 65536 / (blocks * threads) registers): a warp has one row in flight at a time and
// these kernels are memory-bound, so the bytes an SM keeps in flight, and the bandwidth with them, grow
// with the warps it holds. Left to itself ptxas (nvcc 13.0, sm_90) gave the 124M forward (C = 768 bf16,
// 3 packs a lane) 46 registers, 5 blocks of 8 warps an SM: 1.5 KB of loads a warp, 60 KB an SM at most,
// and the H200 measured 72% of copy at 65536 rows, where the fused forward, with the same warps but
// twice the bytes a row, reached 90%. At 8 blocks the warps are 64 (96 KB) and B*T = 8192 is one wave
// (1024 blocks, 1056 places on 132 SMs) instead of 1.55. The counts are the most each kPacks takes
// without spilling, or with a few bytes (k = 3: 16 bytes; the backward's k = 3, 4 and 7: 18-20 bytes
// stored once a row, L1 hits), from ptxas -v at each count.
template <int kPacks, bool kFused>
constexpr int fwd_min_blocks() {
  if constexpr (kFused) {
    return kPacks <= 2 ? 6 : kPacks <= 3 ? 5 : kPacks <= 5 ? 4 : kPacks <= 7 ? 3 : kPacks <= 12 ? 2 : 1;
  } else {
    return kPacks <= 3 ? 8 : kPacks <= 4 ? 6 : kPacks <= 6 ? 5 : kPacks <= 8 ? 4 : kPacks <= 12 ? 3 : 2;
  }
}

// Registers hold at most this many 16-byte packs per lane (a row of up to 512 packs: C <= 4096 bf16,
// C <= 2048 fp32). Wider rows take the scalar fallback. The packs-per-lane count is a template
// parameter so the row array stays in registers; these are the instantiated values.
constexpr int kMaxPacksPerLane = 16;

// Backward, fast path. Each warp owns 2C floats of shared memory (its dweight and dbias partials, C
// rounded up to whole groups of 32 packs: bwd_smem_bytes), so a block needs kWarps * 8 * C bytes: 48 KiB
// at C = 768, 112 KiB at C = 1600, 128 KiB at C = 2048, the largest C taken on this path (A100 allows
// 163 KiB a block and 164 an SM, H100 227 and 228).
struct BwdLaunch {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kMaxC = 2048;
  // A block handles a chunk of at least 16 rows (2 per warp) so that the partial it writes (2C floats)
  // and the second kernel's read of it stay a few percent of the row traffic (at most 6% each way), and
  // at most 512 blocks (partials <= 512 * 2C floats). Both are fixed numbers, not device properties: the
  // partition, and so the summation order, depends on N only.
  static constexpr int kMinRowsPerBlock = 16;
  static constexpr int kMaxBlocks = 512;
};

// The blocks an SM must hold (see fwd_min_blocks), by packs a lane. Up to 3 packs (C <= 768 bf16): 4 at
// 64 registers (48 KiB of sums each; 3 on an A100), 32 warps an SM on an H100. It was 3 blocks at 80
// registers, 396 places on 132 SMs, which the 512 blocks of B*T = 65536 took in 1.3 waves (the H200
// measured 61% of copy); now they fit one wave of 528. At B*T = 8192 a chunk was 32 rows, so 256 blocks,
// 2 an SM: 16 warps with 4 rows each one after another (40% of copy). Now 16 rows: 512 blocks, 32 warps an
// SM with 2 rows each, for 3 MB more of partial sums written and read (50 MB of rows). C = 1600 bf16 (7
// packs) ran at 178 registers, one block an SM; now 128 registers, 2 blocks (112 KiB of sums each).
// With kPrefetch (two rows in flight a warp) the most that compile without spills: 2 blocks at up to 3 packs
// (C <= 768 bf16), else 1 (ptxas, nvcc 13.0, sm_90). Up to 8 packs a lane: two fp32 rows of 12 or 16 packs
// spill even at 255 registers, so those widths run one row a warp.
template <int kPacks, bool kPrefetch>
constexpr int bwd_min_blocks() {
  if constexpr (kPrefetch) {
    static_assert(kPacks <= 8, "two rows of more than 8 packs a lane do not fit in registers");
    return kPacks <= 3 ? 2 : 1;
  } else {
    return kPacks <= 3 ? 4 : kPacks <= 4 ? 3 : kPacks <= 7 ? 2 : 1;
  }
}

// Fallback dparams: one thread per channel walks the rows of one chunk.
constexpr int kColumnThreads = 256;

struct BwdPartition {
  int blocks;          // number of row chunks = number of partials
  int rows_per_block;  // rows in each chunk (the last one may have fewer)
};

BwdPartition bwd_partition(int N) {
  if (N <= 0) return {0, 0};
  long blocks = ceil_div(N, BwdLaunch::kMinRowsPerBlock);
  if (blocks > BwdLaunch::kMaxBlocks) blocks = BwdLaunch::kMaxBlocks;
  const long rows = ceil_div(N, blocks);
  return {static_cast<int>(ceil_div(N, rows)), static_cast<int>(rows)};
}

template <class T>
bool aligned16(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Calls f(std::integral_constant<int, K>) with the smallest instantiated K >= packs_per_lane
// (callers guarantee packs_per_lane <= kMax; only K <= kMax is instantiated).
template <int kMax, class F>
void with_packs_per_lane(int packs_per_lane, F&& f) {
  static_assert(kMax == 8 || kMax == 16, "kMax must be one of the instantiated counts 8 or 16");
  if (packs_per_lane <= 1) return f(std::integral_constant<int, 1>{});
  if (packs_per_lane <= 2) return f(std::integral_constant<int, 2>{});
  if (packs_per_lane <= 3) return f(std::integral_constant<int, 3>{});
  if (packs_per_lane <= 4) return f(std::integral_constant<int, 4>{});
  if (packs_per_lane <= 5) return f(std::integral_constant<int, 5>{});
  if (packs_per_lane <= 6) return f(std::integral_constant<int, 6>{});
  if (packs_per_lane <= 7) return f(std::integral_constant<int, 7>{});
  if constexpr (kMax == 8) {
    return f(std::integral_constant<int, 8>{});
  } else {
    if (packs_per_lane <= 8) return f(std::integral_constant<int, 8>{});
    if (packs_per_lane <= 12) return f(std::integral_constant<int, 12>{});
    return f(std::integral_constant<int, 16>{});
  }
}

// Hides a pack's value from the optimiser (an empty asm that "changes" its four words): what was derived
// from it before must be derived again.
template <class T>
__device__ __forceinline__ void opaque(Packed128<T>& p) {
  uint32_t w[4];
  memcpy(w, &p, sizeof(w));
  asm volatile("" : "+r"(w[0]), "+r"(w[1]), "+r"(w[2]), "+r"(w[3]));
  memcpy(&p, w, sizeof(w));
}

// ---- forward -----------------------------------------------------------------------------------

// The one place the normalised output is computed: the forward kernels and layernorm_apply_cuda
// (activation recompute) share it, each operation rounded explicitly so that no kernel's FMA
// contraction can differ, and a recomputed output is bit-identical to the one the forward wrote.
__device__ __forceinline__ float normalize(float x, float m, float s, float w, float b) {
  return __fmaf_rn(__fmul_rn(__fsub_rn(x, m), s), w, b);
}

// One warp per row, the row in registers as kPacks 16-byte packs per lane (pack p = lane + 32k).
// kFused: x = round_T(a + b) is computed, stored to `residual`, and normalised from the rounded
// value; otherwise x = inp (passed as `a`).
template <class T, int kPacks, bool kFused>
__global__ void __launch_bounds__(RowLaunch::kThreads, fwd_min_blocks<kPacks, kFused>())
    layernorm_fwd_warp_per_row_vec(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                   const T* weight, const T* bias, int N, int C) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int V = Packed128<T>::kSize;
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * RowLaunch::kWarps + threadIdx.x / kWarpSize;
  if (row >= N) return;  // the whole warp leaves together: the shuffles below see full warps
  const int P = C / V;
  const size_t off = static_cast<size_t>(row) * C;

  Packed128<T> x[kPacks];
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = lane + k * kWarpSize;
    if (p < P) {
      if constexpr (kFused) {
        const Packed128<T> pa = load128cs(a + off + p * V);
        const Packed128<T> pb = load128cs(b + off + p * V);
#pragma unroll
        for (int e = 0; e < V; ++e) x[k][e] = from_f32<T>(to_f32(pa[e]) + to_f32(pb[e]));
        store128(residual + off + p * V, x[k]);
      } else {
        x[k] = load128cs(a + off + p * V);
      }
#pragma unroll
      for (int e = 0; e < V; ++e) sum += to_f32(x[k][e]);
    }
  }
  const float m = warp_sum(sum) / C;
  // Each pass converts the packs to fp32 again (see opaque): kept, the fp32 values took more registers.
#pragma unroll
  for (int k = 0; k < kPacks; ++k) opaque(x[k]);

  float var = 0.0f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (lane + k * kWarpSize < P) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = to_f32(x[k][e]) - m;
        var += d * d;
      }
    }
  }
  const float s = 1.0f / sqrtf(warp_sum(var) / C + kLayerNormEps);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) opaque(x[k]);

#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = lane + k * kWarpSize;
    if (p < P) {
      const Packed128<T> w = load128(weight + p * V);
      const Packed128<T> bb = load128(bias + p * V);
      Packed128<T> o;
#pragma unroll
      for (int e = 0; e < V; ++e) o[e] = from_f32<T>(normalize(to_f32(x[k][e]), m, s, to_f32(w[e]), to_f32(bb[e])));
      store128(out + off + p * V, o);
    }
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// Fallback for any C and alignment: one warp per row, element c handled by lane c % 32 in every
// pass, so in the fused form each lane re-reads only residual elements it wrote itself.
template <class T, bool kFused>
__global__ void __launch_bounds__(RowLaunch::kThreads)
    layernorm_fwd_warp_per_row_scalar(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                      const T* weight, const T* bias, int N, int C) {
  cuda::griddep_launch_dependents_then_wait();
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * RowLaunch::kWarps + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const size_t off = static_cast<size_t>(row) * C;
  const T* x = kFused ? residual + off : a + off;

  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    if constexpr (kFused) {
      const T r = from_f32<T>(to_f32(a[off + c]) + to_f32(b[off + c]));
      residual[off + c] = r;
      sum += to_f32(r);
    } else {
      sum += to_f32(x[c]);
    }
  }
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = to_f32(x[c]) - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(warp_sum(var) / C + kLayerNormEps);
  for (int c = lane; c < C; c += kWarpSize) {
    out[off + c] = from_f32<T>(normalize(to_f32(x[c]), m, s, to_f32(weight[c]), to_f32(bias[c])));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <class T, bool kFused>
void launch_forward(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b, const T* weight,
                    const T* bias, int N, int C, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const int packs_per_lane = static_cast<int>(ceil_div(C / V, kWarpSize));
  bool vec = C % V == 0 && packs_per_lane <= kMaxPacksPerLane && aligned16(out) && aligned16(a) && aligned16(weight) &&
             aligned16(bias);
  if constexpr (kFused) vec = vec && aligned16(residual) && aligned16(b);
  const dim3 grid(static_cast<unsigned>(ceil_div(N, RowLaunch::kWarps)));
  if (vec) {
    with_packs_per_lane<kMaxPacksPerLane>(packs_per_lane, [&](auto packs) {
      cuda::launch_kernel(layernorm_fwd_warp_per_row_vec<T, decltype(packs)::value, kFused>, grid, RowLaunch::kThreads,
                          0, stream, residual, out, mean, rstd, a, b, weight, bias, N, C);
    });
  } else {
    cuda::launch_kernel(layernorm_fwd_warp_per_row_scalar<T, kFused>, grid, RowLaunch::kThreads, 0, stream, residual,
                        out, mean, rstd, a, b, weight, bias, N, C);
  }
  CUDA_CHECK_LAUNCH();
}

// layernorm_apply_cuda: elementwise, so a thread per 16-byte pack (grid-stride), or per element
// when C is not a whole number of packs or a pointer is misaligned. Memory-bound: one read of the
// row, one write, the statistics and parameters from L2.
constexpr int kApplyThreads = 256;

template <class T>
__global__ void __launch_bounds__(kApplyThreads)
    layernorm_apply_vec(T* out, const T* inp, const float* mean, const float* rstd, const T* weight, const T* bias,
                        int N, int C) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int V = Packed128<T>::kSize;
  const int P = C / V;
  const long total = static_cast<long>(N) * P;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    const long row = i / P;
    const int p = static_cast<int>(i - row * P);
    const float m = mean[row], s = rstd[row];
    const Packed128<T> x = load128cs(inp + i * V);
    const Packed128<T> w = load128(weight + p * V);
    const Packed128<T> bb = load128(bias + p * V);
    Packed128<T> o;
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] = from_f32<T>(normalize(to_f32(x[e]), m, s, to_f32(w[e]), to_f32(bb[e])));
    store128(out + i * V, o);
  }
}

template <class T>
__global__ void __launch_bounds__(kApplyThreads)
    layernorm_apply_scalar(T* out, const T* inp, const float* mean, const float* rstd, const T* weight, const T* bias,
                           int N, int C) {
  cuda::griddep_launch_dependents_then_wait();
  const long total = static_cast<long>(N) * C;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    const long row = i / C;
    const int c = static_cast<int>(i - row * C);
    out[i] = from_f32<T>(normalize(to_f32(inp[i]), mean[row], rstd[row], to_f32(weight[c]), to_f32(bias[c])));
  }
}

// ---- backward ----------------------------------------------------------------------------------

// Where lane `lane`'s element e of its k-th pack (channel (32 k + lane) V + e) keeps its running dweight
// (or dbias) sum inside its warp's slice: (k V + e) 32 + lane. The 32 lanes are adjacent for every (k, e)
// (32 different banks), and the offset of (k, e) is a constant, so the unrolled loops address shared
// memory from one register. A slice is C / V packs rounded up to whole groups of 32 (bwd_slice_floats;
// the slots of packs past C / V are never used).
template <int V>
__device__ __forceinline__ int acc_slot(int k, int e, int lane) {
  return (k * V + e) * kWarpSize + lane;
}
// Floats of one warp's dweight (or dbias) slice for rows of P packs of V, and the fast kernel's shared memory.
__host__ __device__ constexpr int bwd_slice_floats(int P, int V) {
  return (P + kWarpSize - 1) / kWarpSize * kWarpSize * V;
}
inline size_t bwd_smem_bytes(int P, int V) {
  return static_cast<size_t>(BwdLaunch::kWarps) * 2 * bwd_slice_floats(P, V) * sizeof(float);
}

// One row of the backward fast path in registers: dout, inp and the residual gradient it adds into, loaded
// by bwd_load_row, all at once, so that the row waits for memory once. (Loading the residual gradient after
// the first loop made it twice, at 117 registers and 2 blocks an SM: the H100 measured 74% of copy bandwidth
// at 65536 rows and 49% at 8192, 2026-11-27.)
template <class T, int kPacks>
struct BwdRow {
  Packed128<T> d[kPacks], x[kPacks], di[kPacks];
  float m, s;
};

template <class T, int kPacks>
__device__ __forceinline__ void bwd_load_row(BwdRow<T, kPacks>& r, const T* dout, const T* inp, const T* dinp,
                                             const float* mean, const float* rstd, int row, int C, int lane) {
  constexpr int V = Packed128<T>::kSize;
  const int P = C / V;
  const size_t off = static_cast<size_t>(row) * C;
  r.m = mean[row], r.s = rstd[row];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = lane + k * kWarpSize;
    if (p < P) {
      r.d[k] = load128cs(dout + off + p * V);
      r.x[k] = load128cs(inp + off + p * V);
      r.di[k] = load128(dinp + off + p * V);
    }
  }
}

// dinp's row from a loaded row, and the row's dweight/dbias terms added into the warp's slices.
template <class T, int kPacks>
__device__ __forceinline__ void bwd_finish_row(BwdRow<T, kPacks>& r, T* dinp, float* acc_dw, float* acc_db,
                                               const T* weight, int row, int C, int lane) {
  constexpr int V = Packed128<T>::kSize;
  const int P = C / V;
  const size_t off = static_cast<size_t>(row) * C;
  const float m = r.m, s = r.s;
  float dn_sum = 0.0f, dn_xhat_sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = lane + k * kWarpSize;
    if (p < P) {
      const Packed128<T> w = load128(weight + p * V);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xhat = (to_f32(r.x[k][e]) - m) * s;
        const float dn = to_f32(w[e]) * to_f32(r.d[k][e]);
        dn_sum += dn;
        dn_xhat_sum += dn * xhat;
      }
    }
  }
  const float dn_mean = warp_sum(dn_sum) / C;
  const float dn_xhat_mean = warp_sum(dn_xhat_sum) / C;
  // The row's fp32 values are converted again below rather than kept from the loop above: kept through
  // the reductions, they took ptxas (nvcc 13.0, sm_90) to 124 registers at C = 768 bf16, 2 blocks of 8
  // warps an SM; converted again, 80 registers and 3 blocks (64 and 4 under bwd_min_blocks, with 18
  // bytes spilled). The empty asm makes the packs opaque, so the first conversions cannot be reused.
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    opaque(r.d[k]);
    opaque(r.x[k]);
  }

#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = lane + k * kWarpSize;
    if (p < P) {
      const Packed128<T> w = load128(weight + p * V);
      Packed128<T> o;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float g = to_f32(r.d[k][e]);
        const float xhat = (to_f32(r.x[k][e]) - m) * s;
        const float dn = to_f32(w[e]) * g;
        o[e] = from_f32<T>(to_f32(r.di[k][e]) + (dn - dn_mean - xhat * dn_xhat_mean) * s);
        const int slot = acc_slot<V>(k, e, lane);
        acc_dw[slot] += xhat * g;
        acc_db[slot] += g;
      }
      store128(dinp + off + p * V, o);
    }
  }
}

// One warp per row for dinp (row in registers); dweight/dbias accumulated per warp in shared
// memory, then added over the block's warps in warp order into partials[blockIdx.x] (2C floats:
// dweight partial, then dbias partial). Rows of block g: [g*R, min((g+1)*R, N)), warp w takes rows
// g*R + w, g*R + w + kWarps, ...
// kPrefetch (layernorm_backward_prefetch_rows, not yet measured): a warp issues its next row's loads before
// it finishes the current row, so its two rows' memory and arithmetic overlap within the warp, not only
// across warps; the same arithmetic in the same order, so the same bits. For the next lent GPU to decide
// (docs/performance.md, 2026-12-02) against this kernel at 4 blocks an SM, not yet measured either (the
// H200's 40% of copy at 8192 rows and 61% at 65536 were at 3 blocks and 32-row chunks).
template <class T, int kPacks, bool kPrefetch>
__global__ void __launch_bounds__(BwdLaunch::kThreads, bwd_min_blocks<kPacks, kPrefetch>())
    layernorm_bwd_warp_per_row_vec(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                   const float* mean, const float* rstd, int N, int C, int rows_per_block) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int V = Packed128<T>::kSize;
  extern __shared__ float acc_shared[];  // [kWarps][2][slice]
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int P = C / V;
  const int slice = bwd_slice_floats(P, V);
  float* acc_dw = acc_shared + static_cast<size_t>(warp) * 2 * slice;
  float* acc_db = acc_dw + slice;

  // Each lane zeroes the slots only it will touch: no barrier needed before the row loop.
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (lane + k * kWarpSize < P) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int slot = acc_slot<V>(k, e, lane);
        acc_dw[slot] = 0.0f;
        acc_db[slot] = 0.0f;
      }
    }
  }

  const int row_begin = blockIdx.x * rows_per_block;
  const int row_end = min(row_begin + rows_per_block, N);
  if constexpr (kPrefetch) {
    BwdRow<T, kPacks> cur;
    if (row_begin + warp < row_end) bwd_load_row(cur, dout, inp, dinp, mean, rstd, row_begin + warp, C, lane);
    for (int row = row_begin + warp; row < row_end; row += BwdLaunch::kWarps) {
      const bool more = row + BwdLaunch::kWarps < row_end;
      BwdRow<T, kPacks> next;
      if (more) bwd_load_row(next, dout, inp, dinp, mean, rstd, row + BwdLaunch::kWarps, C, lane);
      bwd_finish_row(cur, dinp, acc_dw, acc_db, weight, row, C, lane);
      if (more) cur = next;
    }
  } else {
    for (int row = row_begin + warp; row < row_end; row += BwdLaunch::kWarps) {
      BwdRow<T, kPacks> r;
      bwd_load_row(r, dout, inp, dinp, mean, rstd, row, C, lane);
      bwd_finish_row(r, dinp, acc_dw, acc_db, weight, row, C, lane);
    }
  }
  __syncthreads();

  // Slot order (lanes fastest): conflict-free reads of the warps' slices.
  float* part = partials + static_cast<size_t>(blockIdx.x) * 2 * C;
  for (int j = threadIdx.x; j < 2 * slice; j += blockDim.x) {
    const int which = j / slice, slot = j % slice;  // which 0: dweight, 1: dbias
    const int l = slot % kWarpSize, e = (slot / kWarpSize) % V, k = slot / (kWarpSize * V);
    const int c = (k * kWarpSize + l) * V + e;
    if (c >= C) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < BwdLaunch::kWarps; ++w) sum += acc_shared[static_cast<size_t>(w) * 2 * slice + j];
    part[which * C + c] = sum;
  }
}

// Fallback dinp: one warp per row, any C and alignment, two passes over global memory.
template <class T>
__global__ void __launch_bounds__(RowLaunch::kThreads)
    layernorm_bwd_dinp_warp_per_row_scalar(T* dinp, const T* dout, const T* inp, const T* weight, const float* mean,
                                           const float* rstd, int N, int C) {
  cuda::griddep_launch_dependents_then_wait();
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * RowLaunch::kWarps + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const size_t off = static_cast<size_t>(row) * C;
  const float m = mean[row], s = rstd[row];
  float dn_sum = 0.0f, dn_xhat_sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float xhat = (to_f32(inp[off + c]) - m) * s;
    const float dn = to_f32(weight[c]) * to_f32(dout[off + c]);
    dn_sum += dn;
    dn_xhat_sum += dn * xhat;
  }
  const float dn_mean = warp_sum(dn_sum) / C;
  const float dn_xhat_mean = warp_sum(dn_xhat_sum) / C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float xhat = (to_f32(inp[off + c]) - m) * s;
    const float dn = to_f32(weight[c]) * to_f32(dout[off + c]);
    dinp[off + c] = from_f32<T>(to_f32(dinp[off + c]) + (dn - dn_mean - xhat * dn_xhat_mean) * s);
  }
}

// Fallback dweight/dbias partials: thread per channel (coalesced across the block), block row
// blockIdx.y = row chunk, rows summed in order. Same partials layout as the fast path.
template <class T>
__global__ void __launch_bounds__(kColumnThreads)
    layernorm_bwd_dparams_column_partials(float* partials, const T* dout, const T* inp, const float* mean,
                                          const float* rstd, int N, int C, int rows_per_block) {
  cuda::griddep_launch_dependents_then_wait();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int row_begin = blockIdx.y * rows_per_block;
  const int row_end = min(row_begin + rows_per_block, N);
  float dw = 0.0f, db = 0.0f;
  for (int row = row_begin; row < row_end; ++row) {
    const size_t i = static_cast<size_t>(row) * C + c;
    const float g = to_f32(dout[i]);
    dw += (to_f32(inp[i]) - mean[row]) * rstd[row] * g;
    db += g;
  }
  float* part = partials + static_cast<size_t>(blockIdx.y) * 2 * C;
  part[c] = dw;
  part[C + c] = db;
}

}  // namespace

// ---- launchers ---------------------------------------------------------------------------------

namespace {
bool g_bwd_prefetch_rows = false;  // layernorm_backward_prefetch_rows
}  // namespace

template <class T>
void layernorm_forward_cuda(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N,
                            int C, cudaStream_t stream) {
  GPT2_CHECK(N >= 0, "N = " << N);
  GPT2_CHECK(C >= 1, "C = " << C);
  if (N == 0) return;
  GPT2_CHECK(out && mean && rstd && inp && weight && bias, "(a null pointer) N = " << N << " C = " << C);
  launch_forward<T, false>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, stream);
}

template <class T>
void residual_layernorm_forward_cuda(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                     const T* weight, const T* bias, int N, int C, cudaStream_t stream) {
  GPT2_CHECK(N >= 0, "N = " << N);
  GPT2_CHECK(C >= 1, "C = " << C);
  if (N == 0) return;
  GPT2_CHECK(residual && out && mean && rstd && a && b && weight && bias, "(a null pointer) N = " << N << " C = " << C);
  launch_forward<T, true>(residual, out, mean, rstd, a, b, weight, bias, N, C, stream);
}

template <class T>
void layernorm_apply_cuda(T* out, const T* inp, const float* mean, const float* rstd, const T* weight, const T* bias,
                          int N, int C, cudaStream_t stream) {
  GPT2_CHECK(N >= 0, "N = " << N);
  GPT2_CHECK(C >= 1, "C = " << C);
  if (N == 0) return;
  GPT2_CHECK(out && inp && mean && rstd && weight && bias, "(a null pointer) N = " << N << " C = " << C);
  constexpr int V = 16 / sizeof(T);
  const bool vec = C % V == 0 && aligned16(out) && aligned16(inp) && aligned16(weight) && aligned16(bias);
  const long work = static_cast<long>(N) * (vec ? C / V : C);
  // Enough blocks to fill any current GPU several times over; the grid-stride loop does the rest.
  const unsigned grid = static_cast<unsigned>(std::min<long>(ceil_div(work, kApplyThreads), 65536));
  if (vec) {
    cuda::launch_kernel(layernorm_apply_vec<T>, grid, kApplyThreads, 0, stream, out, inp, mean, rstd, weight, bias, N,
                        C);
  } else {
    cuda::launch_kernel(layernorm_apply_scalar<T>, grid, kApplyThreads, 0, stream, out, inp, mean, rstd, weight, bias,
                        N, C);
  }
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward_prefetch_rows(bool on) {
  g_bwd_prefetch_rows = on;
}

size_t layernorm_backward_scratch_bytes(int N, int C) {
  GPT2_CHECK(N >= 0, "N = " << N);
  GPT2_CHECK(C >= 1, "C = " << C);
  return static_cast<size_t>(bwd_partition(N).blocks) * 2 * static_cast<size_t>(C) * sizeof(float);
}

template <class T>
void layernorm_backward_cuda(T* dinp, T* dweight, T* dbias, void* scratch, const T* dout, const T* inp, const T* weight,
                             const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
  GPT2_CHECK(N >= 0, "N = " << N);
  GPT2_CHECK(C >= 1, "C = " << C);
  if (N == 0) return;
  GPT2_CHECK(dinp && dweight && dbias && dout && inp && weight && mean && rstd,
             "(a null pointer) N = " << N << " C = " << C);
  GPT2_CHECK(scratch != nullptr && reinterpret_cast<uintptr_t>(scratch) % alignof(float) == 0,
             "scratch = " << scratch << " (needs layernorm_backward_scratch_bytes(" << N << ", " << C
                          << ") = " << layernorm_backward_scratch_bytes(N, C) << " bytes, 4-byte aligned)");
  constexpr int V = 16 / sizeof(T);
  const BwdPartition part = bwd_partition(N);
  float* partials = static_cast<float*>(scratch);
  const bool vec =
      C % V == 0 && C <= BwdLaunch::kMaxC && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight);
  if (vec) {
    const int packs_per_lane = static_cast<int>(ceil_div(C / V, kWarpSize));
    // C <= kMaxC: at most kMaxC / (32 V) packs per lane (8 for bf16, 16 for fp32).
    constexpr int kMaxPacks = BwdLaunch::kMaxC / (kWarpSize * V);
    with_packs_per_lane<kMaxPacks>(packs_per_lane, [&](auto packs) {
      constexpr int kPacks = decltype(packs)::value;
      auto kernel = layernorm_bwd_warp_per_row_vec<T, kPacks, false>;
      if constexpr (kPacks <= 8) {
        if (g_bwd_prefetch_rows) kernel = layernorm_bwd_warp_per_row_vec<T, kPacks, true>;
      }
      const size_t smem = bwd_smem_bytes(C / V, V);
      cuda::allow_dynamic_smem(kernel, smem);
      cuda::launch_kernel(kernel, part.blocks, BwdLaunch::kThreads, smem, stream, dinp, partials, dout, inp, weight,
                          mean, rstd, N, C, part.rows_per_block);
    });
    CUDA_CHECK_LAUNCH();
  } else {
    cuda::launch_kernel(layernorm_bwd_dinp_warp_per_row_scalar<T>,
                        static_cast<unsigned>(ceil_div(N, RowLaunch::kWarps)), RowLaunch::kThreads, 0, stream, dinp,
                        dout, inp, weight, mean, rstd, N, C);
    CUDA_CHECK_LAUNCH();
    const dim3 grid(static_cast<unsigned>(ceil_div(C, kColumnThreads)), static_cast<unsigned>(part.blocks));
    cuda::launch_kernel(layernorm_bwd_dparams_column_partials<T>, grid, kColumnThreads, 0, stream, partials, dout, inp,
                        mean, rstd, N, C, part.rows_per_block);
    CUDA_CHECK_LAUNCH();
  }
  // dweight, then dbias: the partials' two halves, added in a fixed order (kernels/reduce)
  column_sums_add_cuda<T>(dweight, dbias, C, partials, part.blocks, 2 * C, stream);
}

#define GPT2_INSTANTIATE_LAYERNORM(T)                                                                                \
  template void layernorm_forward_cuda<T>(T*, float*, float*, const T*, const T*, const T*, int, int, cudaStream_t); \
  template void residual_layernorm_forward_cuda<T>(T*, T*, float*, float*, const T*, const T*, const T*, const T*,   \
                                                   int, int, cudaStream_t);                                          \
  template void layernorm_apply_cuda<T>(T*, const T*, const float*, const float*, const T*, const T*, int, int,     \
                                        cudaStream_t);                                                              \
  template void layernorm_backward_cuda<T>(T*, T*, T*, void*, const T*, const T*, const T*, const float*,            \
                                           const float*, int, int, cudaStream_t);
GPT2_INSTANTIATE_LAYERNORM(float)
GPT2_INSTANTIATE_LAYERNORM(bf16)
#undef GPT2_INSTANTIATE_LAYERNORM

}  // namespace gpt2::kernels
