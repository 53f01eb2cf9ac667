// Element types of the CUDA backend. Host-safe (g++ compiles it): launchers declared with these types
// are called from plain C++ (the model, the tests, the benchmarks).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

namespace gpt2 {

using bf16 = __nv_bfloat16;

// --precision: what parameters, activations and gradients are stored in on the GPU. Master weights,
// Adam moments, layernorm and softmax statistics are fp32 in both.
enum class Precision { kFp32, kBf16 };

inline const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

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
