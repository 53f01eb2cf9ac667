// Matrix products of GPT-2: the Conv1D-style linear layers and the tied LM head.
// CPU backend: OpenBLAS sgemm (OpenMP build). At a fixed thread count OpenBLAS partitions the work the
// same way on every run, so results are bit-for-bit repeatable; a different thread count may change
// the last bits (its blocking depends on the partition). Bit-exact resume therefore needs the same
// --threads; results at other thread counts agree to fp32 rounding.
#pragma once

namespace gpt2::kernels {

// out = inp @ w + bias     (w in Hugging Face Conv1D layout: [in, out])
//   [in]  inp (N,IC), w (IC,OC), bias (OC) or nullptr;  [out] out (N,OC) (overwritten)
void linear_forward_cpu(float* out, const float* inp, const float* w, const float* bias, int N, int IC, int OC);

// Backward of linear_forward_cpu.
//   [in]  dout (N,OC), inp (N,IC), w (IC,OC)
//   [out] dinp (N,IC) overwritten (skipped when nullptr)
//   [in,out] dw (IC,OC) and dbias (OC) accumulated with += (gradient accumulation across micro-steps);
//            dbias skipped when nullptr. dbias sums rows in order per channel: deterministic.
void linear_backward_cpu(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                         int N, int IC, int OC);

// Tied LM head: logits = inp @ wte^T
//   [in]  inp (N,C), wte (Vp,C) (padded vocabulary rows are zero);  [out] logits (N,Vp)
void lm_head_forward_cpu(float* logits, const float* inp, const float* wte, int N, int C, int Vp);

// Backward of the LM head.
//   [in] dlogits (N,Vp), inp (N,C), wte (Vp,C);  [out] dinp (N,C) overwritten;  [in,out] dwte (Vp,C) +=
void lm_head_backward_cpu(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte,
                          int N, int C, int Vp);

// Column sums: dbias[j] += sum_i dout[i,j], deterministic (channel blocks own their sums).
void bias_backward_cpu(float* dbias, const float* dout, int N, int OC);

}  // namespace gpt2::kernels

namespace gpt2::kernels {
// Threads for every CPU kernel: the OpenMP pool (ours) and OpenBLAS's (the same pool in the OpenMP build).
void set_cpu_threads(int n);
}  // namespace gpt2::kernels
