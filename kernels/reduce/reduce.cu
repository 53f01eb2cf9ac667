// Deterministic sum of squares (for the global gradient norm), column sums of partial rows, and in-place
// scaling, on the GPU.
// sum_squares: pass 1, a grid fixed by n alone, each block writes one double partial to scratch;
// pass 2, one block adds the partials in a fixed order. No atomics, so the bits never depend on the
// scheduling of blocks or streams.
// column_sums_add: the second pass of the sums over rows that other kernels leave as fp32 partial rows
// (layernorm's dweight/dbias, attention's qkv bias gradient), in a fixed order.
#include <cstdint>

#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/reduce/reduce_cuda.hpp"

namespace gpt2::kernels {

namespace {

using cuda::from_f32;
using cuda::kWarpSize;
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

// Column sums of partial rows: a block takes 8 columns (32 bytes of every partial row), so 2C = 1536
// columns (layernorm at C = 768) make 192 blocks, over every SM. Its 256 threads split the partial rows
// (row slots): with float4 loads, 2 lanes a row and 128 slots, so 512 partials are 4 loads a thread, all in
// flight at once (16 KB a block, the whole 3 MB in one round of L2 latency). The first form (32 columns x 16
// warps, scalar loads, 8 in flight a thread) ran 48 blocks at C = 768 and needed 4 rounds for 512 partials.
// The slots' sums are added by a fixed butterfly within each warp, then in warp order.
struct ColumnSumsLaunch {
  static constexpr int kCols = 8;
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / kWarpSize;
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

// lo[c] += sum_g partials[g][c] for c < split, hi[c - split] += the same for split <= c < width, in a fixed
// order: row slot s (of kSlots) sums g = s, s + kSlots, ... in order, the slots of a warp are added by a
// butterfly (xor shuffles: every lane ends with the same bits), and the warps' sums in warp order. kVec = 4
// reads float4 (width % 4 == 0 and 16-byte aligned partials), kVec = 1 any width.
template <class T, int kVec>
__global__ void __launch_bounds__(ColumnSumsLaunch::kThreads)
    column_sums_add(T* lo, T* hi, int split, const float* partials, int num_partials, int width) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int kLanesPerRow = ColumnSumsLaunch::kCols / kVec;  // 2 or 8
  constexpr int kSlots = ColumnSumsLaunch::kThreads / kLanesPerRow;
  static_assert(kWarpSize % kLanesPerRow == 0, "a warp holds whole row slots");
  __shared__ float sums[ColumnSumsLaunch::kWarps][ColumnSumsLaunch::kCols];
  const int slot = threadIdx.x / kLanesPerRow, sub = threadIdx.x % kLanesPerRow;
  const int col0 = blockIdx.x * ColumnSumsLaunch::kCols;
  const int j = col0 + sub * kVec;  // with kVec 4, width % 4 == 0: j < width means j + 3 < width
  // Batches of kBatch loads issued before any is added (a plain loop unrolled by nvcc runs its
  // remainder one load at a time first: 256 partials were 2 round trips in a row).
  constexpr int kBatch = 16 / kVec;
  float sum[kVec] = {};
  if (j < width) {
    const float* src = partials + j;
    for (int g0 = slot; g0 < num_partials; g0 += kBatch * kSlots) {
      float x[kBatch][kVec];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int g = g0 + b * kSlots;
        if (g >= num_partials) break;
        const float* p = src + static_cast<size_t>(g) * width;
        if constexpr (kVec == 4) {
          const float4 v = *reinterpret_cast<const float4*>(p);
          x[b][0] = v.x, x[b][1] = v.y, x[b][2] = v.z, x[b][3] = v.w;
        } else {
          x[b][0] = *p;
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (g0 + b * kSlots >= num_partials) break;
#pragma unroll
        for (int v = 0; v < kVec; ++v) sum[v] += x[b][v];
      }
    }
  }
#pragma unroll
  for (int offset = kLanesPerRow; offset < kWarpSize; offset *= 2)
#pragma unroll
    for (int v = 0; v < kVec; ++v) sum[v] += __shfl_xor_sync(0xffffffffu, sum[v], offset);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane < kLanesPerRow)
#pragma unroll
    for (int v = 0; v < kVec; ++v) sums[warp][sub * kVec + v] = sum[v];
  __syncthreads();
  const int c = col0 + static_cast<int>(threadIdx.x);
  if (threadIdx.x < ColumnSumsLaunch::kCols && c < width) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < ColumnSumsLaunch::kWarps; ++w) total += sums[w][threadIdx.x];
    T* dst = c < split ? lo + c : hi + (c - split);
    *dst = from_f32<T>(to_f32(*dst) + total);
  }
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

template <class T>
void column_sums_add_cuda(T* lo, T* hi, int split, const float* partials, int num_partials, int width,
                          cudaStream_t stream) {
  GPT2_CHECK(num_partials >= 0 && width >= 0 && split >= 0 && split <= width,
             "column_sums_add: num_partials " << num_partials << ", width " << width << ", split " << split);
  if (width == 0) return;
  GPT2_CHECK(partials != nullptr && (split == 0 || lo != nullptr) && (split == width || hi != nullptr),
             "column_sums_add with a null pointer");
  const auto kernel =
      width % 4 == 0 && reinterpret_cast<uintptr_t>(partials) % 16 == 0 ? column_sums_add<T, 4> : column_sums_add<T, 1>;
  cuda::launch_kernel(kernel, static_cast<unsigned>(cuda::ceil_div(static_cast<long>(width), ColumnSumsLaunch::kCols)),
                      ColumnSumsLaunch::kThreads, 0, stream, lo, hi, split, partials, num_partials, width);
  CUDA_CHECK_LAUNCH();
}

template void sum_squares_cuda<float>(double*, void*, const float*, long, cudaStream_t);
template void sum_squares_cuda<bf16>(double*, void*, const bf16*, long, cudaStream_t);
template void scale_cuda<float>(float*, float, long, cudaStream_t);
template void scale_cuda<bf16>(bf16*, float, long, cudaStream_t);
template void column_sums_add_cuda<float>(float*, float*, int, const float*, int, int, cudaStream_t);
template void column_sums_add_cuda<bf16>(bf16*, bf16*, int, const float*, int, int, cudaStream_t);

}  // namespace gpt2::kernels
