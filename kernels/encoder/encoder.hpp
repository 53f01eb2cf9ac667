// Token + position embedding.
#pragma once

#include <cstdint>
#include <vector>

namespace gpt2::kernels {

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
//   [in]  inp (B,T) token ids, each < rows of wte;  wte (V,C);  wpe (maxT,C), T <= maxT
//   [out] out (B,T,C)  (overwritten)
void encoder_forward_cpu(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C);

// dwte[inp[b,t],:] += dout[b,t,:];  dwpe[t,:] += sum_b dout[b,t,:]
//   [in]  dout (B,T,C), inp (B,T);  [in,out] dwte (V,C), dwpe (maxT,C)  (accumulated with +=)
// Deterministic: every output row is summed in (b,t) order by one thread.
void encoder_backward_cpu(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C);

// The host side of the CUDA backward (encoder_cuda.hpp, encoder_backward_cuda): packs the plan of the
// deterministic wte backward into `plan` (resized) as
//   [row_start (U+1) | row_token (U) | positions (N)]
// where positions are the flat indices b*T+t grouped by token id (ascending) and, within a token, in
// ascending position order; token u = row_token[u] owns positions[row_start[u] .. row_start[u+1]).
//   [in] inp_host (N) token ids (>= 0), N = B*T;  returns U, the number of distinct tokens.
// The model uploads `plan` to the device and passes it to encoder_backward_cuda. O(N): the device waits
// for it at the start of every step (bench_cpu_kernels: BM_encoder_backward_plan).
int encoder_backward_plan(const int32_t* inp_host, int N, std::vector<int32_t>* plan);

}  // namespace gpt2::kernels
