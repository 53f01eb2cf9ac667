// Element types of the CUDA backend. Host-safe (g++ compiles it): launchers declared with these types
// are called from plain C++ (the model, the tests, the benchmarks).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "core/backend.hpp"  // Precision

namespace gpt2 {

using bf16 = __nv_bfloat16;

// Host-side conversions (the device side uses the intrinsics in cuda_util.cuh).
inline float to_float_host(float x) { return x; }
inline float to_float_host(bf16 x) { return __bfloat162float(x); }
template <class T>
inline T from_float_host(float x);
template <>
inline float from_float_host<float>(float x) { return x; }
template <>
inline bf16 from_float_host<bf16>(float x) { return __float2bfloat16(x); }  // round to nearest even

}  // namespace gpt2
