#include <cstddef>
#include <cmath>

#include "kernels/layernorm/layernorm.hpp"

namespace gpt2::kernels {
namespace {

// The one place the normalised output is computed: forward and recompute (layernorm_apply_cpu) share
// it, so a recomputed layernorm output is bit-identical to the one the forward dropped.
inline void normalize_row(float* o, const float* x, float m, float s, const float* w, const float* b, int C) {
#pragma omp simd
  for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
}

inline void layernorm_row(float* o, float* mean_out, float* rstd_out, const float* x, const float* w,
                          const float* b, int C) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; ++c) sum += x[c];
  const float m = sum / C;
  float var = 0.0f;  // second pass over (x - mean): no cancellation, unlike E[x^2] - E[x]^2
#pragma omp simd reduction(+ : var)
  for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
  const float s = 1.0f / std::sqrt(var / C + kLayerNormEps);
  normalize_row(o, x, m, s, w, b, C);
  *mean_out = m;
  *rstd_out = s;
}

}  // namespace

void layernorm_forward_cpu(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                           const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const size_t off = static_cast<size_t>(i) * C;
    layernorm_row(out + off, mean + i, rstd + i, inp + off, weight, bias, C);
  }
}

void layernorm_apply_cpu(float* out, const float* inp, const float* mean, const float* rstd, const float* weight,
                         const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const size_t off = static_cast<size_t>(i) * C;
    normalize_row(out + off, inp + off, mean[i], rstd[i], weight, bias, C);
  }
}

void residual_layernorm_forward_cpu(float* residual, float* out, float* mean, float* rstd, const float* a,
                                    const float* b, const float* weight, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const size_t off = static_cast<size_t>(i) * C;
    float* r = residual + off;
#pragma omp simd
    for (int c = 0; c < C; ++c) r[c] = a[off + c] + b[off + c];
    layernorm_row(out + off, mean + i, rstd + i, r, weight, bias, C);
  }
}

void layernorm_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel
  {
    // dinp = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)),  dnorm = dout * weight
#pragma omp for schedule(static) nowait
    for (int i = 0; i < N; ++i) {
      const size_t off = static_cast<size_t>(i) * C;
      const float* x = inp + off;
      const float* d = dout + off;
      const float m = mean[i];
      const float s = rstd[i];
      float dnorm_mean = 0.0f;
      float dnorm_xhat_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_xhat_mean)
      for (int c = 0; c < C; ++c) {
        const float xhat = (x[c] - m) * s;
        const float dn = weight[c] * d[c];
        dnorm_mean += dn;
        dnorm_xhat_mean += dn * xhat;
      }
      dnorm_mean /= C;
      dnorm_xhat_mean /= C;
      float* di = dinp + off;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float xhat = (x[c] - m) * s;
        const float dn = weight[c] * d[c];
        di[c] += (dn - dnorm_mean - xhat * dnorm_xhat_mean) * s;
      }
    }
    // dweight/dbias: each thread owns a block of channels and walks all rows in order.
#pragma omp for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 32) {
      const int c1 = c0 + 32 < C ? c0 + 32 : C;
      for (int i = 0; i < N; ++i) {
        const size_t off = static_cast<size_t>(i) * C;
        const float m = mean[i];
        const float s = rstd[i];
        for (int c = c0; c < c1; ++c) {
          dbias[c] += dout[off + c];
          dweight[c] += (inp[off + c] - m) * s * dout[off + c];
        }
      }
    }
  }
}

}  // namespace gpt2::kernels
