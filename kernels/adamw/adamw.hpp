// AdamW with decoupled weight decay, as torch.optim.AdamW computes it.
#pragma once

namespace gpt2::kernels {

struct AdamWStep {
  float lr;            // learning rate of this step
  float beta1, beta2;  // moment decay rates
  float eps;           // added to sqrt(v_hat)
  float weight_decay;  // 0 for tensors that take no decay (biases, layernorm)
  float grad_scale;    // multiplies every gradient first (global-norm clipping factor, 1 if none)
  long step;           // 1-based step count, for bias correction
};

// For each i:  g = grad_scale * grads[i]
//   params *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   params -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//   [in] grads (n);  [in,out] params (n), m (n), v (n)
void adamw_update_cpu(float* params, const float* grads, float* m, float* v, long n, const AdamWStep& s);

}  // namespace gpt2::kernels
