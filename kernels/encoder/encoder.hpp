// Token + position embedding.
#pragma once

#include <cstdint>

namespace gpt2::kernels {

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
//   [in]  inp (B,T) token ids, each < rows of wte;  wte (V,C);  wpe (maxT,C), T <= maxT
//   [out] out (B,T,C)  (overwritten)
void encoder_forward_cpu(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C);

// dwte[inp[b,t],:] += dout[b,t,:];  dwpe[t,:] += sum_b dout[b,t,:]
//   [in]  dout (B,T,C), inp (B,T);  [in,out] dwte (V,C), dwpe (maxT,C)  (accumulated with +=)
// Deterministic: every output row is summed in (b,t) order by one thread.
void encoder_backward_cpu(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C);

}  // namespace gpt2::kernels
