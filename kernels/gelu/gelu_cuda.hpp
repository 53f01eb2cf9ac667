// GELU (tanh approximation) on the GPU: the same contract as gelu.hpp, storage type T in {float, bf16},
// arithmetic in fp32. Host-safe header (g++ compiles it).
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/cuda_dtype.hpp"

namespace gpt2::kernels {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   [in] inp (n);  [out] out (n) overwritten
template <class T>
void gelu_forward_cuda(T* out, const T* inp, long n, cudaStream_t stream);

// dinp = dout * gelu'(inp)
//   [in] inp (n), dout (n);  [out] dinp (n) overwritten (may alias dout, not inp)
template <class T>
void gelu_backward_cuda(T* dinp, const T* inp, const T* dout, long n, cudaStream_t stream);

}  // namespace gpt2::kernels
