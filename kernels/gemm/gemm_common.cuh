// What every hand GEMM kernel shares (kernels/gemm/gemm.cu: mma.sync and SIMT; gemm_sm90.cu: wgmma):
// the output-tile order, the epilogue that finishes 4 consecutive outputs from fp32 accumulators, and
// the arithmetic of the bias gradient fused into a weight gradient.
// Internal to kernels/gemm/ (.cu files only).
#pragma once

#include <cstddef>
#include <type_traits>

#include "kernels/common/cuda_util.cuh"
#include "kernels/gemm/gemm_cuda.hpp"

namespace gpt2::kernels::gemm_detail {

using cuda::from_f32;
using cuda::to_f32;

// Tile order: GROUP_M row tiles are swept together along N, so the A rows and B columns that the
// resident blocks read stay in L2 (the LM head's B, wte, is larger than L2).
constexpr int kGroupM = 8;

// Linear tile index -> (tile_m, tile_n) in that order.
__host__ __device__ __forceinline__ void tile_coords(int pid, int tiles_m, int tiles_n, int& tile_m, int& tile_n) {
  const int in_group = kGroupM * tiles_n;
  const int first_m = (pid / in_group) * kGroupM;
  const int rows = tiles_m - first_m < kGroupM ? tiles_m - first_m : kGroupM;
  tile_m = first_m + (pid % in_group) % rows;
  tile_n = (pid % in_group) / rows;
}

// The first column tile whose row-0 tile lies at or after linear index `from` (tiles_n if none). Row tile 0
// is in the first group, whose tiles run down each column first: (0, tn) is tile tn * min(tiles_m, kGroupM).
// So the row-0 tiles from any index on are those of the last columns: a wgmma split tail's bias-gradient
// columns are a suffix (gemm.cu, gemm_hand).
__host__ __device__ __forceinline__ int first_row0_tile_from(int from, int tiles_m, int tiles_n) {
  const int rows = tiles_m < kGroupM ? tiles_m : kGroupM;
  const int tn = (from + rows - 1) / rows;
  return tn < tiles_n ? tn : tiles_n;
}

// Runtime flags -> template parameters, in one place (the host sides of gemm.cu and gemm_sm90.cu):
// f(std::true_type) or f(std::false_type); f(an integral_constant of the epilogue).
template <class F>
void dispatch_bool(bool v, F&& f) {
  if (v)
    f(std::true_type{});
  else
    f(std::false_type{});
}
template <class F>
void dispatch_epilogue(GemmEpilogue ep, F&& f) {
  switch (ep) {
    case GemmEpilogue::kNone: f(std::integral_constant<GemmEpilogue, GemmEpilogue::kNone>{}); break;
    case GemmEpilogue::kBias: f(std::integral_constant<GemmEpilogue, GemmEpilogue::kBias>{}); break;
    case GemmEpilogue::kBiasGelu: f(std::integral_constant<GemmEpilogue, GemmEpilogue::kBiasGelu>{}); break;
    case GemmEpilogue::kDGelu: f(std::integral_constant<GemmEpilogue, GemmEpilogue::kDGelu>{}); break;
  }
}

// ---------------------------------------------------------------------------------------------------
// 4 consecutive elements of T <-> 4 floats (callers guarantee 4*sizeof(T) alignment).

__device__ __forceinline__ void load4(const float* p, float v[4]) {
  const float4 x = *reinterpret_cast<const float4*>(p);
  v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
__device__ __forceinline__ void store4(float* p, const float v[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void load4(const bf16* p, float v[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
}
__device__ __forceinline__ void store4(bf16* p, const float v[4]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v[2], v[3]);
  uint2 raw;
  raw.x = *reinterpret_cast<const uint32_t*>(&lo);
  raw.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p) = raw;
}

// ---------------------------------------------------------------------------------------------------
// The epilogue, shared by every kernel that finishes an output tile.

template <class T>
struct EpilogueParams {
  T* c;
  const T* bias;  // (N) for kBias / kBiasGelu
  T* aux;         // (M,N): written by kBiasGelu, read by kDGelu
  int M, N;
  bool accumulate;  // C += (kNone only)
  bool vec4;        // N % 4 == 0 and c, bias, aux aligned to 4 elements: whole 4-vectors
};

template <class T, GemmEpilogue kEp>
__device__ __forceinline__ float epilogue_one(const EpilogueParams<T>& p, size_t idx, int col, float v) {
  if constexpr (kEp == GemmEpilogue::kNone) {
    if (p.accumulate) v += to_f32(p.c[idx]);
  } else if constexpr (kEp == GemmEpilogue::kBias) {
    v += to_f32(p.bias[col]);
  } else if constexpr (kEp == GemmEpilogue::kBiasGelu) {
    // GELU of the stored pre-activation, so forward and backward (which reads aux) see the same value.
    const T pre = from_f32<T>(v + to_f32(p.bias[col]));
    p.aux[idx] = pre;
    v = cuda::gelu_f32(to_f32(pre));
  } else {
    v *= cuda::gelu_grad_f32(to_f32(p.aux[idx]));
  }
  return v;
}

// The arithmetic and stores of 4 whole elements of C from idx on (p.vec4), given x: C's old values (kNone
// with kHasX: C +=), the biases of the 4 columns (kBias, kBiasGelu) or their pre-activations (kDGelu).
template <class T, GemmEpilogue kEp, bool kHasX = true>
__device__ __forceinline__ void finish4(const EpilogueParams<T>& p, size_t idx, float v[4], float x[4]) {
  if constexpr (kEp == GemmEpilogue::kNone) {
    if constexpr (kHasX) {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] += x[j];
    }
  } else if constexpr (kEp == GemmEpilogue::kBias) {
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] += x[j];
  } else if constexpr (kEp == GemmEpilogue::kBiasGelu) {
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = to_f32(from_f32<T>(v[j] + x[j]));  // the stored pre-activation
    store4(p.aux + idx, x);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = cuda::gelu_f32(x[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] *= cuda::gelu_grad_f32(x[j]);
  }
  store4(p.c + idx, v);
}

// Elements (row, col..col+3) of C; the caller guarantees row < M and col < N. kDGelu reads the 4
// pre-activations from p.aux, or from `pre` where the kernel has already staged them (gemm_sm90.cu, which
// stages them only for whole 4-vectors: the scalar path reads p.aux, the same values).
template <class T, GemmEpilogue kEp>
__device__ __forceinline__ void apply_epilogue4(const EpilogueParams<T>& p, int row, int col, float v[4],
                                                const float* pre = nullptr) {
  const size_t idx = static_cast<size_t>(row) * p.N + col;
  if (p.vec4) {
    float x[4];
    if constexpr (kEp == GemmEpilogue::kNone) {
      if (!p.accumulate) {
        finish4<T, kEp, false>(p, idx, v, x);
        return;
      }
      load4(p.c + idx, x);
    } else if constexpr (kEp == GemmEpilogue::kBias || kEp == GemmEpilogue::kBiasGelu) {
      load4(p.bias + col, x);
    } else if (pre != nullptr) {
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = pre[j];
    } else {
      load4(p.aux + idx, x);
    }
    finish4<T, kEp>(p, idx, v, x);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (col + j < p.N) p.c[idx + j] = from_f32<T>(epilogue_one<T, kEp>(p, idx + j, col + j, v[j]));
    }
  }
}

// Split-K partials: (row, col..col+3) of this split's M x N fp32 slice.
__device__ __forceinline__ void store_partial4(float* part, int N, bool vec4, int row, int col, const float v[4]) {
  const size_t idx = static_cast<size_t>(row) * N + col;
  if (vec4) {
    store4(part + idx, v);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (col + j < N) part[idx + j] = v[j];
  }
}

// Where a staged fp32 tile keeps its element (r, c).
// Rows of `ld` floats, padded beyond the tile's width so that the fragment stores (float2 per lane, 8 rows
// x 4 lanes per warp) fall on distinct banks (the mma.sync kernel).
struct PaddedStaging {
  int ld;
  __device__ __forceinline__ int at(int r, int c) const { return r * ld + c; }
};
// Rows of 128 floats, unpadded: the 8-float (32-byte) block c / 8 of row r is stored at block
// (c / 8) ^ (r % 8), so the 8 rows of a fragment store land on 8 different blocks (two per bank group
// of 8: the two wavefronts 256 bytes need), and a row is still one contiguous 512-byte run that a warp
// reads as float4s without conflict. 8 floats a row less than padding: the wgmma kernel needs the room
// (gemm_sm90.cu: the GELU gradient's pre-activation tile).
struct SwizzledStaging128 {
  __device__ __forceinline__ int at(int r, int c) const { return r * 128 + (((c >> 3) ^ (r & 7)) << 3) + (c & 7); }
};

// The pre-activations of kDGelu: read from global memory by the epilogue (apply_epilogue4), unless a
// kernel has staged its tile in shared memory (gemm_sm90.cu's AuxTileSmem).
struct AuxFromGlobal {
  __device__ __forceinline__ bool staged() const { return false; }
  __device__ __forceinline__ void load4(int, int, float*) const {}
};

// A whole tile (every element inside C, no split-K, vec4) finished without a branch in the loop: each
// thread loads kUnroll vectors of the staged tile and their x (finish4) before it computes any, so their
// latencies overlap. (The general loop below checks bounds and paths for every vector, and compiled to
// one vector's chain after another: a shared load, then the GELU's dependent MUFU ops, then the stores.)
// x_of(r, c, idx, x) fills the x of staged element (r, c), C's element idx.
template <class T, GemmEpilogue kEp, bool kHasX, int kRows, int kVecPerRow, int kThreads, int kUnroll, class Staging,
          class XOf>
__device__ __forceinline__ void finish_whole_tile(const float* stg, Staging layout, int row0, int col0,
                                                  const EpilogueParams<T>& ep, int tid, XOf x_of) {
  static_assert(kRows * kVecPerRow % (kThreads * kUnroll) == 0, "whole batches of vectors");
  const size_t base = static_cast<size_t>(row0) * ep.N + col0;
#pragma unroll 1
  for (int e0 = tid; e0 < kRows * kVecPerRow; e0 += kThreads * kUnroll) {
    float v[kUnroll][4], x[kUnroll][4];
    size_t idx[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int e = e0 + u * kThreads, r = e / kVecPerRow, c = e % kVecPerRow * 4;
      idx[u] = base + static_cast<size_t>(r) * ep.N + c;
      load4(stg + layout.at(r, c), v[u]);
      if constexpr (kHasX) x_of(r, c, idx[u], x[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) finish4<T, kEp, kHasX>(ep, idx[u], v[u], x[u]);
  }
}

// A tile of fp32 results staged in shared memory, finished 4 columns at a time: kRows rows of kVecPerRow
// 4-column vectors, element (r, c) at stg[layout.at(r, c)] being C's (row0 + r, col0 + c), C being M x N.
// Thread `tid` (< kThreads) of kThreads takes every kThreads-th vector, so a warp's 32 lanes cover a
// 128-column row segment (coalesced stores). Split-K partials go to `part`; otherwise the epilogue runs,
// with the tile's pre-activations from `aux` where it has them staged (its (r, c) are the staging
// tile's). kUnroll is the caller's to choose: what its registers allow. kWholeTiles: whole tiles take
// finish_whole_tile (the mma.sync kernel, at 255 registers, spilled 8 bytes on sm_90 with it, so it
// keeps the general loop alone).
template <class T, GemmEpilogue kEp, int kRows, int kVecPerRow, int kThreads, int kUnroll, bool kWholeTiles,
          class Staging, class AuxTile = AuxFromGlobal>
__device__ __forceinline__ void finish_staged_tile(const float* stg, Staging layout, int row0, int col0, int M, int N,
                                                   float* part, const EpilogueParams<T>& ep, int tid,
                                                   AuxTile aux = AuxTile{}) {
  if constexpr (kWholeTiles) {
    if (part == nullptr && ep.vec4 && row0 + kRows <= M && col0 + 4 * kVecPerRow <= N) {
      if constexpr (kEp == GemmEpilogue::kNone) {
        if (ep.accumulate)
          finish_whole_tile<T, kEp, true, kRows, kVecPerRow, kThreads, kUnroll>(
              stg, layout, row0, col0, ep, tid, [&](int, int, size_t idx, float x[4]) { load4(ep.c + idx, x); });
        else
          finish_whole_tile<T, kEp, false, kRows, kVecPerRow, kThreads, kUnroll>(stg, layout, row0, col0, ep, tid,
                                                                                 [](int, int, size_t, float*) {});
      } else if constexpr (kEp == GemmEpilogue::kBias || kEp == GemmEpilogue::kBiasGelu) {
        // A thread's 4 columns are the same in every row it takes: their biases are loaded once.
        static_assert(kThreads % kVecPerRow == 0, "a thread keeps its columns");
        float bias[4];
        load4(ep.bias + col0 + tid % kVecPerRow * 4, bias);
        const auto biases = [&](int, int, size_t, float x[4]) {
#pragma unroll
          for (int j = 0; j < 4; ++j) x[j] = bias[j];
        };
        finish_whole_tile<T, kEp, true, kRows, kVecPerRow, kThreads, kUnroll>(stg, layout, row0, col0, ep, tid, biases);
      } else if (aux.staged()) {
        finish_whole_tile<T, kEp, true, kRows, kVecPerRow, kThreads, kUnroll>(
            stg, layout, row0, col0, ep, tid, [&](int r, int c, size_t, float x[4]) { aux.load4(r, c, x); });
      } else {
        finish_whole_tile<T, kEp, true, kRows, kVecPerRow, kThreads, kUnroll>(
            stg, layout, row0, col0, ep, tid, [&](int, int, size_t idx, float x[4]) { load4(ep.aux + idx, x); });
      }
      return;
    }
  }
#pragma unroll(kUnroll)
  for (int e = tid; e < kRows * kVecPerRow; e += kThreads) {
    const int r = e / kVecPerRow, c4 = e % kVecPerRow;
    const int row = row0 + r, col = col0 + c4 * 4;
    if (row >= M || col >= N) continue;
    float v[4];
    load4(stg + layout.at(r, c4 * 4), v);
    if (part) {
      store_partial4(part, N, ep.vec4, row, col, v);
    } else if (kEp == GemmEpilogue::kDGelu && aux.staged()) {
      float pre[4];
      aux.load4(r, c4 * 4, pre);
      apply_epilogue4<T, kEp>(ep, row, col, v, pre);
    } else {
      apply_epilogue4<T, kEp>(ep, row, col, v);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The bias gradient fused into a weight gradient (gemm.cu weight_bias_grad_cuda; B not transposed): the
// blocks of row tile 0 also sum op(B)'s columns over their K range, one plain fp32 sum per K step of the
// kernel, added up with Kahan's compensation.

// sum += x with Kahan's compensation c: K/kBK tile sums per column, so the running sum keeps the accuracy
// of a pairwise one (no fast-math for these files: the compensation is not optimised away).
__device__ __forceinline__ void kahan_add(float& sum, float& c, float x) {
  const float y = x - c;
  const float t = sum + y;
  c = (t - sum) - y;
  sum = t;
}

// Stores one column's sum over split `split`'s K range: without split-K into dbias (+=, as T; one block
// per column tile, so no race); with it into dbias_partial [splits][N] (fp32), which gemm.cu's
// bias_backward_add_chunks adds into dbias in split order (deterministic).
template <class T>
__device__ __forceinline__ void store_bias_grad(T* dbias, float* dbias_partial, int N, int split, int col, float sum) {
  if (col >= N) return;
  if (dbias_partial != nullptr)
    dbias_partial[static_cast<size_t>(split) * N + col] = sum;
  else
    dbias[col] = from_f32<T>(to_f32(dbias[col]) + sum);
}

}  // namespace gpt2::kernels::gemm_detail
