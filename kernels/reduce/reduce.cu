// Deterministic sum of squares (for the global gradient norm) and in-place scaling, on the GPU.
// sum_squares: pass 1, a grid fixed by n alone, each block writes one double partial to scratch;
// pass 2, one block adds the partials in a fixed order. No atomics, so the bits never depend on the
// scheduling of blocks or streams.
#include <cstdint>

#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/reduce/reduce_cuda.hpp"

namespace gpt2::kernels {

namespace {

using cuda::from_f32;
using cuda::Packed128;
using cuda::to_f32;

struct SumSquaresLaunch {
  // 8 warps a block: 8 resident blocks fill an SM (2048 threads) on sm_80 and sm_90.
  static constexpr int kThreads = 256;
  // Elements per block before the grid grows: small buffers use few blocks (fewer partials to add).
  static constexpr long kElemsPerBlock = 16L * kThreads;
  // A constant cap rather than "blocks per SM x SMs": the partition, and so the result's bits, must not
  // depend on the device. 1024 blocks x 256 threads still fill a 132-SM H100.
  static constexpr long kMaxBlocks = 1024;
  // Pass 2: one block, each thread adds every kFinalThreads-th partial, then a fixed-order block sum.
  static constexpr int kFinalThreads = 1024;
};

struct ScaleLaunch {
  static constexpr int kThreads = 256;          // as above: 8 blocks fill an SM
  static constexpr long kMaxBlocks = 1L << 16;  // grid-stride cap; larger tensors loop
};

long sum_squares_blocks(long n) {
  const long b = cuda::ceil_div(n, SumSquaresLaunch::kElemsPerBlock);
  return b < 1 ? 1 : (b > SumSquaresLaunch::kMaxBlocks ? SumSquaresLaunch::kMaxBlocks : b);
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Fixed-order sum over the block (blockDim.x a multiple of 32); the result is valid in thread 0.
__device__ __forceinline__ double block_sum_double(double v) {
  __shared__ double shared[32];
  const int lane = threadIdx.x % cuda::kWarpSize, warp = threadIdx.x / cuda::kWarpSize;
  v = cuda::warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  double r = lane < static_cast<int>(blockDim.x / cuda::kWarpSize) ? shared[lane] : 0.0;
  return cuda::warp_sum(r);
}

// x^2 of a float is exact in double (24-bit significand squared fits in 53), as in sum_squares_cpu.
template <class T>
__global__ void __launch_bounds__(SumSquaresLaunch::kThreads)
    sum_squares_partials(double* __restrict__ partials, const T* __restrict__ x, long n, long vec_count) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int K = Packed128<T>::kSize;
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  const long tid = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  double acc = 0.0;
  for (long i = tid; i < vec_count; i += stride) {
    const Packed128<T> p = cuda::load128cs(x + i * K);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const double d = to_f32(p[k]);
      acc += d * d;
    }
  }
  for (long i = vec_count * K + tid; i < n; i += stride) {
    const double d = to_f32(x[i]);
    acc += d * d;
  }
  acc = block_sum_double(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(SumSquaresLaunch::kFinalThreads)
    sum_partials_in_order(double* __restrict__ result, const double* __restrict__ partials, int count) {
  cuda::griddep_launch_dependents_then_wait();
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum_double(acc);
  if (threadIdx.x == 0) *result = acc;
}

template <class T>
__global__ void __launch_bounds__(ScaleLaunch::kThreads)
    scale_vec128(T* __restrict__ x, float a, long n, long vec_count) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int K = Packed128<T>::kSize;
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  const long tid = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (long i = tid; i < vec_count; i += stride) {
    Packed128<T> p = cuda::load128cs(x + i * K);
#pragma unroll
    for (int k = 0; k < K; ++k) p[k] = from_f32<T>(to_f32(p[k]) * a);
    cuda::store128(x + i * K, p);
  }
  for (long i = vec_count * K + tid; i < n; i += stride) x[i] = from_f32<T>(to_f32(x[i]) * a);
}

}  // namespace

size_t sum_squares_scratch_bytes(long n) {
  GPT2_CHECK(n >= 0, "n=" << n);
  return static_cast<size_t>(sum_squares_blocks(n)) * sizeof(double);
}

template <class T>
void sum_squares_cuda(double* result_device, void* scratch, const T* x, long n, cudaStream_t stream) {
  GPT2_CHECK(n >= 0, "n=" << n);
  GPT2_CHECK(result_device != nullptr && scratch != nullptr,
             "result_device=" << result_device << " scratch=" << scratch);
  GPT2_CHECK(reinterpret_cast<uintptr_t>(scratch) % alignof(double) == 0,
             "scratch=" << scratch << " not 8-byte aligned");
  GPT2_CHECK(n == 0 || x != nullptr, "x=" << static_cast<const void*>(x) << " n=" << n);
  constexpr int K = Packed128<T>::kSize;
  const long blocks = sum_squares_blocks(n);
  const long vec_count = aligned16(x) ? n / K : 0;
  auto* partials = static_cast<double*>(scratch);
  cuda::launch_kernel(sum_squares_partials<T>, static_cast<unsigned>(blocks), SumSquaresLaunch::kThreads, 0, stream,
                      partials, x, n, vec_count);
  CUDA_CHECK_LAUNCH();
  cuda::launch_kernel(sum_partials_in_order, 1, SumSquaresLaunch::kFinalThreads, 0, stream, result_device, partials,
                      static_cast<int>(blocks));
  CUDA_CHECK_LAUNCH();
}

template <class T>
void scale_cuda(T* x, float a, long n, cudaStream_t stream) {
  GPT2_CHECK(n >= 0, "n=" << n);
  if (n == 0) return;
  GPT2_CHECK(x != nullptr, "x=" << static_cast<void*>(x) << " n=" << n);
  constexpr int K = Packed128<T>::kSize;
  const long vec_count = aligned16(x) ? n / K : 0;
  const long work = vec_count > n - vec_count * K ? vec_count : n - vec_count * K;
  long blocks = cuda::ceil_div(work, ScaleLaunch::kThreads);
  blocks = blocks < 1 ? 1 : (blocks > ScaleLaunch::kMaxBlocks ? ScaleLaunch::kMaxBlocks : blocks);
  cuda::launch_kernel(scale_vec128<T>, static_cast<unsigned>(blocks), ScaleLaunch::kThreads, 0, stream, x, a, n,
                      vec_count);
  CUDA_CHECK_LAUNCH();
}

template void sum_squares_cuda<float>(double*, void*, const float*, long, cudaStream_t);
template void sum_squares_cuda<bf16>(double*, void*, const bf16*, long, cudaStream_t);
template void scale_cuda<float>(float*, float, long, cudaStream_t);
template void scale_cuda<bf16>(bf16*, float, long, cudaStream_t);

}  // namespace gpt2::kernels
