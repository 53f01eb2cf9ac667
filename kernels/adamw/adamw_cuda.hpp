// AdamW on the GPU: adamw_update_cpu (adamw.hpp) on fp32 master weights and fp32 moments, with the
// working copy of the parameters (T in {float, bf16}) refreshed from the new master. Host-safe header.
#pragma once

#include <cuda_runtime.h>

#include "kernels/adamw/adamw.hpp"
#include "kernels/common/cuda_dtype.hpp"

namespace gpt2::kernels {

// For each i:  g = grad_scale * grads[i]
//   master *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   master -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//   params = master rounded to T (round to nearest even)
//   [in] grads (n);  [in,out] master (n), m (n), v (n);  [out] params (n) overwritten
// For T = float, params may equal master (then master is updated once, in place, and written once);
// otherwise params must not overlap master, m or v.
template <class T>
void adamw_update_cuda(float* master, T* params, const T* grads, float* m, float* v, long n, const AdamWStep& s,
                       cudaStream_t stream);

}  // namespace gpt2::kernels
