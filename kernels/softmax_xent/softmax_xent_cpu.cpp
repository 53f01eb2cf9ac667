#include <cstddef>
#include <cmath>

#include "kernels/common/cpu_math.hpp"
#include "kernels/softmax_xent/softmax_xent.hpp"

namespace gpt2::kernels {

void softmax_xent_cpu(float* losses, float* logits, const int32_t* targets, int N, int V, int Vp, float dloss,
                      bool write_grad) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    float* x = logits + static_cast<size_t>(i) * Vp;
    float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
    for (int j = 0; j < V; ++j) maxv = x[j] > maxv ? x[j] : maxv;
    const float target_logit = x[targets[i]];
    float sum = 0.0f;
    if (write_grad) {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) {
        const float e = cpu::fast_expf(x[j] - maxv);
        x[j] = e;
        sum += e;
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) sum += cpu::fast_expf(x[j] - maxv);
    }
    losses[i] = std::log(sum) + maxv - target_logit;
    if (write_grad) {
      const float scale = dloss / sum;
#pragma omp simd
      for (int j = 0; j < V; ++j) x[j] *= scale;
      x[targets[i]] -= dloss;
      for (int j = V; j < Vp; ++j) x[j] = 0.0f;
    }
  }
}

}  // namespace gpt2::kernels
