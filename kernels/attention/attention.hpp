// Causal multi-head self-attention (the part between the QKV projection and the output projection).
#pragma once

namespace gpt2::kernels {

// qkv (B,T,3C) holds [q | k | v] per token, each (NH, hs) with hs = C / NH (Hugging Face c_attn order).
//   att[b,h,t,:] = softmax_{t2<=t}( q[b,t,h] . k[b,t2,h] / sqrt(hs) ),  zero for t2 > t
//   out[b,t,h]   = sum_{t2<=t} att[b,h,t,t2] * v[b,t2,h]
//   [in] qkv (B,T,3C);  [out] out (B,T,C) overwritten, att (B,NH,T,T) probabilities saved for backward
// Softmax statistics are fp32; the CPU backend materialises att (the GPU one recomputes it).
void attention_forward_cpu(float* out, float* att, const float* qkv, int B, int T, int C, int NH);

// Backward of attention_forward_cpu.
//   [in] dout (B,T,C), qkv (B,T,3C), att (B,NH,T,T);  [out] dqkv (B,T,3C) overwritten
// Each (b, h) is owned by one thread, so every sum runs in a fixed order: deterministic.
// One query against a key/value cache: the newest token's attention during text generation.
//   out[h] = sum_{t<len} softmax_t( q[h] . kcache[h,t] / sqrt(hs) ) * vcache[h,t]
//   [in] q (NH,hs) of the newest token; kcache, vcache (NH,maxT,hs) holding positions 0..len-1 (the
//        newest included);  [out] out (NH,hs) = (C) overwritten. Same arithmetic as attention_forward_cpu.
void attention_decode_cpu(float* out, const float* q, const float* kcache, const float* vcache, int len, int maxT,
                          int C, int NH);

void attention_backward_cpu(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                            int NH);

}  // namespace gpt2::kernels
