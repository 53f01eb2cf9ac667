#include <cstddef>
#include <cmath>

#include "kernels/adamw/adamw.hpp"

namespace gpt2::kernels {

void adamw_update_cpu(float* params, const float* grads, float* m, float* v, long n, const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  const float step_size = static_cast<float>(s.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - s.lr * s.weight_decay;
  const float b1 = s.beta1, b2 = s.beta2, one_b1 = 1.0f - s.beta1, one_b2 = 1.0f - s.beta2;
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) {
    const float g = grads[i] * s.grad_scale;
    const float mi = b1 * m[i] + one_b1 * g;
    const float vi = b2 * v[i] + one_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + s.eps;
    params[i] = params[i] * decay - step_size * mi / denom;
  }
}

}  // namespace gpt2::kernels
