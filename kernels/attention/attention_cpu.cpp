#include <cstddef>
#include <cmath>
#include <vector>

#include "kernels/attention/attention.hpp"
#include "kernels/common/cpu_math.hpp"

namespace gpt2::kernels {

void attention_forward_cpu(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(3) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* q = qkv + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
        float* a = att + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + (static_cast<size_t>(b) * T + t2) * C3 + C + h * hs;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          dot *= scale;
          a[t2] = dot;
          maxv = dot > maxv ? dot : maxv;
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int t2 = 0; t2 <= t; ++t2) {
          const float e = cpu::fast_expf(a[t2] - maxv);
          a[t2] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
        for (int t2 = t + 1; t2 < T; ++t2) a[t2] = 0.0f;

        float* o = out + (static_cast<size_t>(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + (static_cast<size_t>(b) * T + t2) * C3 + 2 * C + h * hs;
          const float p = a[t2];
#pragma omp simd
          for (int i = 0; i < hs; ++i) o[i] += p * v[i];
        }
      }
    }
  }
}

void attention_decode_cpu(float* out, const float* q, const float* kcache, const float* vcache, int len, int maxT,
                          int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> a(static_cast<size_t>(len));
  for (int h = 0; h < NH; ++h) {
    const float* qh = q + h * hs;
    const float* kh = kcache + static_cast<size_t>(h) * maxT * hs;
    const float* vh = vcache + static_cast<size_t>(h) * maxT * hs;
    float maxv = -INFINITY;
    for (int t2 = 0; t2 < len; ++t2) {
      const float* k = kh + static_cast<size_t>(t2) * hs;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int i = 0; i < hs; ++i) dot += qh[i] * k[i];
      dot *= scale;
      a[t2] = dot;
      maxv = dot > maxv ? dot : maxv;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int t2 = 0; t2 < len; ++t2) {
      const float e = cpu::fast_expf(a[t2] - maxv);
      a[t2] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
    float* o = out + h * hs;
    for (int i = 0; i < hs; ++i) o[i] = 0.0f;
    for (int t2 = 0; t2 < len; ++t2) {
      const float* v = vh + static_cast<size_t>(t2) * hs;
      const float p = a[t2] * inv;
#pragma omp simd
      for (int i = 0; i < hs; ++i) o[i] += p * v[i];
    }
  }
}

void attention_backward_cpu(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                            int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
  {
    std::vector<float> datt(T);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        // Zero this head's slice of dq, dk, dv: they are accumulated below.
        for (int t = 0; t < T; ++t) {
          float* d = dqkv + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
          for (int i = 0; i < hs; ++i) d[i] = d[C + i] = d[2 * C + i] = 0.0f;
        }
        for (int t = 0; t < T; ++t) {
          const float* a = att + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
          const float* dO = dout + (static_cast<size_t>(b) * T + t) * C + h * hs;
          const float* q = qkv + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
          float* dq = dqkv + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
          // datt = dO . v;  dv += att * dO
          float dot_sum = 0.0f;
          for (int t2 = 0; t2 <= t; ++t2) {
            const float* v = qkv + (static_cast<size_t>(b) * T + t2) * C3 + 2 * C + h * hs;
            float* dv = dqkv + (static_cast<size_t>(b) * T + t2) * C3 + 2 * C + h * hs;
            float dot = 0.0f;
            const float p = a[t2];
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < hs; ++i) {
              dot += dO[i] * v[i];
              dv[i] += p * dO[i];
            }
            datt[t2] = dot;
            dot_sum += p * dot;
          }
          // softmax backward: dpre = att * (datt - sum(att * datt)); then through the scaled dot product
          for (int t2 = 0; t2 <= t; ++t2) {
            const float dpre = a[t2] * (datt[t2] - dot_sum) * scale;
            const float* k = qkv + (static_cast<size_t>(b) * T + t2) * C3 + C + h * hs;
            float* dk = dqkv + (static_cast<size_t>(b) * T + t2) * C3 + C + h * hs;
#pragma omp simd
            for (int i = 0; i < hs; ++i) {
              dq[i] += dpre * k[i];
              dk[i] += dpre * q[i];
            }
          }
        }
      }
    }
  }
}

}  // namespace gpt2::kernels
