// Layer normalisation over the channel dimension, statistics in fp32 with a two-pass variance.
#pragma once

namespace gpt2::kernels {

constexpr float kLayerNormEps = 1e-5f;

// out = (x - mean(x)) * rstd * weight + bias,  rstd = 1 / sqrt(var(x) + 1e-5), per row
//   [in]  inp (N,C), weight (C), bias (C)
//   [out] out (N,C), mean (N), rstd (N)   (mean/rstd saved for backward)
void layernorm_forward_cpu(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                           const float* bias, int N, int C);

// Residual add fused with the layernorm that follows it (the GPU backend fuses the same pair):
//   residual = a + b;  out = layernorm(residual)
//   [in] a, b (N,C);  [out] residual (N,C), out (N,C), mean (N), rstd (N)
void residual_layernorm_forward_cpu(float* residual, float* out, float* mean, float* rstd, const float* a,
                                    const float* b, const float* weight, const float* bias, int N, int C);

// The forward's output from saved statistics (activation recompute): the same per-element expression
// as layernorm_forward_cpu, so with the mean/rstd it saved, out is bit-identical to what it wrote.
//   [in] inp (N,C), mean (N), rstd (N), weight (C), bias (C);  [out] out (N,C)
void layernorm_apply_cpu(float* out, const float* inp, const float* mean, const float* rstd, const float* weight,
                         const float* bias, int N, int C);

// Backward of layernorm_forward_cpu.
//   [in]  dout (N,C), inp (N,C), weight (C), mean (N), rstd (N)
//   [in,out] dinp (N,C), dweight (C), dbias (C)  -- all accumulated with +=
// dinp uses += because it is the residual stream's gradient. dweight/dbias are summed over rows
// by channel-owning threads in row order: deterministic, no atomics.
void layernorm_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, const float* mean, const float* rstd, int N, int C);

}  // namespace gpt2::kernels
