#include <cstddef>
#include <vector>

#include "kernels/encoder/encoder.hpp"

namespace gpt2::kernels {

void encoder_forward_cpu(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<size_t>(b) * T + t) * C;
      const float* e = wte + static_cast<size_t>(inp[b * T + t]) * C;
      const float* p = wpe + static_cast<size_t>(t) * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

void encoder_backward_cpu(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C) {
  // dwpe: each position t owned by one iteration; sums over b in order.
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t) {
    float* dp = dwpe + static_cast<size_t>(t) * C;
    for (int b = 0; b < B; ++b) {
      const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) dp[c] += d[c];
    }
  }
  // dwte: several (b,t) may share a token, so split the work by channel instead of by row: each
  // thread owns a channel range and walks the rows in (b,t) order. No atomics, same bits always.
  const int N = B * T;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 16) {
      const int c1 = c0 + 16 < C ? c0 + 16 : C;
      for (int i = 0; i < N; ++i) {
        float* dw = dwte + static_cast<size_t>(inp[i]) * C;
        const float* d = dout + static_cast<size_t>(i) * C;
        for (int c = c0; c < c1; ++c) dw[c] += d[c];
      }
    }
  }
}

}  // namespace gpt2::kernels
