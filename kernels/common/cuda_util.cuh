// Device-side building blocks shared by the CUDA kernels (.cu files only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/common/cuda_check.cuh"
#include "kernels/common/cuda_dtype.hpp"
#include "kernels/common/ptx.cuh"

namespace gpt2::cuda {

constexpr int kWarpSize = 32;

__host__ __device__ constexpr inline long ceil_div(long a, long b) { return (a + b - 1) / b; }

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

// Lets `kernel` launch with `bytes` of dynamic shared memory. Above the default 48 KB a kernel must opt in
// through an attribute of the function on the current device. It is set once per (kernel, device) and only
// raised afterwards: cudaFuncSetAttribute is a driver call, and on every launch it can wait for work
// already queued on the device. Thread-safe.
inline void allow_dynamic_smem(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> granted;
  const std::lock_guard<std::mutex> lock(mutex);
  size_t& current = granted[{kernel, device}];
  if (current >= bytes) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  current = bytes;
}
template <class... Params>
void allow_dynamic_smem(void (*kernel)(Params...), size_t bytes) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// exp and log through exp2/log2: exp(x) = exp2(x * kLog2e), log(x) = log2(x) * kLn2.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Two floats -> one register of two bf16, `lo` in the low half (the lower column of an MMA fragment).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Butterfly reductions: every lane ends with the same value, summed in the same order on every run.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 floats. Fixed order: deterministic. Ends with a __syncthreads, so it can be called
// again right away with the same `shared`.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < warps ? shared[lane] : 0.0f;
  r = warp_sum(r);
  __syncthreads();
  return r;
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < warps ? shared[lane] : -INFINITY;
  r = warp_max(r);
  __syncthreads();
  return r;
}

// 16 bytes of T, loaded or stored as one vector instruction. Callers guarantee 16-byte alignment
// (every parameter starts on a 64-element boundary; activation rows are multiples of 8 elements
// whenever the vector path is chosen) and fall back to scalar code otherwise.
template <class T>
struct alignas(16) Packed128 {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }
};
template <class T>
__device__ __forceinline__ Packed128<T> load128(const T* p) {
  Packed128<T> r;
  *reinterpret_cast<int4*>(&r) = *reinterpret_cast<const int4*>(p);
  return r;
}
// Streaming load: read once, do not keep in L1/L2 (activations read by a single pass).
template <class T>
__device__ __forceinline__ Packed128<T> load128cs(const T* p) {
  Packed128<T> r;
  *reinterpret_cast<int4*>(&r) = __ldcs(reinterpret_cast<const int4*>(p));
  return r;
}
template <class T>
__device__ __forceinline__ void store128(T* p, const Packed128<T>& v) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&v);
}

// GELU, tanh approximation, in fp32 (shared by the GELU kernels and the GEMM epilogues):
//   gelu(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u) = x / (1 + 2^v),  u = sqrt(2/pi) (x + 0.044715 x^3),
//   v = -2 u log2(e).
// Written as the sigmoid rather than with tanhf, for two reasons. It is shorter: nvcc 13.0 expands tanhf
// into both of its branches (ex2, rcp and a 5-term polynomial: 24 arithmetic PTX instructions for the
// GELU, 31 for its gradient); with one MUFU.EX2 and one MUFU.RCP (ptx.cuh) it is 8 and 14. The hand
// GEMM's bias + GELU and GELU gradient epilogues run this for every output element while the tensor cores
// wait (with tanhf, mlp_up's forward and mlp_down's input gradient ran at 40-63% of cuBLASLt on the H200,
// the other products mostly at 69-83%). And it is more accurate: 1 + tanh(u) cancels for negative x
// (x = -4: 1 + t is 3.5e-5, and rounding t alone, to a multiple of 6e-8 near -1, can move it by 1e-3 of
// itself), 1 / (1 + 2^v) cancels nowhere. The error is a few fp32 ulps plus 2^v's amplification of v's
// rounding (ElementwiseGeluFp32.AccurateOverTheWholeRange holds it to its bound). Both MUFU results are
// within about 2 ulp, and flush below 2^-126, which gives the right limit (x -> -inf: 2^v overflows,
// 1 / (1 + 2^v) -> 0 and x 0 -> -0; -inf itself gives NaN, as with tanhf). Every operation is rounded
// where written (an explicit fma, __fmul_rn where a caller could fuse), so every caller computes the same
// bits (the GELU kernel recomputing an epilogue's output under --recompute selective depends on it).
namespace gelu_detail {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kV = -2.0f * kS * kLog2e;   // -2 sqrt(2/pi) log2(e)
constexpr float kCubic = 0.044715f;
// sigmoid(2u) = 0.5 (1 + tanh(u)), from x and x^2
__device__ __forceinline__ float sigmoid_2u(float x, float x2) {
  return rcp_approx_ftz(1.0f + ex2_approx_ftz(kV * __fmaf_rn(kCubic * x2, x, x)));
}
}  // namespace gelu_detail

__device__ __forceinline__ float gelu_f32(float x) {
  return __fmul_rn(x, gelu_detail::sigmoid_2u(x, x * x));
}
// d gelu(x) / dx = s + s (1 - s) x 2 sqrt(2/pi) (1 + 3 0.044715 x^2), s = sigmoid(2u)
// (0.5 (1 - tanh(u)^2) = 2 s (1 - s)).
__device__ __forceinline__ float gelu_grad_f32(float x) {
  using namespace gelu_detail;
  const float x2 = x * x;
  const float s = sigmoid_2u(x, x2);
  // x^2 capped in the polynomial, so that where it overflows (|x| > 1.8e19; s (1 - s) is exactly 0 from
  // |x| = 11 on) the gradient is 1 or 0, not 0 times infinity (tanhf's form gave NaN there). The cap changes
  // nothing else. gelu'(+inf) is still NaN: 0 times x.
  const float poly = (2.0f * kS) * __fmaf_rn(3.0f * kCubic, fminf(x2, 1e4f), 1.0f);
  return __fmaf_rn(s * (1.0f - s) * x, poly, s);
}

}  // namespace gpt2::cuda

// After every kernel launch: reports a bad launch configuration at the call site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
