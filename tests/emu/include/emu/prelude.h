// Force-included (-include) in front of the CUDA source compiled as host C++: CUDA keywords and the
// device builtins the kernels use, mapped onto the emulator.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

#include "emu/runtime.h"

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __grid_constant__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)

// A static `__shared__ T name dims;` (rewritten so by tests/emu/cuda_to_host.py): a reference to the
// block's storage for that declaration, in its shared window. The key is a static tag of the declaration's
// own: distinct for every declaration and every template instantiation, even on one line.
#define EMU_STATIC_SHARED(T, name, dims, align)                                                        \
  using name##_emu_shared_t = T dims;                                                                  \
  static const char name##_emu_tag = 0;                                                                \
  name##_emu_shared_t& name = *reinterpret_cast<name##_emu_shared_t*>(                                 \
      ::emu::static_smem(sizeof(name##_emu_shared_t), align, &name##_emu_tag, #name))

// In the GPU test build every `__shared__` of a .cu file is rewritten: one left (in a header, which the
// rewriter does not see) would become a per-thread local here, so it must not compile.
#ifdef EMU_REWRITTEN_SOURCES
#undef __shared__
#define __shared__ EMU_ERROR_a_shared_declaration_outside_the_rewritten_cu_files
#endif

// The builtin index variables: per emulated thread.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::syncwarp(mask); }
[[noreturn]] inline void __trap() { emu::trap("__trap()"); }

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = emu::shfl_xor_bits(mask, bits, lane_mask, width);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

// The device min/max overloads of CUDA's math headers (declared for nvcc only).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
// Round-to-nearest arithmetic that nvcc must not contract into an fma: host float arithmetic already is
// (g++ does not contract across these calls on x86-64 without -ffp-contract=fast and FMA code).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __expf(float x) { return std::exp(x); }
template <class T>
inline T __ldcs(const T* p) { return *p; }
// Global memory that other blocks (other std::threads) write: relaxed atomics, so the spin-wait protocols
// (attention backward's dQ turns) are data-race free; the ordering comes from the acquire/release flags.
template <class T>
inline T __ldcg(const T* p) {
  T v;
  __atomic_load(p, &v, __ATOMIC_RELAXED);
  return v;
}
template <class T>
inline void __stcg(T* p, T v) { __atomic_store(p, &v, __ATOMIC_RELAXED); }
inline int atomicAdd(int* p, int v) { return emu::atomic_add(p, v); }  // relaxed; a block's first one ranks it
inline int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }

// cuda_runtime.h's templated overload (declared for nvcc only): a kernel's address as the function key.
template <class T>
inline cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}
