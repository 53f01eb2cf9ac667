// Fused softmax + cross-entropy (+ gradient, in place) on the GPU, one block per row.
//   pass 1: each thread keeps an online (max, sum of exp) over its columns of [0, V); the block
//           combines them in a fixed order (deterministic) -> loss
//   pass 2 (write_grad): re-reads the row, which is still in L2, and overwrites it with the gradient.
// So a row costs one HBM read (+ one HBM write with the gradient); probabilities are never stored.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/softmax_xent/softmax_xent_cuda.hpp"

namespace gpt2::kernels {

namespace {

using cuda::from_f32;
using cuda::Packed128;
using cuda::to_f32;

struct SoftmaxXentLaunch {
  // One block per row. 1024 threads: a 50304-wide bf16 row is 6288 128-bit vectors, ~6 per thread; at
  // most 2 rows per SM are in flight, so the rows pass 2 re-reads (~26 MB over 132 SMs of 100 KB rows)
  // are still in L2 (50 MB on H100, 40 MB on A100) and the row costs HBM traffic only once. (fp32
  // rows are twice as large, so with --precision fp32 part of pass 2 may come from HBM again.)
  static constexpr int kThreads = 1024;
  // Two resident blocks fill an SM (2048 threads): keeps ptxas at <= 32 registers a thread.
  static constexpr int kMinBlocksPerSm = 2;
};

using cuda::kLog2e;

// exp(x - max) as one multiply and the hardware exp2: two exps per element (one a pass) at HBM speed,
// cheaper than expf's range reduction. The relative error is a few ulp for x near max and grows only
// for terms far below max, which are too small to matter. One MUFU.EX2 (ptx.cuh's ex2_approx_ftz, terms
// below 2^-126 are 0), not exp2f, which adds a fix-up for subnormal results around it: this kernel is
// close to issue-bound (at the H200's 4.25 TB/s, 4 bytes an element is 4 elements a cycle an SM, room
// for about 31 instructions an element, and its two passes take some 20 by a count of the source).
__device__ __forceinline__ float exp_shifted(float x, float max) {
  return cuda::ex2_approx_ftz((x - max) * kLog2e);
}

// Pass 1 loads up to this many chunks of a thread before it folds any in: 4 x 16 bytes in flight a thread,
// 128 KB an SM, and a 50257-wide bf16 row (6.1 chunks a thread) in 2 or 3 rounds of memory latency, not 3-4.
// (It was a loop unrolled twice: 64 KB an SM, as little as the layernorm forward had when it ran at 72% of
// copy on the H200; this kernel ran at 73-79%.) The chunks are folded in the same order as before.
constexpr int kPass1Batch = 4;

// A chunk of W consecutive elements of T as loaded: W = 1 (scalar path) or W = Packed128<T>::kSize (128-bit
// path). Kept as loaded until it is folded in, so a batch in flight holds 4 registers a chunk, not W floats.
template <class T, int W>
struct Chunk {
  static_assert(W == 1 || W == Packed128<T>::kSize, "W must be 1 or one 128-bit vector");
  std::conditional_t<W == 1, T, Packed128<T>> raw;
  __device__ __forceinline__ void to_floats(float (&f)[W]) const {
    if constexpr (W == 1) {
      f[0] = to_f32(raw);
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) f[k] = to_f32(raw[k]);
    }
  }
};
template <int W, bool kStreaming, class T>
__device__ __forceinline__ Chunk<T, W> load_chunk(const T* p) {
  if constexpr (W == 1) {
    return {*p};
  } else {
    return {kStreaming ? cuda::load128cs(p) : cuda::load128(p)};
  }
}
// W consecutive elements of T as floats.
template <int W, bool kStreaming, class T>
__device__ __forceinline__ void load_f32(const T* p, float (&f)[W]) {
  load_chunk<W, kStreaming>(p).to_floats(f);
}
template <int W, class T>
__device__ __forceinline__ void store_f32(T* p, const float (&f)[W]) {
  if constexpr (W == 1) {
    *p = from_f32<T>(f[0]);
  } else {
    Packed128<T> x;
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] = from_f32<T>(f[k]);
    cuda::store128(p, x);
  }
}

// Folds W values into a running (max m, sum s of exp(x - m)). While everything seen is -inf the shift
// is 0, so exp's argument is never (-inf) - (-inf) = NaN.
template <int W>
__device__ __forceinline__ void online_add(float& m, float& s, const float (&f)[W]) {
  float cmax = f[0];
#pragma unroll
  for (int k = 1; k < W; ++k) cmax = fmaxf(cmax, f[k]);
  const float mnew = fmaxf(m, cmax);
  const float shift = mnew == -INFINITY ? 0.0f : mnew;
  float cs = 0.0f;
#pragma unroll
  for (int k = 0; k < W; ++k) cs += exp_shifted(f[k], shift);
  s = s * exp_shifted(m, shift) + cs;
  m = mnew;
}

// Folds chunks c, c + stride, ..., c + (kN - 1) stride of the row x into (m, s), in that order, with all kN
// loads issued before the first is used.
template <int kN, int W, class T>
__device__ __forceinline__ void fold_chunks(const T* x, int c, int stride, float& m, float& s) {
  Chunk<T, W> chunk[kN];
#pragma unroll
  for (int b = 0; b < kN; ++b) chunk[b] = load_chunk<W, false>(x + (c + b * stride) * W);  // L2 for pass 2
#pragma unroll
  for (int b = 0; b < kN; ++b) {
    float f[W];
    chunk[b].to_floats(f);
    online_add<W>(m, s, f);
  }
}

// W divides Vp and ceil(V/W)*W <= Vp, so chunk c = columns [c*W, c*W + W) never leaves the row.
template <class T, int W>
__global__ void __launch_bounds__(SoftmaxXentLaunch::kThreads, SoftmaxXentLaunch::kMinBlocksPerSm)
    softmax_xent_block_per_row(float* __restrict__ losses, T* __restrict__ logits, const int32_t* __restrict__ targets,
                               int V, int Vp, float dloss, bool write_grad) {
  cuda::griddep_launch_dependents_then_wait();
  __shared__ float shared[32];
  T* x = logits + static_cast<size_t>(blockIdx.x) * Vp;
  const int target = targets[blockIdx.x];
  // Read before the block reductions: their barriers order it before pass 2 overwrites the row.
  const float target_logit = threadIdx.x == 0 ? to_f32(x[target]) : 0.0f;

  // Pass 1: online max / sum over this thread's chunks; the one chunk that straddles V (if any) is
  // masked, the others need no per-element test.
  const int full_chunks = V / W;
  float m = -INFINITY, s = 0.0f;
  // Batches of kPass1Batch chunks, then what is left (at most kPass1Batch - 1 = 3: two, then one).
  const int stride = static_cast<int>(blockDim.x);
  int c = threadIdx.x;
  for (; c + (kPass1Batch - 1) * stride < full_chunks; c += kPass1Batch * stride) {
    fold_chunks<kPass1Batch, W>(x, c, stride, m, s);
  }
  static_assert(kPass1Batch == 4, "the rest below is at most 3 chunks");
  if (c + stride < full_chunks) {
    fold_chunks<2, W>(x, c, stride, m, s);
    c += 2 * stride;
  }
  if (c < full_chunks) fold_chunks<1, W>(x, c, stride, m, s);
  if (full_chunks * W < V && threadIdx.x == full_chunks % blockDim.x) {
    float f[W];
    load_f32<W, false>(x + full_chunks * W, f);
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (full_chunks * W + k >= V) f[k] = -INFINITY;
    online_add<W>(m, s, f);
  }
  const float row_max = cuda::block_max(m, shared);
  const float row_sum = cuda::block_sum(m == -INFINITY ? 0.0f : s * exp_shifted(m, row_max), shared);
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(row_sum) + row_max - target_logit;
  if (!write_grad) return;

  // Pass 2: gradient over the whole padded row (zeros past V).
  const float scale = dloss / row_sum;
  for (int c = threadIdx.x; c < Vp / W; c += blockDim.x) {
    const int j0 = c * W;
    float f[W];
    if (j0 < V) {
      load_f32<W, true>(x + j0, f);  // last read of this row
#pragma unroll
      for (int k = 0; k < W; ++k) f[k] = exp_shifted(f[k], row_max) * scale - (j0 + k == target ? dloss : 0.0f);
      if (j0 + W > V) {  // the chunk that straddles V: its padding part
#pragma unroll
        for (int k = 0; k < W; ++k)
          if (j0 + k >= V) f[k] = 0.0f;
      }
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) f[k] = 0.0f;
    }
    store_f32<W>(x + j0, f);
  }
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

template <class T>
void softmax_xent_cuda(float* losses, T* logits, const int32_t* targets, int N, int V, int Vp, float dloss,
                       bool write_grad, cudaStream_t stream) {
  GPT2_CHECK(N >= 0, "N=" << N);
  GPT2_CHECK(V >= 1 && V <= Vp, "V=" << V << " Vp=" << Vp);
  if (N == 0) return;
  GPT2_CHECK(
      losses != nullptr && logits != nullptr && targets != nullptr,
      "losses=" << static_cast<void*>(losses) << " logits=" << static_cast<void*>(logits) << " targets=" << targets);
  constexpr int K = Packed128<T>::kSize;
  // Every row starts 16-byte aligned when the first does and a row is a whole number of vectors.
  const bool vec = aligned16(logits) && Vp % K == 0;
  const dim3 grid(static_cast<unsigned>(N)), block(SoftmaxXentLaunch::kThreads);
  if (vec) {
    cuda::launch_kernel(softmax_xent_block_per_row<T, K>, grid, block, 0, stream, losses, logits, targets, V, Vp, dloss,
                        write_grad);
  } else {
    cuda::launch_kernel(softmax_xent_block_per_row<T, 1>, grid, block, 0, stream, losses, logits, targets, V, Vp, dloss,
                        write_grad);
  }
  CUDA_CHECK_LAUNCH();
}

template void softmax_xent_cuda<float>(float*, float*, const int32_t*, int, int, int, float, bool, cudaStream_t);
template void softmax_xent_cuda<bf16>(float*, bf16*, const int32_t*, int, int, int, float, bool, cudaStream_t);

}  // namespace gpt2::kernels
