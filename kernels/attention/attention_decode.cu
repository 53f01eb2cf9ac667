// One query against a key/value cache (text generation): attention_decode_cuda, the GPU twin of
// attention_decode_cpu.
//
// One block per head. Each warp walks its share of the cached positions (t = warp, warp + kWarps, ...)
// with an online softmax: running max m, running sum l and the weighted value sum acc (lanes hold
// head dimensions lane, lane+32, ...), so no len-sized score buffer is needed and any len works.
// The warps' (m, l, acc) are then merged in warp order by one owner per output element. Every sum
// runs in a fixed order: the result is bit-identical from run to run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.hpp"
#include "kernels/attention/attention_cuda.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"

namespace gpt2::kernels {
namespace {

using cuda::from_f32;
using cuda::kWarpSize;
using cuda::to_f32;
using cuda::warp_sum;

// Launch configuration of the decode kernel.
struct DecodeConfig {
  // Head dimensions per lane: hs <= 32 * kDimsPerLane = 128, the largest GPT-2 head size we support
  // (the same bound as the flash-attention launchers).
  static constexpr int kDimsPerLane = 4;
  static constexpr int kMaxHeadSize = kWarpSize * kDimsPerLane;
  // 8 warps: a 1024-token cache is 128 positions per warp, and a decode step has only NH blocks, so
  // the parallelism inside a block is what hides the latency of the per-position warp reductions.
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * kWarpSize;
};

template <class T>
__global__ void __launch_bounds__(DecodeConfig::kThreads)
    attention_decode_block_per_head(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ kcache,
                                    const T* __restrict__ vcache, int len, int maxT, int hs, float scale) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int kDims = DecodeConfig::kDimsPerLane, kWarps = DecodeConfig::kWarps;
  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_acc[kWarps][DecodeConfig::kMaxHeadSize];

  const int h = blockIdx.x;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const size_t head = static_cast<size_t>(h) * maxT * hs;
  const T* kh = kcache + head;
  const T* vh = vcache + head;

  float qr[kDims], acc[kDims];
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    const int d = lane + i * kWarpSize;
    qr[i] = d < hs ? to_f32(q[h * hs + d]) : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int t = warp; t < len; t += kWarps) {
    const T* k = kh + static_cast<size_t>(t) * hs;
    const T* v = vh + static_cast<size_t>(t) * hs;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kDims; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < hs) dot += qr[i] * to_f32(k[d]);
    }
    const float s = warp_sum(dot) * scale;  // every lane holds the same score
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);  // 0 on the first position (m = -inf, s finite)
    const float p = expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kDims; ++i) {
      const int d = lane + i * kWarpSize;
      acc[i] = acc[i] * correction + (d < hs ? p * to_f32(v[d]) : 0.0f);
    }
    m = m_new;
  }
  // A warp that got no position keeps m = -inf, l = 0, acc = 0: its weight below is exp(-inf) = 0.
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    const int d = lane + i * kWarpSize;
    if (d < hs) warp_acc[warp][d] = acc[i];
  }
  __syncthreads();

  // Merge in warp order; warp 0 always holds position 0 (len >= 1), so m_all is finite.
  float m_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, warp_m[w]);
  for (int d = threadIdx.x; d < hs; d += DecodeConfig::kThreads) {
    float sum = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wgt = expf(warp_m[w] - m_all);
      sum += warp_l[w] * wgt;
      o += warp_acc[w][d] * wgt;  // an idle warp wrote acc = 0 and has wgt = exp(-inf) = 0
    }
    out[h * hs + d] = from_f32<T>(o / sum);
  }
}

}  // namespace

template <class T>
void attention_decode_cuda(T* out, const T* q, const T* kcache, const T* vcache, int len, int maxT, int C, int NH,
                           cudaStream_t stream) {
  GPT2_CHECK(C > 0 && NH > 0, "attention decode: C=" << C << " NH=" << NH);
  GPT2_CHECK(C % NH == 0, "attention decode: C=" << C << " is not a multiple of NH=" << NH);
  const int hs = C / NH;
  GPT2_CHECK(hs <= DecodeConfig::kMaxHeadSize, "attention decode: head size " << hs << " (C=" << C << ", NH=" << NH
                                                                              << ") exceeds "
                                                                              << DecodeConfig::kMaxHeadSize);
  GPT2_CHECK(len >= 1 && len <= maxT, "attention decode: len=" << len << " with maxT=" << maxT);
  GPT2_CHECK(out && q && kcache && vcache, "attention decode: a null pointer (len=" << len << ", C=" << C << ")");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  cuda::launch_kernel(attention_decode_block_per_head<T>, NH, DecodeConfig::kThreads, 0, stream, out, q, kcache, vcache,
                      len, maxT, hs, scale);
  CUDA_CHECK_LAUNCH();
}

template void attention_decode_cuda<float>(float*, const float*, const float*, const float*, int, int, int, int,
                                           cudaStream_t);
template void attention_decode_cuda<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int, int, int, int,
                                          cudaStream_t);

}  // namespace gpt2::kernels
