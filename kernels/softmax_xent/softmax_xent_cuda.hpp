// Fused softmax + cross-entropy (+ its gradient) on the GPU: the same contract as softmax_xent.hpp,
// logits stored as T in {float, bf16}; max, sum and losses in fp32. Host-safe header (g++ compiles it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/cuda_dtype.hpp"

namespace gpt2::kernels {

// For each row i of logits (N, Vp), over the first V columns only (columns V..Vp-1 are padding and
// never reach the loss):
//   losses[i] = logsumexp(logits[i,:V]) - logits[i, targets[i]]
// When write_grad, the logits are overwritten in place with the gradient of (dloss * sum_i losses[i]):
//   logits[i,j] = dloss * (softmax(logits[i,:V])_j - [j == targets[i]])  for j < V,  0 for j >= V
// Probabilities are never stored; without write_grad the logits are only read.
//   [in] targets (N), each in [0, V) (validated on the host: the kernel does not check);
//   [out] losses (N) overwritten;  [in,out] logits (N, Vp)
// One block per row; N up to 65536 (any N >= 0), 1 <= V <= Vp.
template <class T>
void softmax_xent_cuda(float* losses, T* logits, const int32_t* targets, int N, int V, int Vp, float dloss,
                       bool write_grad, cudaStream_t stream);

}  // namespace gpt2::kernels
