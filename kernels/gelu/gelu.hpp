// GELU, tanh approximation (GPT-2's "gelu_new").
#pragma once

namespace gpt2::kernels {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   [in] inp (n);  [out] out (n) overwritten
void gelu_forward_cpu(float* out, const float* inp, long n);

// dinp = dout * gelu'(inp)
//   [in] inp (n), dout (n);  [out] dinp (n) overwritten (may alias dout)
void gelu_backward_cpu(float* dinp, const float* inp, const float* dout, long n);

}  // namespace gpt2::kernels
