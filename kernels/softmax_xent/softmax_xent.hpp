// Fused softmax + cross-entropy (+ its gradient), over the real vocabulary only.
#pragma once

#include <cstdint>

namespace gpt2::kernels {

// For each row i of logits (N, Vp), over the first V columns only (columns V..Vp-1 are padding and
// never reach the loss):
//   losses[i] = logsumexp(logits[i,:V]) - logits[i, targets[i]]
// When write_grad, the logits are overwritten in place with the gradient of (dloss * sum_i losses[i]):
//   logits[i,j] = dloss * (softmax(logits[i,:V])_j - [j == targets[i]])  for j < V,  0 for j >= V
// so probabilities are never stored separately.
//   [in] targets (N), each in [0, V);  [out] losses (N);  [in,out] logits (N,Vp)
void softmax_xent_cpu(float* losses, float* logits, const int32_t* targets, int N, int V, int Vp, float dloss,
                      bool write_grad);

}  // namespace gpt2::kernels
