// GELU forward/backward on the GPU. Memory-bound elementwise kernels: 128-bit loads and stores over
// the 16-byte-aligned body, scalar code for the tail (or for everything when a pointer is misaligned).
#include <cstdint>

#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/gelu/gelu_cuda.hpp"

namespace gpt2::kernels {

namespace {

using cuda::from_f32;
using cuda::Packed128;
using cuda::to_f32;

struct GeluLaunch {
  // 8 warps a block: 8 resident blocks fill an SM (2048 threads) on sm_80 and sm_90, at 32 registers (the
  // backward takes 32 by itself, the forward under its launch bounds).
  static constexpr int kThreads = 256;
  // 128-bit vectors a forward thread loads before it computes any. With one, it had 16 bytes in flight, 32 KB
  // an SM, and the H200 measured 72% of copy at 8192 x 3072 bf16 (87% at 65536 rows; the backward, which
  // loads two inputs, 83% and 95%): with two, 64 KB an SM, at 32 registers (the launch bounds' 8 blocks an
  // SM) and no spills. The backward stays at one: two spilled 136 bytes in bf16 at 32 registers.
  static constexpr int kFwdVecsPerThread = 2;
  static constexpr int kFwdMinBlocksPerSm = 8;
  // Grid-stride cap: 2^16 blocks x 256 threads already cover 16M vectors a sweep (hundreds of MB), so
  // larger tensors loop instead of growing the grid past what any n could need.
  static constexpr long kMaxBlocks = 1L << 16;
};

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Threads needed: one per vecs_per_thread 128-bit vectors of the body, and one per scalar element of the rest.
inline unsigned grid_for(long vec_count, long scalar_count, int vecs_per_thread) {
  const long vec_threads = cuda::ceil_div(vec_count, vecs_per_thread);
  const long work = vec_threads > scalar_count ? vec_threads : scalar_count;
  long blocks = cuda::ceil_div(work, GeluLaunch::kThreads);
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < GeluLaunch::kMaxBlocks ? blocks : GeluLaunch::kMaxBlocks);
}

// Elements [0, vec_count*K) as 128-bit vectors (a thread's vectors i, i + stride, ... loaded
// kFwdVecsPerThread at a time), [vec_count*K, n) one by one.
template <class T>
__global__ void __launch_bounds__(GeluLaunch::kThreads, GeluLaunch::kFwdMinBlocksPerSm)
    gelu_fwd_vec128(T* __restrict__ out, const T* __restrict__ inp, long n, long vec_count) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int K = Packed128<T>::kSize, kV = GeluLaunch::kFwdVecsPerThread;
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  const long tid = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (long i = tid; i < vec_count; i += kV * stride) {
    Packed128<T> x[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      if (i + v * stride < vec_count) x[v] = cuda::load128cs(inp + (i + v * stride) * K);
    }
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      if (i + v * stride < vec_count) {
        Packed128<T> y;
#pragma unroll
        for (int k = 0; k < K; ++k) y[k] = from_f32<T>(cuda::gelu_f32(to_f32(x[v][k])));
        cuda::store128(out + (i + v * stride) * K, y);
      }
    }
  }
  for (long i = vec_count * K + tid; i < n; i += stride) out[i] = from_f32<T>(cuda::gelu_f32(to_f32(inp[i])));
}

// No __restrict__: dinp may alias dout (each element is read and then written by the same thread).
template <class T>
__global__ void __launch_bounds__(GeluLaunch::kThreads)
    gelu_bwd_vec128(T* dinp, const T* inp, const T* dout, long n, long vec_count) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int K = Packed128<T>::kSize;
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  const long tid = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (long i = tid; i < vec_count; i += stride) {
    const Packed128<T> x = cuda::load128cs(inp + i * K);
    const Packed128<T> d = cuda::load128cs(dout + i * K);
    Packed128<T> y;
#pragma unroll
    for (int k = 0; k < K; ++k) y[k] = from_f32<T>(cuda::gelu_grad_f32(to_f32(x[k])) * to_f32(d[k]));
    cuda::store128(dinp + i * K, y);
  }
  for (long i = vec_count * K + tid; i < n; i += stride)
    dinp[i] = from_f32<T>(cuda::gelu_grad_f32(to_f32(inp[i])) * to_f32(dout[i]));
}

}  // namespace

template <class T>
void gelu_forward_cuda(T* out, const T* inp, long n, cudaStream_t stream) {
  GPT2_CHECK(n >= 0, "n=" << n);
  if (n == 0) return;
  GPT2_CHECK(out != nullptr && inp != nullptr, "out=" << static_cast<void*>(out) << " inp=" << inp);
  constexpr int K = Packed128<T>::kSize;
  const long vec_count = aligned16(out) && aligned16(inp) ? n / K : 0;
  cuda::launch_kernel(gelu_fwd_vec128<T>, grid_for(vec_count, n - vec_count * K, GeluLaunch::kFwdVecsPerThread),
                      GeluLaunch::kThreads, 0, stream, out, inp, n, vec_count);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void gelu_backward_cuda(T* dinp, const T* inp, const T* dout, long n, cudaStream_t stream) {
  GPT2_CHECK(n >= 0, "n=" << n);
  if (n == 0) return;
  GPT2_CHECK(dinp != nullptr && inp != nullptr && dout != nullptr,
             "dinp=" << static_cast<void*>(dinp) << " inp=" << inp << " dout=" << dout);
  constexpr int K = Packed128<T>::kSize;
  const long vec_count = aligned16(dinp) && aligned16(inp) && aligned16(dout) ? n / K : 0;
  cuda::launch_kernel(gelu_bwd_vec128<T>, grid_for(vec_count, n - vec_count * K, 1), GeluLaunch::kThreads, 0, stream,
                      dinp, inp, dout, n, vec_count);
  CUDA_CHECK_LAUNCH();
}

template void gelu_forward_cuda<float>(float*, const float*, long, cudaStream_t);
template void gelu_forward_cuda<bf16>(bf16*, const bf16*, long, cudaStream_t);
template void gelu_backward_cuda<float>(float*, const float*, const float*, long, cudaStream_t);
template void gelu_backward_cuda<bf16>(bf16*, const bf16*, const bf16*, long, cudaStream_t);

}  // namespace gpt2::kernels
