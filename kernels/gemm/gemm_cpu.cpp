#include <cstddef>
#include <cblas.h>

#include <omp.h>

#include <cstring>

#include "kernels/gemm/gemm.hpp"

namespace gpt2::kernels {

void set_cpu_threads(int n) {
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

void linear_forward_cpu(float* out, const float* inp, const float* w, const float* bias, int N, int IC, int OC) {
  float beta = 0.0f;
  if (bias != nullptr) {
    // Seed the output with the bias and let sgemm accumulate onto it (beta = 1): one pass fewer.
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; ++i) std::memcpy(out + static_cast<size_t>(i) * OC, bias, sizeof(float) * OC);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, IC, 1.0f, inp, IC, w, OC, beta, out, OC);
}

void bias_backward_cpu(float* dbias, const float* dout, int N, int OC) {
#pragma omp parallel for schedule(static)
  for (int j0 = 0; j0 < OC; j0 += 64) {
    const int j1 = j0 + 64 < OC ? j0 + 64 : OC;
    for (int i = 0; i < N; ++i) {
      const float* d = dout + static_cast<size_t>(i) * OC;
#pragma omp simd
      for (int j = j0; j < j1; ++j) dbias[j] += d[j];
    }
  }
}

void linear_backward_cpu(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                         int N, int IC, int OC) {
  if (dinp != nullptr) {
    // dinp (N,IC) = dout (N,OC) @ w^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, IC, OC, 1.0f, dout, OC, w, OC, 0.0f, dinp, IC);
  }
  // dw (IC,OC) += inp^T (IC,N) @ dout (N,OC)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
  if (dbias != nullptr) bias_backward_cpu(dbias, dout, N, OC);
}

void lm_head_forward_cpu(float* logits, const float* inp, const float* wte, int N, int C, int Vp) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, Vp, C, 1.0f, inp, C, wte, C, 0.0f, logits, Vp);
}

void lm_head_backward_cpu(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte,
                          int N, int C, int Vp) {
  // dinp (N,C) = dlogits (N,Vp) @ wte (Vp,C)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, Vp, 1.0f, dlogits, Vp, wte, C, 0.0f, dinp, C);
  // dwte (Vp,C) += dlogits^T (Vp,N) @ inp (N,C)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Vp, C, N, 1.0f, dlogits, Vp, inp, C, 1.0f, dwte, C);
}

}  // namespace gpt2::kernels
