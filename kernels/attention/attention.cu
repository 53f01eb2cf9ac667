// Causal flash attention, forward and backward (FlashAttention-2 algorithm, deterministic backward).
//
// Two implementations behind one set of launchers:
//  * bf16 tensor-core path for hs in {64, 80, 96, 128}: mma.sync m16n8k16 (bf16 operands, fp32
//    accumulation), ldmatrix fragments from padded shared-memory tiles, cp.async double buffering of
//    the streamed tiles. Each warp owns whole 16-row MMA tiles, so softmax statistics and the P / dS
//    operands never leave registers.
//  * on compute capability 9.0, opt-in (AttentionForwardPath::kWgmma, AttentionBackwardPath::kWgmma), the
//    bf16 forward and backward at hs = 64 run on wgmma fed by TMA (attention_sm90.cu, attention_bwd_sm90.cu).
//  * fp32 SIMT path for everything else (T = float, any hs <= 128), also the fallback that
//    attention_force_generic() selects for tests.
// Both: the T x T score matrix is never materialised; causal tiles above the diagonal are skipped;
// the backward recomputes P = exp(s - lse) and writes every dK, dV element from exactly one block (one
// block per key tile looping over query tiles). dQ either has an owner too (one block per query tile
// looping over key tiles, which recomputes S and dP) or, on the tensor-core path with
// AttentionBackwardPath::kAccumulateDq, is summed by the key-tile blocks in a fixed order (dq_turns.cuh)
// through an fp32 accumulator (bwd_add_dq_share). Either way results are bit-identical from run to run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "core/error.hpp"
#include "kernels/attention/attention_cuda.hpp"
#include "kernels/attention/dq_turns.cuh"
#include "kernels/attention/ds_tiles.cuh"
#include "kernels/attention/tile_order.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/cuda_util.cuh"
#include "kernels/common/env_choice.hpp"
#include "kernels/common/kernel_paths.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"
#if defined(GPT2_HAVE_SM90A)
#include "kernels/attention/attention_sm90.cuh"
#endif

namespace gpt2::kernels {
namespace {

using attention_detail::DsTiles;

// ================================================================================================
// Device primitives (sm_80+ PTX) and the launch helper
// ================================================================================================

__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char attention_smem[];
  return attention_smem;
}

// PTX wrappers (cp.async, ldmatrix, mma.sync, ex2) live in kernels/common/ptx.cuh.
using cuda::cp_async_16;
using cuda::cp_async_4;
using cuda::cp_async_commit;
using cuda::cp_async_wait;
using cuda::ldmatrix_x4;
using cuda::ldmatrix_x4_trans;
using cuda::mma_bf16_16816;
// softmax exponentials: one MUFU.EX2 each (ptx.cuh: exp2f adds a denormal fix-up to every one)
using cuda::ex2_approx_ftz;

using cuda::pack_bf16x2;

// Plain shared-memory read of an fp32 value written by cp.async (kept separate so it is visible as a
// shared-memory access in one place).
__device__ __forceinline__ float lds_f32(const float* p) {
  return *p;
}

// Launches `kernel`, first raising its dynamic shared-memory limit when it needs more than the default 48 KB.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                   Args... args) {
  cuda::allow_dynamic_smem(kernel, smem_bytes);
  cuda::launch_kernel(kernel, grid, block, smem_bytes, stream, static_cast<Params>(args)...);
  CUDA_CHECK_LAUNCH();
}

// ================================================================================================
// Kernels
// ================================================================================================

using cuda::kLn2;
using cuda::kLog2e;
constexpr int kMaxHeadSize = 128;

// ---- D = rowsum(dout * out), shared by both backward paths ----------------------------------------

// One warp per (b, t, h) row: hs <= 128 elements, a warp-sum in fixed order.
constexpr int kRowdotThreads = 256;

template <class T>
__global__ void __launch_bounds__(kRowdotThreads)
    attention_bwd_rowdot(float* D, const T* dout, const T* out, int B, int T_, int C, int NH) {
  cuda::griddep_launch_dependents_then_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long row = static_cast<long>(blockIdx.x) * (kRowdotThreads / 32) + warp;  // (b, t, h) order
  if (row >= static_cast<long>(B) * T_ * NH) return;                              // whole warps leave together
  const int hs = C / NH;
  const int h = static_cast<int>(row % NH);
  const long bt = row / NH;
  const int b = static_cast<int>(bt / T_), t = static_cast<int>(bt % T_);
  const T* a = dout + bt * C + h * hs;
  const T* o = out + bt * C + h * hs;
  float s = 0.0f;
  for (int d = lane; d < hs; d += 32) s += cuda::to_f32(a[d]) * cuda::to_f32(o[d]);
  s = cuda::warp_sum(s);
  if (lane == 0) D[(static_cast<size_t>(b) * NH + h) * T_ + t] = s;
}

// ---- fp32 SIMT path (any hs <= 128, T = float or bf16) ------------------------------------------

// Tiles of 32 query rows x 32 keys. A warp owns 8 rows and lane j takes key j (or dimension j + 32c),
// so score rows reduce with warp shuffles; 4 warps fill one 32-row tile. Tiles are fp32 in shared
// memory with an odd row pitch: lane j reading row j at a fixed column hits bank (j * pitch) % 32,
// all different.
struct SimtTiles {
  static constexpr int kRows = 32;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kRows / kWarps;      // 8
  static constexpr int kDimChunks = kMaxHeadSize / 32;  // dimension d = lane + 32 c, c < 4
  static constexpr int pitch(int hs) { return hs | 1; }
  static constexpr size_t tile_floats(int hs) { return static_cast<size_t>(kRows) * pitch(hs); }
  static constexpr size_t warp_scratch_floats() { return static_cast<size_t>(kWarps) * kWarpRows * 32; }
  // forward: Q, K, V tiles + per-warp P
  static constexpr size_t fwd_smem_bytes(int hs) { return (3 * tile_floats(hs) + warp_scratch_floats()) * 4; }
  // dK/dV: K, V, Q, dO tiles + per-warp P and dS + lse, D of the query tile
  static constexpr size_t dkdv_smem_bytes(int hs) {
    return (4 * tile_floats(hs) + 2 * warp_scratch_floats() + 2 * kRows) * 4;
  }
  // dQ: Q, dO, K, V tiles + per-warp dS
  static constexpr size_t dq_smem_bytes(int hs) { return (4 * tile_floats(hs) + warp_scratch_floats()) * 4; }
};

// Rows [row0, row0 + 32) of a row-major matrix with leading dimension ld (src already points at the
// head's first column), hs columns, converted to fp32 into dst [32][pitch]; rows >= T_ become zero.
template <class T>
__device__ __forceinline__ void simt_load_tile(float* dst, const T* src, size_t ld, int row0, int T_, int hs) {
  const int pitch = SimtTiles::pitch(hs);
  for (int i = threadIdx.x; i < SimtTiles::kRows * hs; i += SimtTiles::kThreads) {
    const int r = i / hs, d = i - r * hs;
    const int t = row0 + r;
    dst[r * pitch + d] = t < T_ ? cuda::to_f32(src[static_cast<size_t>(t) * ld + d]) : 0.0f;
  }
}

template <class T>
__global__ void __launch_bounds__(SimtTiles::kThreads)
    attention_fwd_simt(T* out, float* lse, const T* qkv, int T_, int C, int NH, int hs, float scale_log2) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int kR = SimtTiles::kWarpRows;
  const int qt = gridDim.x - 1 - blockIdx.x;  // longest causal prefixes first: better tail balance
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pitch = SimtTiles::pitch(hs);
  float* sQ = reinterpret_cast<float*>(dynamic_smem());
  float* sK = sQ + SimtTiles::tile_floats(hs);
  float* sV = sK + SimtTiles::tile_floats(hs);
  float* sP = sV + SimtTiles::tile_floats(hs) + warp * kR * 32;  // this warp's [8][32] probabilities

  const size_t ld = 3 * static_cast<size_t>(C);
  const T* q_g = qkv + static_cast<size_t>(b) * T_ * ld + static_cast<size_t>(h) * hs;
  const int q0 = qt * SimtTiles::kRows;
  const int wr0 = warp * kR;  // first tile row of this warp
  simt_load_tile(sQ, q_g, ld, q0, T_, hs);

  float o[kR][SimtTiles::kDimChunks], m[kR], l[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < SimtTiles::kDimChunks; ++c) o[i][c] = 0.0f;
  }

  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // the previous K, V tile is fully consumed
    simt_load_tile(sK, q_g + C, ld, kt * SimtTiles::kRows, T_, hs);
    simt_load_tile(sV, q_g + 2 * C, ld, kt * SimtTiles::kRows, T_, hs);
    __syncthreads();

    float s[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) s[i] = 0.0f;
    for (int d = 0; d < hs; ++d) {
      const float kd = sK[lane * pitch + d];
#pragma unroll
      for (int i = 0; i < kR; ++i) s[i] += sQ[(wr0 + i) * pitch + d] * kd;
    }
    const int key = kt * SimtTiles::kRows + lane;
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int q = q0 + wr0 + i;
      const bool visible = key <= q && key < T_;
      const float x = visible ? s[i] * scale_log2 : -INFINITY;
      // Key 0 is visible to every row in tile 0, so m is finite from the first tile on.
      const float m_new = fmaxf(m[i], cuda::warp_max(x));
      const float alpha = ex2_approx_ftz(m[i] - m_new);
      const float p = visible ? ex2_approx_ftz(x - m_new) : 0.0f;
      l[i] = l[i] * alpha + cuda::warp_sum(p);
      m[i] = m_new;
      sP[i * 32 + lane] = p;
#pragma unroll
      for (int c = 0; c < SimtTiles::kDimChunks; ++c) o[i][c] *= alpha;
    }
    __syncwarp();
    for (int j = 0; j < 32; ++j) {
#pragma unroll
      for (int c = 0; c < SimtTiles::kDimChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < hs) {
          const float vd = sV[j * pitch + d];
#pragma unroll
          for (int i = 0; i < kR; ++i) o[i][c] += sP[i * 32 + j] * vd;
        }
      }
    }
    __syncwarp();  // sP is rewritten by the next tile
  }

#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const int q = q0 + wr0 + i;
    if (q >= T_) continue;
    const float inv = 1.0f / l[i];
    T* orow = out + (static_cast<size_t>(b) * T_ + q) * C + static_cast<size_t>(h) * hs;
#pragma unroll
    for (int c = 0; c < SimtTiles::kDimChunks; ++c) {
      const int d = lane + 32 * c;
      if (d < hs) orow[d] = cuda::from_f32<T>(o[i][c] * inv);
    }
    if (lane == 0) lse[(static_cast<size_t>(b) * NH + h) * T_ + q] = (m[i] + log2f(l[i])) * kLn2;
  }
}

// dK, dV of one 32-key tile: loops over the query tiles at or below the diagonal.
template <class T>
__global__ void __launch_bounds__(SimtTiles::kThreads)
    attention_bwd_dkdv_simt(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D, int T_, int C,
                            int NH, int hs, float scale_log2, float scale) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int kR = SimtTiles::kWarpRows;
  const int kt = blockIdx.x;  // tile 0 sees the most query tiles: natural order is heaviest first
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pitch = SimtTiles::pitch(hs);
  float* sK = reinterpret_cast<float*>(dynamic_smem());
  float* sV = sK + SimtTiles::tile_floats(hs);
  float* sQ = sV + SimtTiles::tile_floats(hs);
  float* sdO = sQ + SimtTiles::tile_floats(hs);
  float* sP = sdO + SimtTiles::tile_floats(hs) + warp * kR * 32;
  float* sdS = sdO + SimtTiles::tile_floats(hs) + SimtTiles::warp_scratch_floats() + warp * kR * 32;
  float* sLse = sdO + SimtTiles::tile_floats(hs) + 2 * SimtTiles::warp_scratch_floats();  // log2 domain
  float* sD = sLse + SimtTiles::kRows;

  const size_t ld = 3 * static_cast<size_t>(C);
  const T* q_g = qkv + static_cast<size_t>(b) * T_ * ld + static_cast<size_t>(h) * hs;
  const T* do_g = dout + static_cast<size_t>(b) * T_ * C + static_cast<size_t>(h) * hs;
  const float* lse_g = lse + (static_cast<size_t>(b) * NH + h) * T_;
  const float* D_g = D + (static_cast<size_t>(b) * NH + h) * T_;
  const int k0 = kt * SimtTiles::kRows;
  const int wr0 = warp * kR;
  simt_load_tile(sK, q_g + C, ld, k0, T_, hs);
  simt_load_tile(sV, q_g + 2 * C, ld, k0, T_, hs);

  float dk[kR][SimtTiles::kDimChunks], dv[kR][SimtTiles::kDimChunks];
#pragma unroll
  for (int i = 0; i < kR; ++i) {
#pragma unroll
    for (int c = 0; c < SimtTiles::kDimChunks; ++c) dk[i][c] = dv[i][c] = 0.0f;
  }

  const int nq = (T_ + SimtTiles::kRows - 1) / SimtTiles::kRows;
  for (int qt = kt; qt < nq; ++qt) {
    const int q0 = qt * SimtTiles::kRows;
    __syncthreads();  // the previous query tile is fully consumed
    simt_load_tile(sQ, q_g, ld, q0, T_, hs);
    simt_load_tile(sdO, do_g, static_cast<size_t>(C), q0, T_, hs);
    if (threadIdx.x < SimtTiles::kRows) {
      const int q = q0 + threadIdx.x;
      sLse[threadIdx.x] = q < T_ ? lse_g[q] * kLog2e : 0.0f;
      sD[threadIdx.x] = q < T_ ? D_g[q] : 0.0f;
    }
    __syncthreads();

    float s[kR], dp[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) s[i] = dp[i] = 0.0f;
    for (int d = 0; d < hs; ++d) {
      const float qd = sQ[lane * pitch + d], dod = sdO[lane * pitch + d];
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        s[i] += sK[(wr0 + i) * pitch + d] * qd;
        dp[i] += sV[(wr0 + i) * pitch + d] * dod;
      }
    }
    const int q = q0 + lane;
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int key = k0 + wr0 + i;
      const bool visible = key <= q && q < T_;
      const float p = visible ? ex2_approx_ftz(s[i] * scale_log2 - sLse[lane]) : 0.0f;
      sP[i * 32 + lane] = p;
      sdS[i * 32 + lane] = p * (dp[i] - sD[lane]);
    }
    __syncwarp();
    for (int j = 0; j < 32; ++j) {
#pragma unroll
      for (int c = 0; c < SimtTiles::kDimChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < hs) {
          const float qd = sQ[j * pitch + d], dod = sdO[j * pitch + d];
#pragma unroll
          for (int i = 0; i < kR; ++i) {
            dv[i][c] += sP[i * 32 + j] * dod;
            dk[i][c] += sdS[i * 32 + j] * qd;
          }
        }
      }
    }
    __syncwarp();
  }

#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const int key = k0 + wr0 + i;
    if (key >= T_) continue;
    T* krow = dqkv + (static_cast<size_t>(b) * T_ + key) * ld + C + static_cast<size_t>(h) * hs;
#pragma unroll
    for (int c = 0; c < SimtTiles::kDimChunks; ++c) {
      const int d = lane + 32 * c;
      if (d < hs) {
        krow[d] = cuda::from_f32<T>(dk[i][c] * scale);
        krow[C + d] = cuda::from_f32<T>(dv[i][c]);
      }
    }
  }
}

// dQ of one 32-row query tile: loops over the key tiles at or below the diagonal.
template <class T>
__global__ void __launch_bounds__(SimtTiles::kThreads)
    attention_bwd_dq_simt(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D, int T_, int C, int NH,
                          int hs, float scale_log2, float scale) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int kR = SimtTiles::kWarpRows;
  const int qt = gridDim.x - 1 - blockIdx.x;  // longest causal prefixes first
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pitch = SimtTiles::pitch(hs);
  float* sQ = reinterpret_cast<float*>(dynamic_smem());
  float* sdO = sQ + SimtTiles::tile_floats(hs);
  float* sK = sdO + SimtTiles::tile_floats(hs);
  float* sV = sK + SimtTiles::tile_floats(hs);
  float* sdS = sV + SimtTiles::tile_floats(hs) + warp * kR * 32;

  const size_t ld = 3 * static_cast<size_t>(C);
  const T* q_g = qkv + static_cast<size_t>(b) * T_ * ld + static_cast<size_t>(h) * hs;
  const T* do_g = dout + static_cast<size_t>(b) * T_ * C + static_cast<size_t>(h) * hs;
  const float* lse_g = lse + (static_cast<size_t>(b) * NH + h) * T_;
  const float* D_g = D + (static_cast<size_t>(b) * NH + h) * T_;
  const int q0 = qt * SimtTiles::kRows;
  const int wr0 = warp * kR;
  simt_load_tile(sQ, q_g, ld, q0, T_, hs);
  simt_load_tile(sdO, do_g, static_cast<size_t>(C), q0, T_, hs);

  float dq[kR][SimtTiles::kDimChunks], lse2[kR], Dr[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const int q = q0 + wr0 + i;
    lse2[i] = q < T_ ? lse_g[q] * kLog2e : 0.0f;
    Dr[i] = q < T_ ? D_g[q] : 0.0f;
#pragma unroll
    for (int c = 0; c < SimtTiles::kDimChunks; ++c) dq[i][c] = 0.0f;
  }

  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();
    simt_load_tile(sK, q_g + C, ld, kt * SimtTiles::kRows, T_, hs);
    simt_load_tile(sV, q_g + 2 * C, ld, kt * SimtTiles::kRows, T_, hs);
    __syncthreads();

    float s[kR], dp[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) s[i] = dp[i] = 0.0f;
    for (int d = 0; d < hs; ++d) {
      const float kd = sK[lane * pitch + d], vd = sV[lane * pitch + d];
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        s[i] += sQ[(wr0 + i) * pitch + d] * kd;
        dp[i] += sdO[(wr0 + i) * pitch + d] * vd;
      }
    }
    const int key = kt * SimtTiles::kRows + lane;
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int q = q0 + wr0 + i;
      const bool visible = key <= q && q < T_;
      const float p = visible ? ex2_approx_ftz(s[i] * scale_log2 - lse2[i]) : 0.0f;
      sdS[i * 32 + lane] = p * (dp[i] - Dr[i]);
    }
    __syncwarp();
    for (int j = 0; j < 32; ++j) {
#pragma unroll
      for (int c = 0; c < SimtTiles::kDimChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < hs) {
          const float kd = sK[j * pitch + d];
#pragma unroll
          for (int i = 0; i < kR; ++i) dq[i][c] += sdS[i * 32 + j] * kd;
        }
      }
    }
    __syncwarp();
  }

#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const int q = q0 + wr0 + i;
    if (q >= T_) continue;
    T* qrow = dqkv + (static_cast<size_t>(b) * T_ + q) * ld + static_cast<size_t>(h) * hs;
#pragma unroll
    for (int c = 0; c < SimtTiles::kDimChunks; ++c) {
      const int d = lane + 32 * c;
      if (d < hs) qrow[d] = cuda::from_f32<T>(dq[i][c] * scale);
    }
  }
}

// ---- bf16 tensor-core path (hs in {64, 80, 96, 128}) ---------------------------------------------
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): with g = lane / 4 and tq = lane % 4, the
// accumulator of a 16x8 tile holds (row g, cols 2tq, 2tq+1) in c0, c1 and (row g+8, same cols) in
// c2, c3; the A operand holds (row g | g+8, cols 2tq.. | 2tq+8..) in a0..a3; the B operand (16x8)
// holds (k rows 2tq, 2tq+1 | 2tq+8, 2tq+9; col g) in b0, b1. An accumulator pair of adjacent 8-column
// tiles is therefore exactly an A operand of the next product (P, dS stay in registers).
//
// Shared-memory tiles are bf16 rows padded by 16 bytes: the row pitch of 144/176/208/272 bytes moves
// 8 consecutive rows into 8 different 16-byte bank groups, so every ldmatrix phase is conflict-free.

template <int HS>
struct TcTile {
  static_assert(HS % 16 == 0 && HS <= kMaxHeadSize, "tensor-core head sizes are multiples of 16, at most 128");
  static constexpr int kPitch = HS + 8;      // elements per smem row
  static constexpr int kChunks = HS / 8;     // 16-byte chunks per row
  static constexpr int kKSteps = HS / 16;    // k-steps of a product over the head dimension
  static constexpr int kDimBlocks = HS / 8;  // 8-column accumulator tiles over the head dimension
};

// Per-head-size tile shapes (the knobs to tune on the device). Every warp owns whole 16-row MMA tiles,
// and the accumulators plus the fragments kept in registers must stay within 255 registers without
// spilling (check the -Xptxas -v report after a change):
//   forward: O (kFwdMTiles x 16 rows x HS), S (kFwdMTiles x 16 x kFwdBlockN), Q fragments if kFwdQInRegs;
//   dK/dV:   dK, dV (16 keys x HS each), S^T, dP^T (16 x kBwdBlockM each), K, V fragments if kBwdKVInRegs;
//   dQ:      dQ (16 x HS), S, dP (16 x kDqBlockN each), Q and dO fragments.
// Two row tiles per forward warp let every K/V fragment read from shared memory feed two MMAs, which
// keeps ldmatrix traffic under the tensor-core rate.
template <int HS>
struct TcShapes;
template <>
struct TcShapes<64> {
  static constexpr int kFwdWarps = 4, kFwdMTiles = 2, kFwdBlockN = 64;
  static constexpr bool kFwdQInRegs = true;
  static constexpr int kBwdBlockM = 64;
  static constexpr bool kBwdKVInRegs = true;
  static constexpr int kDqBlockN = 64;
};
template <>
struct TcShapes<80> {
  static constexpr int kFwdWarps = 4, kFwdMTiles = 2, kFwdBlockN = 64;
  static constexpr bool kFwdQInRegs = false;
  static constexpr int kBwdBlockM = 64;
  static constexpr bool kBwdKVInRegs = false;
  static constexpr int kDqBlockN = 64;
};
template <>
struct TcShapes<96> {
  static constexpr int kFwdWarps = 4, kFwdMTiles = 2, kFwdBlockN = 64;
  static constexpr bool kFwdQInRegs = false;
  static constexpr int kBwdBlockM = 64;
  static constexpr bool kBwdKVInRegs = false;
  static constexpr int kDqBlockN = 64;
};
template <>
struct TcShapes<128> {
  static constexpr int kFwdWarps = 4, kFwdMTiles = 2, kFwdBlockN = 32;
  static constexpr bool kFwdQInRegs = false;
  static constexpr int kBwdBlockM = 32;
  static constexpr bool kBwdKVInRegs = false;
  static constexpr int kDqBlockN = 32;
};

// Forward: kWarps x kMTiles x 16 query rows per block (128 with the defaults); <= 80 KB of smem and
// 128 threads let two blocks share an SM.
template <int HS>
struct TcFwdConfig {
  static constexpr int kWarps = TcShapes<HS>::kFwdWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = TcShapes<HS>::kFwdMTiles;
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kBlockM = kWarps * kWarpRows;
  static constexpr int kBlockN = TcShapes<HS>::kFwdBlockN;
  static constexpr bool kQInRegs = TcShapes<HS>::kFwdQInRegs;
  static constexpr int kPitch = TcTile<HS>::kPitch;
  // Q tile + two stages of K and V
  static constexpr size_t kSmemBytes = static_cast<size_t>(kBlockM + 4 * kBlockN) * kPitch * sizeof(bf16);
};

// dK/dV: 4 warps x 16 keys = 64 keys per block; the query tiles (kBlockM rows of Q, dO, lse, D) stream
// through two stages.
template <int HS>
struct TcDkdvConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = 16 * kWarps;
  static constexpr int kBlockM = TcShapes<HS>::kBwdBlockM;
  static constexpr bool kKVInRegs = TcShapes<HS>::kBwdKVInRegs;
  static constexpr int kPitch = TcTile<HS>::kPitch;
  // K, V tiles + two stages of (Q, dO tiles, lse, D)
  static constexpr size_t kSmemBytes =
      static_cast<size_t>(2 * kBlockN + 4 * kBlockM) * kPitch * sizeof(bf16) + 2 * 2 * kBlockM * sizeof(float);

  // When the same block also accumulates dQ (AttentionBackwardPath::kAccumulateDq): dS^T of the tile
  // pair in bf16, [kBlockN keys][kBlockM queries + 8] (a 144- or 80-byte pitch: 8 consecutive rows in
  // 8 bank groups), the A operand of dQ += dS K that all four warps share.
  static constexpr int kDsPitch = kBlockM + 8;
  static constexpr size_t kDsBytes = static_cast<size_t>(kBlockN) * kDsPitch * sizeof(bf16);
  static constexpr size_t kSmemBytesWithDq = kSmemBytes + kDsBytes;
  // dQ += dS K over the warps: kBlockM / 16 row tiles, the head dimension cut into the remaining parts.
  static constexpr int kDqRowTiles = kBlockM / 16;
  static constexpr int kDqDimParts = kWarps / kDqRowTiles;
  static constexpr int kDqDimBlocks = TcTile<HS>::kDimBlocks / kDqDimParts;  // 8-column tiles per warp
  static_assert(kWarps % kDqRowTiles == 0 && kDqDimBlocks % 2 == 0 &&
                    kDqDimBlocks * kDqDimParts == TcTile<HS>::kDimBlocks,
                "dQ tiles: whole row tiles per warp, whole 16-column pairs of the head dimension");
  static_assert(kSmemBytesWithDq % 16 == 0 && kSmemBytes % 16 == 0, "dS^T tile 16-byte aligned for ldmatrix");
};

// dQ: 4 warps x 16 query rows = 64 rows per block; K, V tiles stream through two stages.
template <int HS>
struct TcDqConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kBlockN = TcShapes<HS>::kDqBlockN;
  static constexpr int kPitch = TcTile<HS>::kPitch;
  // Q, dO tiles + two stages of K and V
  static constexpr size_t kSmemBytes = static_cast<size_t>(2 * kBlockM + 4 * kBlockN) * kPitch * sizeof(bf16);
};

// kStoreDs's dQ: 4 warps x 16 query rows = one 64-query column of DsTiles per block; the K rows and the
// dS^T rows of kBlockN keys stream through two stages (a 144-byte dS^T pitch: 8 consecutive rows in 8
// bank groups, as kAccumulateDq's tile). One product a step and no softmax: few registers, so more
// blocks an SM than the recomputing kernels' two, to keep the dS^T reads in flight.
template <int HS>
struct TcDqFromDsConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = DsTiles::kSide;
  static constexpr int kBlockN = TcShapes<HS>::kDqBlockN;
  static constexpr int kPitch = TcTile<HS>::kPitch;
  static constexpr int kDsPitch = DsTiles::kSide + 8;
  static constexpr size_t kSmemBytes = static_cast<size_t>(2 * kBlockN) * (kPitch + kDsPitch) * sizeof(bf16);
  static_assert(kBlockM == 16 * kWarps && DsTiles::kSide % kBlockN == 0, "a block's rows are one tile column");
};
static_assert(TcDkdvConfig<64>::kBlockN == DsTiles::kSide && DsTiles::kSide % TcDkdvConfig<128>::kBlockM == 0,
              "a dK/dV block's key tile is one row of DsTiles, its query tile a whole tile or half of one");

// Rows [row0, row0 + kRows) of a bf16 matrix with leading dimension ld (src already points at the head's
// first column) into a padded smem tile, 16 bytes per cp.async; rows >= T_ are zero-filled, so masked
// products read zeros, never stale data or NaN.
// The trip count is a constant (chunk i = threadIdx.x + k kThreads, unsigned): the loop unrolls into
// straight-line copies. Counted from threadIdx.x, as it was until 2026-11-29, ptxas could not unroll it
// and each copy came with its own trip test, signed division and branches: some 570 SASS instructions
// to issue the 8 copies of the backward's next Q and dO tiles, as many as the tile's 128 HMMA and their
// softmax (tools/sass.py).
template <int HS, int kRows, int kThreads>
__device__ __forceinline__ void tc_load_tile(bf16* dst, const bf16* src, size_t ld, int row0, int T_) {
  constexpr int kChunks = TcTile<HS>::kChunks;
  constexpr int kTotal = kRows * kChunks;
#pragma unroll
  for (int k = 0; k < (kTotal + kThreads - 1) / kThreads; ++k) {
    const unsigned i = threadIdx.x + static_cast<unsigned>(k * kThreads);
    if (kTotal % kThreads != 0 && i >= static_cast<unsigned>(kTotal)) break;
    const int r = static_cast<int>(i / kChunks), c = static_cast<int>(i % kChunks);
    const int t = row0 + r;
    const bool inside = t < T_;
    cp_async_16(dst + r * TcTile<HS>::kPitch + c * 8, src + static_cast<size_t>(inside ? t : 0) * ld + c * 8, inside);
  }
}

// kRows fp32 values src[row0 ..] into dst, zero past T_ (a constant trip count, as tc_load_tile).
template <int kRows, int kThreads>
__device__ __forceinline__ void tc_load_vec(float* dst, const float* src, int row0, int T_) {
#pragma unroll
  for (int k = 0; k < (kRows + kThreads - 1) / kThreads; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kThreads;
    if (kRows % kThreads != 0 && i >= kRows) break;
    const int t = row0 + i;
    const bool inside = t < T_;
    cp_async_4(dst + i, src + (inside ? t : 0), inside);
  }
}

// kRows dS^T rows of one DsTiles tile (64 bf16 each, src at the first) into a tile of pitch
// TcDqFromDsConfig's kDsPitch, 16 bytes per cp.async; every row is inside the buffer (DsTiles).
template <int kRows, int kThreads>
__device__ __forceinline__ void tc_load_ds_rows(bf16* dst, const bf16* src) {
  constexpr int kChunks = DsTiles::kSide / 8;
  constexpr int kTotal = kRows * kChunks;
  static_assert(kTotal % kThreads == 0, "whole rounds of chunks");
#pragma unroll
  for (int k = 0; k < kTotal / kThreads; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * kThreads;
    const int r = i / kChunks, c = i % kChunks;
    cp_async_16(dst + r * (DsTiles::kSide + 8) + c * 8, src + r * DsTiles::kSide + c * 8, true);
  }
}

// A-operand fragment (16 rows x 16 columns at `tile`, row-major with pitch kPitch) for mma.m16n8k16:
// lanes 0-15 address rows 0-15 at column 0, lanes 16-31 rows 0-15 at column 8.
template <int kPitch>
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const bf16* tile, int lane) {
  ldmatrix_x4(a, tile + (lane & 15) * kPitch + (lane >> 4) * 8);
}
// B operands of two adjacent 8-column tiles for a product X * Y^T, with Y stored row-major as
// [n][k] (16 rows of n at `tile`, 16 columns of k): {r0, r1} serve n-rows 0-7, {r2, r3} n-rows 8-15.
template <int kPitch>
__device__ __forceinline__ void load_b_frags_nk(uint32_t (&r)[4], const bf16* tile, int lane) {
  ldmatrix_x4(r, tile + ((lane & 7) + ((lane >> 4) << 3)) * kPitch + ((lane >> 3) & 1) * 8);
}
// B operands of two adjacent 8-column tiles for a product X * Y, with Y stored row-major as [k][n]
// (16 rows of k at `tile`, 16 columns of n): {r0, r1} serve columns 0-7, {r2, r3} columns 8-15.
template <int kPitch>
__device__ __forceinline__ void load_b_frags_kn(uint32_t (&r)[4], const bf16* tile, int lane) {
  ldmatrix_x4_trans(r, tile + (lane & 15) * kPitch + (lane >> 4) * 8);
}
// Accumulators of 8-column tiles 2j and 2j+1 (fp32) -> the bf16 A operand spanning those 16 columns.
__device__ __forceinline__ void acc_to_a_frag(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16x2(lo[0], lo[1]);
  a[1] = pack_bf16x2(lo[2], lo[3]);
  a[2] = pack_bf16x2(hi[0], hi[1]);
  a[3] = pack_bf16x2(hi[2], hi[3]);
}

template <int HS>
__global__ void __launch_bounds__(TcFwdConfig<HS>::kThreads, 2)
    attention_fwd_tc(bf16* out, float* lse, const bf16* qkv, int T_, int C, int NH, float scale_log2,
                     attention_order::TileOrder order) {
  cuda::griddep_launch_dependents_then_wait();
  using Cfg = TcFwdConfig<HS>;
  constexpr int kP = Cfg::kPitch;
  constexpr int kMT = Cfg::kMTiles;
  constexpr int kBN = Cfg::kBlockN;
  constexpr int kNB = kBN / 8;  // 8-key tiles of S
  constexpr int kKS = TcTile<HS>::kKSteps;
  constexpr int kDB = TcTile<HS>::kDimBlocks;  // 8-dim tiles of O
  // longest causal prefixes first, across the heads of a group (tile_order.hpp)
  const attention_order::TileSlot slot = attention_order::tile_slot(order, static_cast<int>(blockIdx.x));
  const int qb = order.ranks - 1 - slot.rank;
  const int h = slot.head % NH, b = slot.head / NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tq = lane & 3;

  bf16* sQ = reinterpret_cast<bf16*>(dynamic_smem());
  bf16* sK = sQ + Cfg::kBlockM * kP;  // [2][kBN][kP]
  bf16* sV = sK + 2 * kBN * kP;       // [2][kBN][kP]

  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* q_g = qkv + static_cast<size_t>(b) * T_ * ld + static_cast<size_t>(h) * HS;
  const bf16* k_g = q_g + C;
  const bf16* v_g = q_g + 2 * C;
  const int q0 = qb * Cfg::kBlockM;
  const int q_end = T_ < q0 + Cfg::kBlockM ? T_ : q0 + Cfg::kBlockM;  // > q0: the grid covers T_ exactly
  const int n_kt = (q_end - 1) / kBN + 1;                             // key tiles holding keys 0 .. q_end-1
  const int wq0 = q0 + warp * Cfg::kWarpRows;
  const bool warp_has_rows = wq0 < T_;

  tc_load_tile<HS, Cfg::kBlockM, Cfg::kThreads>(sQ, q_g, ld, q0, T_);
  tc_load_tile<HS, kBN, Cfg::kThreads>(sK, k_g, ld, 0, T_);
  tc_load_tile<HS, kBN, Cfg::kThreads>(sV, v_g, ld, 0, T_);
  cp_async_commit();

  float o[kMT][kDB][4];
  float m[kMT][2], l[kMT][2];  // rows g and g+8 of each row tile; l is this thread's share of the row sum
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[mt][r] = -INFINITY;
      l[mt][r] = 0.0f;
    }
#pragma unroll
    for (int db = 0; db < kDB; ++db) o[mt][db][0] = o[mt][db][1] = o[mt][db][2] = o[mt][db][3] = 0.0f;
  }
  uint32_t qf[Cfg::kQInRegs ? kMT : 1][Cfg::kQInRegs ? kKS : 1][4];

  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) {  // prefetch the next K, V tile into the other stage while this one is used
      tc_load_tile<HS, kBN, Cfg::kThreads>(sK + (stage ^ 1) * kBN * kP, k_g, ld, (kt + 1) * kBN, T_);
      tc_load_tile<HS, kBN, Cfg::kThreads>(sV + (stage ^ 1) * kBN * kP, v_g, ld, (kt + 1) * kBN, T_);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* cK = sK + stage * kBN * kP;
    const bf16* cV = sV + stage * kBN * kP;
    const int k0 = kt * kBN;

    // Warp-uniform: skip tiles whose keys all lie above the diagonal of this warp's rows.
    if (warp_has_rows && k0 <= wq0 + Cfg::kWarpRows - 1) {
      if constexpr (Cfg::kQInRegs) {
        if (kt == 0) {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
            for (int ks = 0; ks < kKS; ++ks)
              load_a_frag<kP>(qf[mt][ks], sQ + (warp * Cfg::kWarpRows + mt * 16) * kP + ks * 16, lane);
          }
        }
      }

      // S = Q K^T (raw dot products)
      float s[kMT][kNB][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) s[mt][nb][0] = s[mt][nb][1] = s[mt][nb][2] = s[mt][nb][3] = 0.0f;
      }
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if constexpr (Cfg::kQInRegs) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[mt][i] = qf[mt][ks][i];
          } else {
            load_a_frag<kP>(a[mt], sQ + (warp * Cfg::kWarpRows + mt * 16) * kP + ks * 16, lane);
          }
        }
#pragma unroll
        for (int np = 0; np < kNB / 2; ++np) {
          uint32_t bk[4];
          load_b_frags_nk<kP>(bk, cK + np * 16 * kP + ks * 16, lane);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_bf16_16816(s[mt][2 * np], a[mt], bk[0], bk[1]);
            mma_bf16_16816(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
          }
        }
      }

      // Causal / end-of-sequence mask, only on tiles that cross the diagonal or the end.
      if (k0 + kBN - 1 > wq0 || k0 + kBN > T_) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int row = wq0 + mt * 16 + g + 8 * (e >> 1);
              const int col = k0 + nb * 8 + 2 * tq + (e & 1);
              if (col > row || col >= T_) s[mt][nb][e] = -INFINITY;
            }
          }
        }
      }

      // Online softmax in the log2 domain; the 4 threads of a quad share each row.
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = -INFINITY;
#pragma unroll
          for (int nb = 0; nb < kNB; ++nb) mx = fmaxf(mx, fmaxf(s[mt][nb][2 * r], s[mt][nb][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m[mt][r], mx * scale_log2);
          // A row that has seen no visible key yet keeps p = 0 instead of NaN (cannot happen for rows
          // < T_, which always see key 0 in the first tile; kept for robustness).
          const float m_use = m_new == -INFINITY ? 0.0f : m_new;
          const float alpha = ex2_approx_ftz(m[mt][r] - m_use);
          m[mt][r] = m_new;
          float sum = 0.0f;
#pragma unroll
          for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e) {
              const float p = ex2_approx_ftz(fmaf(s[mt][nb][e], scale_log2, -m_use));
              s[mt][nb][e] = p;
              sum += p;
            }
          }
          l[mt][r] = l[mt][r] * alpha + sum;
#pragma unroll
          for (int db = 0; db < kDB; ++db) {
            o[mt][db][2 * r] *= alpha;
            o[mt][db][2 * r + 1] *= alpha;
          }
        }
      }

      // O += P V, P as bf16 A operands straight from the S accumulators.
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) acc_to_a_frag(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < kDB / 2; ++dp) {
          uint32_t bv[4];
          load_b_frags_kn<kP>(bv, cV + kk * 16 * kP + dp * 16, lane);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_bf16_16816(o[mt][2 * dp], pa[mt], bv[0], bv[1]);
            mma_bf16_16816(o[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
          }
        }
      }
    }
    __syncthreads();  // all warps are done with `stage` before the next iteration refills it
  }

  if (warp_has_rows) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float sum = l[mt][r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int row = wq0 + mt * 16 + g + 8 * r;
        if (row < T_) {
          const float inv = 1.0f / sum;  // >= 1 term: the row maximum contributes exp2(0)
          bf16* orow = out + (static_cast<size_t>(b) * T_ + row) * C + static_cast<size_t>(h) * HS + 2 * tq;
#pragma unroll
          for (int db = 0; db < kDB; ++db) {
            *reinterpret_cast<__nv_bfloat162*>(orow + db * 8) =
                __floats2bfloat162_rn(o[mt][db][2 * r] * inv, o[mt][db][2 * r + 1] * inv);
          }
          if (tq == 0) lse[(static_cast<size_t>(b) * NH + h) * T_ + row] = (m[mt][r] + log2f(sum)) * kLn2;
        }
      }
    }
  }
}

// dQ[query tile qt] (+)= dS K over this block's key tile kt, when its turn comes (see bwd_dkdv_tc_block):
// dS^T is in sdS ([key][query], written by all four warps), K in sK ([key][dim]). Warp w takes query rows
// 16 (w % kDqRowTiles) .. +15 and the (w / kDqRowTiles)-th part of the head dimension.
template <int HS>
__device__ __forceinline__ void bwd_add_dq_share(const bf16* sdS, const bf16* sK, float* dq_acc, const int* dq_turns,
                                                 int kt, int h, int b, int qt, int nq, int T_, int C, int NH) {
  using Cfg = TcDkdvConfig<HS>;
  constexpr int kP = Cfg::kPitch;
  constexpr int kDB = Cfg::kDqDimBlocks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tq = lane & 3;
  const int mt = warp % Cfg::kDqRowTiles;
  const int col0 = (warp / Cfg::kDqRowTiles) * kDB * 8;  // this warp's first head dimension
  __syncthreads();                                        // every warp's dS^T rows are in sdS

  float dq[kDB][4];
#pragma unroll
  for (int db = 0; db < kDB; ++db) dq[db][0] = dq[db][1] = dq[db][2] = dq[db][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk) {
    // A = dS (queries x keys) from the [key][query] tile, transposed on load: lanes 0-7 address the
    // matrix (q 0-7, k 0-7), lanes 8-15 (q 8-15, k 0-7), 16-23 (q 0-7, k 8-15), 24-31 (q 8-15, k 8-15).
    uint32_t a[4];
    ldmatrix_x4_trans(a, sdS + (kk * 16 + (lane & 7) + ((lane >> 4) << 3)) * Cfg::kDsPitch + mt * 16 +
                             ((lane >> 3) & 1) * 8);
#pragma unroll
    for (int dp = 0; dp < kDB / 2; ++dp) {
      uint32_t bk[4];
      load_b_frags_kn<kP>(bk, sK + kk * 16 * kP + col0 + dp * 16, lane);
      mma_bf16_16816(dq[2 * dp], a, bk[0], bk[1]);
      mma_bf16_16816(dq[2 * dp + 1], a, bk[2], bk[3]);
    }
  }

  // Our turn: the key tiles above kt that see qt have added theirs (acquire; dq_turns.cuh).
  const int* turn = dq_turns + (static_cast<size_t>(b) * NH + h) * nq + qt;
  const int my_turn = attention_detail::dq_turn(kt, qt, Cfg::kBlockM, Cfg::kBlockN,
                                                static_cast<int>((T_ + Cfg::kBlockN - 1) / Cfg::kBlockN));
  if (threadIdx.x == 0) cuda::wait_flag_at_least(turn, my_turn);  // a turn that never comes traps
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = qt * Cfg::kBlockM + mt * 16 + g + 8 * r;
    if (row >= T_) continue;
    float* dst = dq_acc + (static_cast<size_t>(b) * T_ + row) * C + static_cast<size_t>(h) * HS + col0 + 2 * tq;
#pragma unroll
    for (int db = 0; db < kDB; ++db) {
      float2 v = make_float2(dq[db][2 * r], dq[db][2 * r + 1]);
      if (my_turn > 0) {  // L2 reads (.cg): an L1 line of this SM may predate the other blocks' adds
        const float2 before = __ldcg(reinterpret_cast<const float2*>(dst + db * 8));
        v.x = before.x + v.x;
        v.y = before.y + v.y;
      }
      __stcg(reinterpret_cast<float2*>(dst + db * 8), v);
    }
  }
}

// dK, dV of one 64-key tile (16 keys per warp): loops over the query tiles from the diagonal to the end.
// Computing S^T = K Q^T and dP^T = V dO^T puts keys on the MMA rows, so P^T and dS^T come out as A operands
// of dV += P^T dO and dK += dS^T Q without a trip through shared memory.
//
// What a dK/dV block does for dQ besides:
//   kNone (AttentionBackwardPath::kRecomputeDq): nothing; dQ blocks of their own recompute S and dP.
//   kAccumulate (kAccumulateDq): the block also adds this key tile's share of dQ, dS K, to the fp32
//     accumulator dq_acc (B,T,C) of each query tile it visits, so nothing is recomputed for dQ (5 products
//     instead of 7). Deterministic without float atomics: the key tiles of one query tile take turns,
//     highest key tile first, and the first writes instead of adding, so dq_acc needs no clearing;
//     dq_turns.cuh has the protocol and why it cannot deadlock (the blocks' ticket order).
//   kStoreDs (kStoreDs): the block stores dS^T, the same bf16 values dK used, into the causal tiles of
//     DsTiles; a second launch (bwd_dq_from_ds_block) then sums dQ = dS K from them (5 products).
enum class DqWork { kNone, kAccumulate, kStoreDs };

// The qkv bias gradient's share of one block (attention_backward_cuda's bias_chunks): the column sums of what
// its 4 warps stored into one part of dqkv (q, k or v: 16 rows each, kBiasChunkRows together), the bf16 values
// the weight gradient reads, into row `chunk` of the chunks at column `col0`. vals[db][r] holds this thread's
// two columns 8 db + 2 tq + {0, 1} (as a float2) of its row g + 8 r, already masked to the rows < T; the
// lanes' g bits are added by a butterfly (every g ends with the warp's sums), the warps' sums through shared
// memory in warp order. Every thread of the block calls it, after the block's last use of `red` as a tile
// (a __syncthreads since); `red` holds kWarps x kDB x 8 floats.
constexpr int kBiasChunkRows = 64;
template <int kDB>
__device__ __forceinline__ void block_column_sums(float* red, const float2 (&vals)[kDB][2], float* chunk_row,
                                                  int col0) {
  constexpr int kWarps = kBiasChunkRows / 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane & 3;
#pragma unroll
  for (int db = 0; db < kDB; ++db) {
    float x = vals[db][0].x + vals[db][1].x, y = vals[db][0].y + vals[db][1].y;
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {
      x += __shfl_xor_sync(0xffffffffu, x, offset);
      y += __shfl_xor_sync(0xffffffffu, y, offset);
    }
    if (lane < 4) {
      red[(warp * kDB + db) * 8 + 2 * tq] = x;
      red[(warp * kDB + db) * 8 + 2 * tq + 1] = y;
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < kDB * 8; c += blockDim.x) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += red[w * kDB * 8 + c];
    chunk_row[col0 + c] = t;
  }
  __syncthreads();  // `red` is read before a second call rewrites it
}

template <int HS, DqWork kWork>
__device__ __forceinline__ void bwd_dkdv_tc_block(int kt, int h, int b, bf16* dqkv, float* dq_acc, int* dq_turns,
                                                  bf16* ds, const bf16* dout, const bf16* qkv, const float* lse,
                                                  const float* D, int T_, int C, int NH, float scale_log2, float scale,
                                                  float* bias_chunks = nullptr) {
  constexpr bool kDq = kWork == DqWork::kAccumulate;
  constexpr bool kStoreDs = kWork == DqWork::kStoreDs;
  using Cfg = TcDkdvConfig<HS>;
  constexpr int kP = Cfg::kPitch;
  constexpr int kBM = Cfg::kBlockM;
  constexpr int kMB = kBM / 8;  // 8-query tiles of S^T
  constexpr int kKS = TcTile<HS>::kKSteps;
  constexpr int kDB = TcTile<HS>::kDimBlocks;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tq = lane & 3;

  bf16* sK = reinterpret_cast<bf16*>(dynamic_smem());
  bf16* sV = sK + Cfg::kBlockN * kP;
  bf16* sQ = sV + Cfg::kBlockN * kP;                           // [2][kBM][kP]
  bf16* sdO = sQ + 2 * kBM * kP;                               // [2][kBM][kP]
  float* sLse = reinterpret_cast<float*>(sdO + 2 * kBM * kP);  // [2][kBM]
  float* sD = sLse + 2 * kBM;                                  // [2][kBM]
  bf16* sdS = reinterpret_cast<bf16*>(sD + 2 * kBM);           // [kBlockN][kDsPitch], kDq only

  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* q_g = qkv + static_cast<size_t>(b) * T_ * ld + static_cast<size_t>(h) * HS;
  const bf16* do_g = dout + static_cast<size_t>(b) * T_ * C + static_cast<size_t>(h) * HS;
  const float* lse_g = lse + (static_cast<size_t>(b) * NH + h) * T_;
  const float* D_g = D + (static_cast<size_t>(b) * NH + h) * T_;
  const int k0 = kt * Cfg::kBlockN;
  const int wk0 = k0 + warp * 16;  // first key of this warp
  const int qt_first = k0 / kBM;   // first query tile holding a query >= k0
  const int nq = (T_ + kBM - 1) / kBM;

  tc_load_tile<HS, Cfg::kBlockN, Cfg::kThreads>(sK, q_g + C, ld, k0, T_);
  tc_load_tile<HS, Cfg::kBlockN, Cfg::kThreads>(sV, q_g + 2 * C, ld, k0, T_);
  tc_load_tile<HS, kBM, Cfg::kThreads>(sQ, q_g, ld, qt_first * kBM, T_);
  tc_load_tile<HS, kBM, Cfg::kThreads>(sdO, do_g, static_cast<size_t>(C), qt_first * kBM, T_);
  tc_load_vec<kBM, Cfg::kThreads>(sLse, lse_g, qt_first * kBM, T_);
  tc_load_vec<kBM, Cfg::kThreads>(sD, D_g, qt_first * kBM, T_);
  cp_async_commit();

  float dk[kDB][4], dv[kDB][4];
#pragma unroll
  for (int db = 0; db < kDB; ++db) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[db][e] = dv[db][e] = 0.0f;
  }
  uint32_t kf[Cfg::kKVInRegs ? kKS : 1][4], vf[Cfg::kKVInRegs ? kKS : 1][4];
  const bool warp_has_keys = wk0 < T_;

  for (int qt = qt_first; qt < nq; ++qt) {
    const int stage = (qt - qt_first) & 1;
    if (qt + 1 < nq) {
      const int nxt = stage ^ 1;
      tc_load_tile<HS, kBM, Cfg::kThreads>(sQ + nxt * kBM * kP, q_g, ld, (qt + 1) * kBM, T_);
      tc_load_tile<HS, kBM, Cfg::kThreads>(sdO + nxt * kBM * kP, do_g, static_cast<size_t>(C), (qt + 1) * kBM, T_);
      tc_load_vec<kBM, Cfg::kThreads>(sLse + nxt * kBM, lse_g, (qt + 1) * kBM, T_);
      tc_load_vec<kBM, Cfg::kThreads>(sD + nxt * kBM, D_g, (qt + 1) * kBM, T_);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* cQ = sQ + stage * kBM * kP;
    const bf16* cdO = sdO + stage * kBM * kP;
    const float* cLse = sLse + stage * kBM;
    const float* cD = sD + stage * kBM;
    const int qs0 = qt * kBM;

    // dS^T rows of this warp's keys (the same bf16 values dK used; nullptr: zeros) into the shared tile
    // that dQ's share reads (kDq), or into their causal tile of the DsTiles buffer (kStoreDs): 16 keys
    // from wk0 x the kBM queries from qs0. Rows of keys >= T_ are stored too (as zeros: masked), so that
    // bwd_dq_from_ds_block reads no stale value where its K rows are zero-filled.
    auto put_ds_rows = [&](const float(*vals)[4]) {
      bf16* row;
      int pitch;
      if constexpr (kStoreDs) {
        row = ds + DsTiles::tile(b * NH + h, kt, qs0 / DsTiles::kSide, T_) + (warp * 16 + g) * DsTiles::kSide +
              qs0 % DsTiles::kSide;
        pitch = DsTiles::kSide;
      } else {
        row = sdS + (warp * 16 + g) * Cfg::kDsPitch;
        pitch = Cfg::kDsPitch;
      }
#pragma unroll
      for (int nb = 0; nb < kMB; ++nb) {
        bf16* dst = row + nb * 8 + 2 * tq;
        *reinterpret_cast<uint32_t*>(dst) = vals != nullptr ? pack_bf16x2(vals[nb][0], vals[nb][1]) : 0u;
        *reinterpret_cast<uint32_t*>(dst + 8 * pitch) = vals != nullptr ? pack_bf16x2(vals[nb][2], vals[nb][3]) : 0u;
      }
    };
    (void)put_ds_rows;  // kNone stores no dS^T

    // Warp-uniform: skip query tiles that lie entirely above the diagonal of this warp's keys.
    if (warp_has_keys && wk0 <= qs0 + kBM - 1) {
      if constexpr (Cfg::kKVInRegs) {
        if (qt == qt_first) {
#pragma unroll
          for (int ks = 0; ks < kKS; ++ks) {
            load_a_frag<kP>(kf[ks], sK + warp * 16 * kP + ks * 16, lane);
            load_a_frag<kP>(vf[ks], sV + warp * 16 * kP + ks * 16, lane);
          }
        }
      }

      // S^T = K Q^T, dP^T = V dO^T (keys on rows, queries on columns)
      float st[kMB][4], dpt[kMB][4];
#pragma unroll
      for (int nb = 0; nb < kMB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nb][e] = dpt[nb][e] = 0.0f;
      }
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        uint32_t ak[4], av[4];
        if constexpr (Cfg::kKVInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            ak[i] = kf[ks][i];
            av[i] = vf[ks][i];
          }
        } else {
          load_a_frag<kP>(ak, sK + warp * 16 * kP + ks * 16, lane);
          load_a_frag<kP>(av, sV + warp * 16 * kP + ks * 16, lane);
        }
#pragma unroll
        for (int np = 0; np < kMB / 2; ++np) {
          uint32_t bq[4], bo[4];
          load_b_frags_nk<kP>(bq, cQ + np * 16 * kP + ks * 16, lane);
          mma_bf16_16816(st[2 * np], ak, bq[0], bq[1]);
          mma_bf16_16816(st[2 * np + 1], ak, bq[2], bq[3]);
          load_b_frags_nk<kP>(bo, cdO + np * 16 * kP + ks * 16, lane);
          mma_bf16_16816(dpt[2 * np], av, bo[0], bo[1]);
          mma_bf16_16816(dpt[2 * np + 1], av, bo[2], bo[3]);
        }
      }

      // P^T = exp(s - lse), dS^T = P^T (dP^T - D); the mask is applied by selection, so exp overflow
      // on masked entries never reaches the products.
      // Two copies, masked and not (kMasked): most tiles need no mask, and the per-element tests of the
      // masked copy (two compares and a select each, their predicates moved through registers) were
      // about a third of the loop's instructions (tools/sass.py).
      auto probabilities_and_grads = [&](auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
        for (int nb = 0; nb < kMB; ++nb) {
          const int cl = nb * 8 + 2 * tq;  // local query column of elements 0 and 2
          const float lse0 = lds_f32(cLse + cl) * kLog2e, lse1 = lds_f32(cLse + cl + 1) * kLog2e;
          const float d0 = lds_f32(cD + cl), d1 = lds_f32(cD + cl + 1);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = wk0 + g + 8 * (e >> 1);
            const int q = qs0 + cl + (e & 1);
            float p = ex2_approx_ftz(fmaf(st[nb][e], scale_log2, -((e & 1) ? lse1 : lse0)));
            if (kMasked && (q < key || q >= T_)) p = 0.0f;
            st[nb][e] = p;
            dpt[nb][e] = p * (dpt[nb][e] - ((e & 1) ? d1 : d0));
          }
        }
      };
      if (qs0 < wk0 + 15 || qs0 + kBM > T_)
        probabilities_and_grads(std::true_type{});
      else
        probabilities_and_grads(std::false_type{});

      // dV += P^T dO, dK += dS^T Q (queries are the reduction dimension)
#pragma unroll
      for (int kk = 0; kk < kMB / 2; ++kk) {
        uint32_t pa[4], da[4];
        acc_to_a_frag(pa, st[2 * kk], st[2 * kk + 1]);
        acc_to_a_frag(da, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < kDB / 2; ++dp) {
          uint32_t bo[4], bq[4];
          load_b_frags_kn<kP>(bo, cdO + kk * 16 * kP + dp * 16, lane);
          mma_bf16_16816(dv[2 * dp], pa, bo[0], bo[1]);
          mma_bf16_16816(dv[2 * dp + 1], pa, bo[2], bo[3]);
          load_b_frags_kn<kP>(bq, cQ + kk * 16 * kP + dp * 16, lane);
          mma_bf16_16816(dk[2 * dp], da, bq[0], bq[1]);
          mma_bf16_16816(dk[2 * dp + 1], da, bq[2], bq[3]);
        }
      }
      if constexpr (kDq || kStoreDs) put_ds_rows(dpt);
    } else if constexpr (kDq || kStoreDs) {
      put_ds_rows(nullptr);  // no visible (query, key) pair for these keys: their dS^T rows are zero
    }
    if constexpr (kDq) bwd_add_dq_share<HS>(sdS, sK, dq_acc, dq_turns, kt, h, b, qt, nq, T_, C, NH);
    __syncthreads();  // all warps are done with `stage` (and sdS) before the next iteration refills it
    if constexpr (kDq) {
      // this key tile's turn at query tile qt is over: every thread's dq_acc writes precede the release
      if (threadIdx.x == 0) cuda::red_release_gpu_add(dq_turns + (static_cast<size_t>(b) * NH + h) * nq + qt, 1);
    }
  }

  if (warp_has_keys) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = wk0 + g + 8 * r;
      if (key >= T_) continue;
      bf16* krow = dqkv + (static_cast<size_t>(b) * T_ + key) * ld + C + static_cast<size_t>(h) * HS + 2 * tq;
#pragma unroll
      for (int db = 0; db < kDB; ++db) {
        *reinterpret_cast<__nv_bfloat162*>(krow + db * 8) =
            __floats2bfloat162_rn(dk[db][2 * r] * scale, dk[db][2 * r + 1] * scale);
        *reinterpret_cast<__nv_bfloat162*>(krow + C + db * 8) = __floats2bfloat162_rn(dv[db][2 * r], dv[db][2 * r + 1]);
      }
    }
  }
  if (bias_chunks != nullptr) {  // the k and v parts of this key tile's row of chunks
    static_assert(Cfg::kBlockN == kBiasChunkRows, "a dK/dV block covers one chunk of rows");
    float2 kv[2][kDB][2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const bool row = wk0 + g + 8 * r < T_;
#pragma unroll
      for (int db = 0; db < kDB; ++db) {
        kv[0][db][r] = row ? __bfloat1622float2(__floats2bfloat162_rn(dk[db][2 * r] * scale, dk[db][2 * r + 1] * scale))
                           : make_float2(0.0f, 0.0f);
        kv[1][db][r] =
            row ? __bfloat1622float2(__floats2bfloat162_rn(dv[db][2 * r], dv[db][2 * r + 1])) : make_float2(0.0f, 0.0f);
      }
    }
    float* chunk_row = bias_chunks + (static_cast<size_t>(b) * ((T_ + kBiasChunkRows - 1) / kBiasChunkRows) + kt) * ld;
    float* red = reinterpret_cast<float*>(dynamic_smem());  // the tiles are done with (the loop's last barrier)
    block_column_sums<kDB>(red, kv[0], chunk_row, C + h * HS);
    block_column_sums<kDB>(red, kv[1], chunk_row, 2 * C + h * HS);
  }
}

// A dQ warp's accumulators (16 rows from wq0, times scale, rounded to bf16) into the q part of dqkv;
// rows >= T_ are not stored.
template <int HS>
__device__ __forceinline__ void store_dq_rows(bf16* dqkv, const float (&dq)[TcTile<HS>::kDimBlocks][4], int wq0, int h,
                                              int b, int T_, int C, float scale) {
  const int lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
  const size_t ld = 3 * static_cast<size_t>(C);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wq0 + g + 8 * r;
    if (row >= T_) continue;
    bf16* qrow = dqkv + (static_cast<size_t>(b) * T_ + row) * ld + static_cast<size_t>(h) * HS + 2 * tq;
#pragma unroll
    for (int db = 0; db < TcTile<HS>::kDimBlocks; ++db) {
      *reinterpret_cast<__nv_bfloat162*>(qrow + db * 8) =
          __floats2bfloat162_rn(dq[db][2 * r] * scale, dq[db][2 * r + 1] * scale);
    }
  }
}

// The q part of a query tile's row of bias chunks (block_column_sums) from its warps' dQ accumulators, as
// store_dq_rows rounds them. Every thread of the block calls it, after the tiles' last use.
template <int HS>
__device__ __forceinline__ void dq_bias_sums(float* bias_chunks, const float (&dq)[TcTile<HS>::kDimBlocks][4], int qt,
                                             int wq0, int h, int b, int T_, int C, float scale) {
  constexpr int kDB = TcTile<HS>::kDimBlocks;
  const int g = (threadIdx.x % 32) >> 2;
  float2 q[kDB][2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool row = wq0 + g + 8 * r < T_;
#pragma unroll
    for (int db = 0; db < kDB; ++db)
      q[db][r] = row ? __bfloat1622float2(__floats2bfloat162_rn(dq[db][2 * r] * scale, dq[db][2 * r + 1] * scale))
                     : make_float2(0.0f, 0.0f);
  }
  const size_t row = static_cast<size_t>(b) * ((T_ + kBiasChunkRows - 1) / kBiasChunkRows) + qt;
  block_column_sums<kDB>(reinterpret_cast<float*>(dynamic_smem()), q, bias_chunks + row * 3 * static_cast<size_t>(C),
                         h * HS);
}

// dQ of one 64-row query tile (16 rows per warp): loops over the key tiles up to the diagonal.
template <int HS>
__device__ __forceinline__ void bwd_dq_tc_block(int qt, int h, int b, bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                const float* lse, const float* D, int T_, int C, int NH,
                                                float scale_log2, float scale, float* bias_chunks) {
  using Cfg = TcDqConfig<HS>;
  static_assert(Cfg::kBlockM == kBiasChunkRows, "a dQ block covers one chunk of rows");
  constexpr int kP = Cfg::kPitch;
  constexpr int kBN = Cfg::kBlockN;
  constexpr int kNB = kBN / 8;
  constexpr int kKS = TcTile<HS>::kKSteps;
  constexpr int kDB = TcTile<HS>::kDimBlocks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tq = lane & 3;

  bf16* sQ = reinterpret_cast<bf16*>(dynamic_smem());
  bf16* sdO = sQ + Cfg::kBlockM * kP;
  bf16* sK = sdO + Cfg::kBlockM * kP;  // [2][kBN][kP]
  bf16* sV = sK + 2 * kBN * kP;        // [2][kBN][kP]

  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* q_g = qkv + static_cast<size_t>(b) * T_ * ld + static_cast<size_t>(h) * HS;
  const bf16* k_g = q_g + C;
  const bf16* v_g = q_g + 2 * C;
  const bf16* do_g = dout + static_cast<size_t>(b) * T_ * C + static_cast<size_t>(h) * HS;
  const int q0 = qt * Cfg::kBlockM;
  const int q_end = T_ < q0 + Cfg::kBlockM ? T_ : q0 + Cfg::kBlockM;
  const int n_kt = (q_end - 1) / kBN + 1;
  const int wq0 = q0 + warp * 16;
  const bool warp_has_rows = wq0 < T_;

  tc_load_tile<HS, Cfg::kBlockM, Cfg::kThreads>(sQ, q_g, ld, q0, T_);
  tc_load_tile<HS, Cfg::kBlockM, Cfg::kThreads>(sdO, do_g, static_cast<size_t>(C), q0, T_);
  tc_load_tile<HS, kBN, Cfg::kThreads>(sK, k_g, ld, 0, T_);
  tc_load_tile<HS, kBN, Cfg::kThreads>(sV, v_g, ld, 0, T_);
  cp_async_commit();

  float lse2[2], Dr[2];  // rows g and g+8 of this warp
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wq0 + g + 8 * r;
    const size_t i = (static_cast<size_t>(b) * NH + h) * T_ + row;
    lse2[r] = row < T_ ? lse[i] * kLog2e : 0.0f;
    Dr[r] = row < T_ ? D[i] : 0.0f;
  }
  float dq[kDB][4];
#pragma unroll
  for (int db = 0; db < kDB; ++db) dq[db][0] = dq[db][1] = dq[db][2] = dq[db][3] = 0.0f;
  uint32_t qf[kKS][4], dof[kKS][4];

  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) {
      tc_load_tile<HS, kBN, Cfg::kThreads>(sK + (stage ^ 1) * kBN * kP, k_g, ld, (kt + 1) * kBN, T_);
      tc_load_tile<HS, kBN, Cfg::kThreads>(sV + (stage ^ 1) * kBN * kP, v_g, ld, (kt + 1) * kBN, T_);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* cK = sK + stage * kBN * kP;
    const bf16* cV = sV + stage * kBN * kP;
    const int k0 = kt * kBN;

    if (warp_has_rows && k0 <= wq0 + 15) {
      if (kt == 0) {
#pragma unroll
        for (int ks = 0; ks < kKS; ++ks) {
          load_a_frag<kP>(qf[ks], sQ + warp * 16 * kP + ks * 16, lane);
          load_a_frag<kP>(dof[ks], sdO + warp * 16 * kP + ks * 16, lane);
        }
      }

      // S = Q K^T, dP = dO V^T
      float s[kNB][4], dp[kNB][4];
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nb][e] = dp[nb][e] = 0.0f;
      }
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
#pragma unroll
        for (int np = 0; np < kNB / 2; ++np) {
          uint32_t bk[4], bv[4];
          load_b_frags_nk<kP>(bk, cK + np * 16 * kP + ks * 16, lane);
          mma_bf16_16816(s[2 * np], qf[ks], bk[0], bk[1]);
          mma_bf16_16816(s[2 * np + 1], qf[ks], bk[2], bk[3]);
          load_b_frags_nk<kP>(bv, cV + np * 16 * kP + ks * 16, lane);
          mma_bf16_16816(dp[2 * np], dof[ks], bv[0], bv[1]);
          mma_bf16_16816(dp[2 * np + 1], dof[ks], bv[2], bv[3]);
        }
      }

      // dS = P (dP - D); masked by selection (rows >= T_ only feed dQ rows that are never stored).
      // Masked and unmasked copies, as in bwd_dkdv_tc_block.
      auto score_grads = [&](auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            const int row = wq0 + g + 8 * r;
            const int col = k0 + nb * 8 + 2 * tq + (e & 1);
            float p = ex2_approx_ftz(fmaf(s[nb][e], scale_log2, -lse2[r]));
            if (kMasked && (col > row || col >= T_)) p = 0.0f;
            s[nb][e] = p * (dp[nb][e] - Dr[r]);
          }
        }
      };
      if (k0 + kBN - 1 > wq0 || k0 + kBN > T_)
        score_grads(std::true_type{});
      else
        score_grads(std::false_type{});

      // dQ += dS K
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t da[4];
        acc_to_a_frag(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int dpi = 0; dpi < kDB / 2; ++dpi) {
          uint32_t bk[4];
          load_b_frags_kn<kP>(bk, cK + kk * 16 * kP + dpi * 16, lane);
          mma_bf16_16816(dq[2 * dpi], da, bk[0], bk[1]);
          mma_bf16_16816(dq[2 * dpi + 1], da, bk[2], bk[3]);
        }
      }
    }
    __syncthreads();
  }

  if (warp_has_rows) store_dq_rows<HS>(dqkv, dq, wq0, h, b, T_, C, scale);
  if (bias_chunks != nullptr) dq_bias_sums<HS>(bias_chunks, dq, qt, wq0, h, b, T_, C, scale);
}

// kStoreDs: dQ of one 64-row query tile (16 rows per warp) = dS K over the key tiles up to the diagonal,
// dS read back from the DsTiles column qt that the dK/dV launch stored (one product a step: nothing is
// recomputed). The key tiles are summed in order, so the bits are the same in every run.
template <int HS>
__device__ __forceinline__ void bwd_dq_from_ds_block(int qt, int h, int b, bf16* dqkv, const bf16* ds, const bf16* qkv,
                                                     int T_, int C, int NH, float scale, float* bias_chunks) {
  using Cfg = TcDqFromDsConfig<HS>;
  static_assert(Cfg::kBlockM == kBiasChunkRows, "a dQ block covers one chunk of rows");
  constexpr int kP = Cfg::kPitch;
  constexpr int kBN = Cfg::kBlockN;
  constexpr int kDB = TcTile<HS>::kDimBlocks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  bf16* sK = reinterpret_cast<bf16*>(dynamic_smem());  // [2][kBN][kP]
  bf16* sdS = sK + 2 * kBN * kP;                       // [2][kBN][kDsPitch]: keys on rows

  const size_t ld = 3 * static_cast<size_t>(C);
  const bf16* k_g = qkv + static_cast<size_t>(b) * T_ * ld + C + static_cast<size_t>(h) * HS;
  const int q0 = qt * Cfg::kBlockM;
  const int q_end = T_ < q0 + Cfg::kBlockM ? T_ : q0 + Cfg::kBlockM;
  const int n_kt = (q_end - 1) / kBN + 1;
  const int wq0 = q0 + warp * 16;
  const bool warp_has_rows = wq0 < T_;
  const int head = b * NH + h;

  auto load = [&](int kt, int stage) {
    const int k0 = kt * kBN;
    tc_load_tile<HS, kBN, Cfg::kThreads>(sK + stage * kBN * kP, k_g, ld, k0, T_);
    tc_load_ds_rows<kBN, Cfg::kThreads>(
        sdS + stage * kBN * Cfg::kDsPitch,
        ds + DsTiles::tile(head, k0 / DsTiles::kSide, qt, T_) + (k0 % DsTiles::kSide) * DsTiles::kSide);
    cp_async_commit();
  };
  load(0, 0);

  float dq[kDB][4];
#pragma unroll
  for (int db = 0; db < kDB; ++db) dq[db][0] = dq[db][1] = dq[db][2] = dq[db][3] = 0.0f;

  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) {
      load(kt + 1, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* cK = sK + stage * kBN * kP;
    const bf16* cdS = sdS + stage * kBN * Cfg::kDsPitch;

    // Warp-uniform: key tiles wholly above this warp's rows hold only zeros (masked) and are skipped.
    if (warp_has_rows && kt * kBN <= wq0 + 15) {
      // dQ += dS K; A = dS (queries x keys) from the [key][query] tile, transposed on load (the
      // lanes' addresses as in bwd_add_dq_share)
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(
            a, cdS + (kk * 16 + (lane & 7) + ((lane >> 4) << 3)) * Cfg::kDsPitch + warp * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int dp = 0; dp < kDB / 2; ++dp) {
          uint32_t bk[4];
          load_b_frags_kn<kP>(bk, cK + kk * 16 * kP + dp * 16, lane);
          mma_bf16_16816(dq[2 * dp], a, bk[0], bk[1]);
          mma_bf16_16816(dq[2 * dp + 1], a, bk[2], bk[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with `stage` before the next iteration refills it
  }

  if (warp_has_rows) store_dq_rows<HS>(dqkv, dq, wq0, h, b, T_, C, scale);
  if (bias_chunks != nullptr) dq_bias_sums<HS>(bias_chunks, dq, qt, wq0, h, b, T_, C, scale);
}

// The whole backward in one launch: a block owns either the dK, dV of one key tile or the dQ of one query
// tile. Both roles only read their inputs, so they run concurrently and the causal tail of one fills in
// behind the other. Rank r of a head is its key tile r (n - r query tiles to visit) and its query tile
// n - 1 - r (n - r key tiles): the heaviest of both roles first, across the heads of a group
// (tile_order.hpp).
template <int HS>
struct TcBwdConfig {
  static_assert(TcDkdvConfig<HS>::kThreads == TcDqConfig<HS>::kThreads, "both roles share the block size");
  static_assert(TcDkdvConfig<HS>::kBlockN == TcDqConfig<HS>::kBlockM, "as many key tiles as query tiles: one rank each");
  static constexpr int kThreads = TcDkdvConfig<HS>::kThreads;
  static constexpr size_t kSmemBytes = TcDkdvConfig<HS>::kSmemBytes > TcDqConfig<HS>::kSmemBytes
                                           ? TcDkdvConfig<HS>::kSmemBytes
                                           : TcDqConfig<HS>::kSmemBytes;
  static int kv_blocks(int T_) { return (T_ + TcDkdvConfig<HS>::kBlockN - 1) / TcDkdvConfig<HS>::kBlockN; }
};

template <int HS>
__global__ void __launch_bounds__(TcBwdConfig<HS>::kThreads, 2)
    attention_bwd_tc(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D, int T_, int C,
                     int NH, attention_order::TileOrder order, float scale_log2, float scale, float* bias_chunks) {
  cuda::griddep_launch_dependents_then_wait();
  const attention_order::TileSlot slot = attention_order::tile_slot(order, static_cast<int>(blockIdx.x));
  const int h = slot.head % NH, b = slot.head / NH;
  if (slot.role == 0) {
    // key tile 0 sees the most query tiles
    bwd_dkdv_tc_block<HS, DqWork::kNone>(slot.rank, h, b, dqkv, nullptr, nullptr, nullptr, dout, qkv, lse, D, T_, C, NH,
                                         scale_log2, scale, bias_chunks);
  } else {
    // the last query tile has the longest causal prefix
    bwd_dq_tc_block<HS>(order.ranks - 1 - slot.rank, h, b, dqkv, dout, qkv, lse, D, T_, C, NH, scale_log2, scale,
                        bias_chunks);
  }
}

// AttentionBackwardPath::kAccumulateDq: one block per key tile computes dK, dV and its share of dQ; dQ is
// stored from the accumulator afterwards. A block takes its work from a ticket (an atomic counter cleared
// before the launch), not from blockIdx: CUDA does not promise to start blocks in blockIdx order, and the
// turns need the key tiles above kt of a head started before kt (dq_turns.cuh dq_turn_work: the key
// tiles of a head together, highest first, then head, then batch).
template <int HS>
__global__ void __launch_bounds__(TcDkdvConfig<HS>::kThreads, 2)
    attention_bwd_tc_accumulate_dq(bf16* dqkv, float* dq_acc, int* dq_turns, int* ticket, const bf16* dout,
                                   const bf16* qkv, const float* lse, const float* D, int T_, int C, int NH,
                                   float scale_log2, float scale) {
  cuda::griddep_launch_dependents_then_wait();
  __shared__ int work;
  if (threadIdx.x == 0) work = atomicAdd(ticket, 1);
  __syncthreads();
  const attention_detail::DqTurnWork w = attention_detail::dq_turn_work(work, static_cast<int>(gridDim.x), NH);
  bwd_dkdv_tc_block<HS, DqWork::kAccumulate>(w.kt, w.h, w.b, dqkv, dq_acc, dq_turns, nullptr, dout, qkv, lse, D, T_, C,
                                             NH, scale_log2, scale);
}

// AttentionBackwardPath::kStoreDs, first launch: a block owns the dK, dV of one key tile and stores its dS^T
// tiles (DsTiles); rank r of a head is its key tile r, the heaviest first across the heads (tile_order.hpp).
template <int HS>
__global__ void __launch_bounds__(TcDkdvConfig<HS>::kThreads, 2)
    attention_bwd_tc_store_ds(bf16* dqkv, bf16* ds, const bf16* dout, const bf16* qkv, const float* lse, const float* D,
                              int T_, int C, int NH, attention_order::TileOrder order, float scale_log2, float scale,
                              float* bias_chunks) {
  cuda::griddep_launch_dependents_then_wait();
  const attention_order::TileSlot slot = attention_order::tile_slot(order, static_cast<int>(blockIdx.x));
  bwd_dkdv_tc_block<HS, DqWork::kStoreDs>(slot.rank, slot.head % NH, slot.head / NH, dqkv, nullptr, nullptr, ds, dout,
                                          qkv, lse, D, T_, C, NH, scale_log2, scale, bias_chunks);
}

// kStoreDs, second launch: a block owns the dQ of one query tile; rank r of a head is its query tile n - 1 - r
// (the longest causal prefix first).
template <int HS>
__global__ void __launch_bounds__(TcDqFromDsConfig<HS>::kThreads, 4)
    attention_bwd_tc_dq_from_ds(bf16* dqkv, const bf16* ds, const bf16* qkv, int T_, int C, int NH,
                                attention_order::TileOrder order, float scale, float* bias_chunks) {
  cuda::griddep_launch_dependents_then_wait();
  const attention_order::TileSlot slot = attention_order::tile_slot(order, static_cast<int>(blockIdx.x));
  bwd_dq_from_ds_block<HS>(order.ranks - 1 - slot.rank, slot.head % NH, slot.head / NH, dqkv, ds, qkv, T_, C, NH, scale,
                           bias_chunks);
}

// The q part of dqkv (B,T,3C) = dq_acc (B,T,C) * scale, two columns per thread (C is even: hs % 16 == 0).
constexpr int kDqStoreThreads = 256;
__global__ void __launch_bounds__(kDqStoreThreads)
    attention_bwd_store_dq(bf16* dqkv, const float* dq_acc, long rows, int C, float scale) {
  cuda::griddep_launch_dependents_then_wait();
  const long pairs = C / 2;
  const long i = static_cast<long>(blockIdx.x) * kDqStoreThreads + threadIdx.x;
  if (i >= rows * pairs) return;
  const long row = i / pairs, col = (i % pairs) * 2;
  const float2 v = *reinterpret_cast<const float2*>(dq_acc + row * C + col);
  *reinterpret_cast<__nv_bfloat162*>(dqkv + row * 3 * C + col) = __floats2bfloat162_rn(v.x * scale, v.y * scale);
}

}  // namespace

// ================================================================================================
// Launchers
// ================================================================================================

namespace {

bool g_force_generic = false;
int g_tile_group_heads = 0;  // attention_set_tile_group_heads: 0 = groups sized by what L2 holds

AttentionForwardPath& forward_path() {
  static AttentionForwardPath path = choice_from_env<AttentionForwardPath>(
      "GPT2_ATTENTION_FWD", "forward path",
      {{"mma-sync", AttentionForwardPath::kMmaSync},
       {"wgmma", AttentionForwardPath::kWgmma},
       {"wgmma-pingpong", AttentionForwardPath::kWgmmaPingPong}});
  return path;
}

AttentionBackwardPath& backward_path() {
  static AttentionBackwardPath path =
      choice_from_env<AttentionBackwardPath>("GPT2_ATTENTION_BWD", "backward path",
                                             {{"recompute-dq", AttentionBackwardPath::kRecomputeDq},
                                              {"accumulate-dq", AttentionBackwardPath::kAccumulateDq},
                                              {"wgmma", AttentionBackwardPath::kWgmma},
                                              {"store-ds", AttentionBackwardPath::kStoreDs},
                                              {"wgmma-store-ds", AttentionBackwardPath::kWgmmaStoreDs}});
  return path;
}

int g_bias_sums = -1;  // attention_set_bias_sums: -1 = GPT2_ATTENTION_BIAS_SUMS

// The backward's scratch, each part 256-byte aligned: D = rowsum(dout * out) (B,NH,T) fp32, then what the
// path needs, from the same offset (a call uses one path): for kAccumulateDq and kWgmma the dQ accumulator
// (B,T,C) fp32, the turn counters (one int per (b, h, query tile) for tiles of at least 16 rows) and the
// block ticket after them; for kStoreDs and kWgmmaStoreDs the dS^T tiles (DsTiles, bf16).
struct BackwardScratch {
  float* D;
  float* dq_acc;
  int* dq_turns;
  int* ticket;
  size_t turns_bytes;  // counters and ticket: one memset clears both
  bf16* ds;
};
constexpr size_t kScratchAlign = 256;
size_t align_up(size_t n) {
  return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}
size_t d_bytes(int B, int T_, int NH) {
  return align_up(static_cast<size_t>(B) * NH * T_ * sizeof(float));
}
size_t dq_acc_bytes(int B, int T_, int C) {
  return align_up(static_cast<size_t>(B) * T_ * C * sizeof(float));
}
size_t turn_counters(int B, int T_, int NH) {
  return static_cast<size_t>(B) * NH * ((T_ + 15) / 16);
}
size_t turns_bytes(int B, int T_, int NH) {
  return align_up((turn_counters(B, T_, NH) + 1) * sizeof(int));
}
size_t ds_bytes(int B, int T_, int NH) {
  return align_up(static_cast<size_t>(B) * NH * DsTiles::per_head(T_) * sizeof(bf16));
}
// Bytes after D that `path` uses.
size_t path_bytes(AttentionBackwardPath path, int B, int T_, int C, int NH) {
  switch (path) {
    case AttentionBackwardPath::kAccumulateDq:
    case AttentionBackwardPath::kWgmma:
      return dq_acc_bytes(B, T_, C) + turns_bytes(B, T_, NH);
    case AttentionBackwardPath::kStoreDs:
    case AttentionBackwardPath::kWgmmaStoreDs:
      return ds_bytes(B, T_, NH);
    case AttentionBackwardPath::kRecomputeDq:
      break;
  }
  return 0;
}
BackwardScratch carve_scratch(void* scratch, int B, int T_, int C, int NH) {
  char* p = static_cast<char*>(scratch);
  BackwardScratch s;
  s.D = reinterpret_cast<float*>(p);
  s.dq_acc = reinterpret_cast<float*>(p + d_bytes(B, T_, NH));
  s.dq_turns = reinterpret_cast<int*>(p + d_bytes(B, T_, NH) + dq_acc_bytes(B, T_, C));
  s.ticket = s.dq_turns + turn_counters(B, T_, NH);
  s.turns_bytes = turns_bytes(B, T_, NH);
  s.ds = reinterpret_cast<bf16*>(p + d_bytes(B, T_, NH));
  return s;
}

// Calls f(std::integral_constant<int, HS>{}) when hs has a tensor-core kernel; returns whether it did.
template <class F>
bool dispatch_tc_head_size(int hs, F&& f) {
  switch (hs) {
    case 64:
      f(std::integral_constant<int, 64>{});
      return true;
    case 80:
      f(std::integral_constant<int, 80>{});
      return true;
    case 96:
      f(std::integral_constant<int, 96>{});
      return true;
    case 128:
      f(std::integral_constant<int, 128>{});
      return true;
    default:
      return false;
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

void check_shape(int B, int T_, int C, int NH) {
  GPT2_CHECK(B > 0 && T_ > 0 && C > 0 && NH > 0, "attention: B=" << B << " T=" << T_ << " C=" << C << " NH=" << NH);
  GPT2_CHECK(C % NH == 0, "attention: C=" << C << " is not a multiple of NH=" << NH);
  GPT2_CHECK(C / NH <= kMaxHeadSize,
             "attention: head size hs=C/NH=" << C / NH << " (C=" << C << ", NH=" << NH << ") exceeds " << kMaxHeadSize);
}

// The block order of an mma.sync launch over B * NH heads, `ranks` tiles a head and role, each head's
// blocks reading `inputs` tensors of T x hs bf16 (tile_order.hpp); inputs 0: one group over every head.
attention_order::TileOrder tile_order(int B, int NH, int T_, int hs, int ranks, int roles, int inputs) {
  const int heads = B * NH;
  const long head_bytes = static_cast<long>(inputs) * T_ * hs * static_cast<long>(sizeof(bf16));
  const attention_order::TileOrder order{heads, ranks, roles,
                                         attention_order::tile_groups(heads, head_bytes, g_tile_group_heads)};
  GPT2_CHECK(attention_order::tile_blocks(order) <= 0x7fffffffl,
             "attention: B=" << B << " x NH=" << NH << " x " << ranks * roles << " tiles is more blocks than a launch takes");
  return order;
}

// Scores enter exp2 as s * (1/sqrt(hs)) * log2(e).
float scale_of(int hs) {
  return 1.0f / std::sqrt(static_cast<float>(hs));
}

// The store-ds backwards' second launch (kStoreDs after the mma.sync dK/dV launch, kWgmmaStoreDs after the
// wgmma one): dQ of each 64-row query tile = dS K from the DsTiles, in one group over every head, the
// longest causal prefix first.
template <int HS>
void launch_dq_from_ds(bf16* dqkv, const bf16* ds, const bf16* qkv, int B, int T_, int C, int NH, cudaStream_t stream,
                       float* bias_chunks = nullptr) {
  using DqCfg = TcDqFromDsConfig<HS>;
  const attention_order::TileOrder q_order =
      tile_order(B, NH, T_, HS, (T_ + DqCfg::kBlockM - 1) / DqCfg::kBlockM, 1, 0);
  launch_kernel(attention_bwd_tc_dq_from_ds<HS>, dim3(static_cast<unsigned>(attention_order::tile_blocks(q_order))),
                dim3(DqCfg::kThreads), DqCfg::kSmemBytes, stream, dqkv, ds, qkv, T_, C, NH, q_order, scale_of(HS),
                bias_chunks);
}

}  // namespace

bool attention_bias_sums() {
  static const bool from_env = choice_from_env<bool>(
      "GPT2_ATTENTION_BIAS_SUMS", "choice of who sums the qkv bias gradient", {{"off", false}, {"on", true}});
  return g_bias_sums < 0 ? from_env : g_bias_sums == 1;
}

void attention_set_bias_sums(int on) {
  GPT2_CHECK(on >= -1 && on <= 1, "attention_set_bias_sums: " << on << " (1 on, 0 off, -1 GPT2_ATTENTION_BIAS_SUMS)");
  g_bias_sums = on;
}

void attention_force_generic(bool force) {
  g_force_generic = force;
}

void attention_set_tile_group_heads(int heads) {
  GPT2_CHECK(heads >= 0, "attention_set_tile_group_heads: " << heads << " heads (0 = the default)");
  g_tile_group_heads = heads;
}

void attention_set_forward_path(AttentionForwardPath path) {
  forward_path() = path;
}

AttentionForwardPath attention_forward_path() {
  return forward_path();
}

bool attention_fwd_wgmma_available() {
#if defined(GPT2_HAVE_SM90A)
  return attention_detail::attention_fwd_wgmma_ready();
#else
  return false;
#endif
}

bool attention_bwd_wgmma_available() {
#if defined(GPT2_HAVE_SM90A)
  return attention_detail::attention_bwd_wgmma_ready();
#else
  return false;
#endif
}

void attention_set_backward_path(AttentionBackwardPath path) {
  backward_path() = path;
}

AttentionBackwardPath attention_backward_path() {
  return backward_path();
}

size_t attention_backward_scratch_bytes(int B, int T_, int C, int NH, AttentionBackwardPath path) {
  return d_bytes(B, T_, NH) + path_bytes(path, B, T_, C, NH);
}

size_t attention_backward_scratch_bytes(int B, int T_, int C, int NH) {
  size_t most = 0;
  for (AttentionBackwardPath path :
       {AttentionBackwardPath::kRecomputeDq, AttentionBackwardPath::kAccumulateDq, AttentionBackwardPath::kWgmma,
        AttentionBackwardPath::kStoreDs, AttentionBackwardPath::kWgmmaStoreDs})
    most = std::max(most, attention_backward_scratch_bytes(B, T_, C, NH, path));
  return most;
}

template <class T>
void attention_forward_cuda(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH, cudaStream_t stream) {
  check_shape(B, T_, C, NH);
  const int hs = C / NH;
  const float scale_log2 = scale_of(hs) * kLog2e;
  if constexpr (std::is_same_v<T, bf16>) {
#if defined(GPT2_HAVE_SM90A)
    const AttentionForwardPath path = forward_path();
    if (!g_force_generic && path != AttentionForwardPath::kMmaSync && attention_detail::attention_fwd_wgmma_ready() &&
        attention_detail::attention_fwd_wgmma_takes(qkv, out, C, NH)) {
      const bool pingpong = path == AttentionForwardPath::kWgmmaPingPong;
      record_kernel_path("attention forward", pingpong ? "wgmma-pingpong" : "wgmma");
      attention_detail::attention_fwd_wgmma(pingpong, out, lse, qkv, B, T_, C, NH, stream);
      return;
    }
#endif
    if (!g_force_generic && aligned16(qkv) && aligned16(out)) {
      const bool done = dispatch_tc_head_size(hs, [&](auto hs_const) {
        constexpr int HS = decltype(hs_const)::value;
        using Cfg = TcFwdConfig<HS>;
        // reads q, k and v of its head
        const attention_order::TileOrder order =
            tile_order(B, NH, T_, HS, (T_ + Cfg::kBlockM - 1) / Cfg::kBlockM, 1, 3);
        launch_kernel(attention_fwd_tc<HS>, dim3(static_cast<unsigned>(attention_order::tile_blocks(order))),
                      dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, out, lse, qkv, T_, C, NH, scale_log2, order);
      });
      if (done) {
        record_kernel_path("attention forward", "mma.sync");
        return;
      }
    }
  }
  record_kernel_path("attention forward", "simt");
  const dim3 grid(static_cast<unsigned>((T_ + SimtTiles::kRows - 1) / SimtTiles::kRows), NH, B);
  launch_kernel(attention_fwd_simt<T>, grid, dim3(SimtTiles::kThreads), SimtTiles::fwd_smem_bytes(hs), stream, out, lse,
                qkv, T_, C, NH, hs, scale_log2);
}

size_t attention_bias_chunks_bytes(int B, int T_, int C) {
  return static_cast<size_t>(attention_bias_chunk_rows(B, T_)) * 3 * static_cast<size_t>(C) * sizeof(float);
}

int attention_bias_chunk_rows(int B, int T_) {
  return B * ((T_ + kBiasChunkRows - 1) / kBiasChunkRows);
}

template <class T>
int attention_backward_cuda(T* dqkv, void* scratch, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                            int T_, int C, int NH, cudaStream_t stream, float* bias_chunks) {
  check_shape(B, T_, C, NH);
  GPT2_CHECK(scratch != nullptr, "attention backward: scratch is null (needs "
                                     << attention_backward_scratch_bytes(B, T_, C, NH) << " bytes)");
  const int hs = C / NH;
  const float scale = scale_of(hs);
  const float scale_log2 = scale * kLog2e;
  GPT2_CHECK(reinterpret_cast<uintptr_t>(scratch) % kScratchAlign == 0,
             "attention backward: scratch must be " << kScratchAlign << "-byte aligned");
  const BackwardScratch parts = carve_scratch(scratch, B, T_, C, NH);
  float* D = parts.D;

  const long rows = static_cast<long>(B) * T_ * NH;
  const long rowdot_blocks = (rows + kRowdotThreads / 32 - 1) / (kRowdotThreads / 32);
  launch_kernel(attention_bwd_rowdot<T>, dim3(static_cast<unsigned>(rowdot_blocks)), dim3(kRowdotThreads), 0, stream, D,
                dout, out, B, T_, C, NH);

  if constexpr (std::is_same_v<T, bf16>) {
#if defined(GPT2_HAVE_SM90A)
    if (!g_force_generic && backward_path() == AttentionBackwardPath::kWgmma &&
        attention_detail::attention_bwd_wgmma_ready() &&
        attention_detail::attention_bwd_wgmma_takes(dqkv, dout, qkv, C, NH)) {
      // kAccumulateDq's scratch and protocol: the counters and ticket cleared, dq_acc needs no clearing
      record_kernel_path("attention backward", "wgmma");
      CUDA_CHECK(cudaMemsetAsync(parts.dq_turns, 0, parts.turns_bytes, stream));
      attention_detail::attention_bwd_wgmma(dqkv, parts.dq_acc, parts.dq_turns, parts.ticket, dout, qkv, lse, D, B, T_,
                                            C, NH, stream);
      const long rows_btc = static_cast<long>(B) * T_;
      const long pairs = rows_btc * (C / 2);
      launch_kernel(attention_bwd_store_dq, dim3(static_cast<unsigned>((pairs + kDqStoreThreads - 1) / kDqStoreThreads)),
                    dim3(kDqStoreThreads), 0, stream, dqkv, parts.dq_acc, rows_btc, C, scale);
      return 0;
    }
    if (!g_force_generic && backward_path() == AttentionBackwardPath::kWgmmaStoreDs &&
        attention_detail::attention_bwd_wgmma_ready() &&
        attention_detail::attention_bwd_wgmma_takes(dqkv, dout, qkv, C, NH)) {
      // kStoreDs's scratch and second launch: nothing to clear (every tile that dQ reads is written)
      record_kernel_path("attention backward", "wgmma-store-ds");
      attention_detail::attention_bwd_wgmma_store_ds(dqkv, parts.ds, dout, qkv, lse, D, B, T_, C, NH, stream);
      launch_dq_from_ds<attention_detail::kWgmmaHeadSize>(dqkv, parts.ds, qkv, B, T_, C, NH, stream);
      return 0;
    }
#endif
    if (!g_force_generic && aligned16(dqkv) && aligned16(dout) && aligned16(qkv)) {
      int chunk_rows = 0;  // what the path wrote into bias_chunks
      const bool done = dispatch_tc_head_size(hs, [&](auto hs_const) {
        constexpr int HS = decltype(hs_const)::value;
        using Cfg = TcBwdConfig<HS>;
        const int n_kv = Cfg::kv_blocks(T_);
        if (backward_path() == AttentionBackwardPath::kAccumulateDq) {
          record_kernel_path("attention backward", "accumulate-dq");
          using Dkdv = TcDkdvConfig<HS>;
          static_assert(Dkdv::kBlockM >= 16, "turn counters are sized for query tiles of >= 16 rows");
          CUDA_CHECK(cudaMemsetAsync(parts.dq_turns, 0, parts.turns_bytes, stream));
          launch_kernel(attention_bwd_tc_accumulate_dq<HS>, dim3(static_cast<unsigned>(n_kv), NH, B),
                        dim3(Dkdv::kThreads), Dkdv::kSmemBytesWithDq, stream, dqkv, parts.dq_acc, parts.dq_turns,
                        parts.ticket, dout, qkv, lse, D, T_, C, NH, scale_log2, scale);
          const long rows_btc = static_cast<long>(B) * T_;
          const long pairs = rows_btc * (C / 2);
          launch_kernel(attention_bwd_store_dq, dim3(static_cast<unsigned>((pairs + kDqStoreThreads - 1) / kDqStoreThreads)),
                        dim3(kDqStoreThreads), 0, stream, dqkv, parts.dq_acc, rows_btc, C, scale);
        } else if (backward_path() == AttentionBackwardPath::kStoreDs ||
                   backward_path() == AttentionBackwardPath::kWgmmaStoreDs) {  // the latter where wgmma does not apply
          record_kernel_path("attention backward", "store-ds");
          // each launch in one group over every head, its heaviest tiles first (as recompute-dq's)
          const attention_order::TileOrder kv_order = tile_order(B, NH, T_, HS, n_kv, 1, 0);
          launch_kernel(attention_bwd_tc_store_ds<HS>,
                        dim3(static_cast<unsigned>(attention_order::tile_blocks(kv_order))),
                        dim3(TcDkdvConfig<HS>::kThreads), TcDkdvConfig<HS>::kSmemBytes, stream, dqkv, parts.ds, dout,
                        qkv, lse, D, T_, C, NH, kv_order, scale_log2, scale, bias_chunks);
          launch_dq_from_ds<HS>(dqkv, parts.ds, qkv, B, T_, C, NH, stream, bias_chunks);
          if (bias_chunks != nullptr) chunk_rows = attention_bias_chunk_rows(B, T_);
        } else {
          record_kernel_path("attention backward", "recompute-dq");
          // rank r: key tile r and query tile n_kv - 1 - r, over every head in one group (each block
          // reads q, k, v and dout of its head; on the H200, 2026-11-27, one group over B = 64's 768 heads,
          // 384 MiB of them, ran 2% faster than groups of 40 MiB, and over B = 8's 0.3%: the backward's
          // tiles are long enough that L2 refills them)
          const attention_order::TileOrder order = tile_order(B, NH, T_, HS, n_kv, 2, 0);
          launch_kernel(attention_bwd_tc<HS>, dim3(static_cast<unsigned>(attention_order::tile_blocks(order))),
                        dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, dqkv, dout, qkv, lse, D, T_, C, NH, order,
                        scale_log2, scale, bias_chunks);
          if (bias_chunks != nullptr) chunk_rows = attention_bias_chunk_rows(B, T_);
        }
      });
      if (done) return chunk_rows;
    }
  }
  record_kernel_path("attention backward", "simt");
  const dim3 grid(static_cast<unsigned>((T_ + SimtTiles::kRows - 1) / SimtTiles::kRows), NH, B);
  launch_kernel(attention_bwd_dkdv_simt<T>, grid, dim3(SimtTiles::kThreads), SimtTiles::dkdv_smem_bytes(hs), stream,
                dqkv, dout, qkv, lse, D, T_, C, NH, hs, scale_log2, scale);
  launch_kernel(attention_bwd_dq_simt<T>, grid, dim3(SimtTiles::kThreads), SimtTiles::dq_smem_bytes(hs), stream, dqkv,
                dout, qkv, lse, D, T_, C, NH, hs, scale_log2, scale);
  return 0;
}

template void attention_forward_cuda<float>(float*, float*, const float*, int, int, int, int, cudaStream_t);
template void attention_forward_cuda<bf16>(bf16*, float*, const bf16*, int, int, int, int, cudaStream_t);
template int attention_backward_cuda<float>(float*, void*, const float*, const float*, const float*, const float*, int,
                                            int, int, int, cudaStream_t, float*);
template int attention_backward_cuda<bf16>(bf16*, void*, const bf16*, const bf16*, const bf16*, const float*, int, int,
                                           int, int, cudaStream_t, float*);

}  // namespace gpt2::kernels
