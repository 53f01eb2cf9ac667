// CUDA token + position embedding launchers (kernels in encoder.cu). Same semantics as the CPU
// reference in encoder.hpp. Host-safe: g++ compiles this header.
//
// T is the storage type (float or gpt2::bf16); sums are fp32. Launchers enqueue on `stream`, never
// synchronize and never allocate. Deterministic: no float atomics; every output element is summed by
// one owner in a fixed order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/cuda_dtype.hpp"
#include "kernels/encoder/encoder.hpp"  // encoder_backward_plan, the host side of encoder_backward_cuda

namespace gpt2::kernels {

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
//   [in]  inp (B,T_) token ids, each in [0, rows of wte);  wte (V,C);  wpe (maxT,C), T_ <= maxT
//   [out] out (B,T_,C)   (overwritten)
// 128-bit loads when C % (16/sizeof(T)) == 0 and the T pointers are 16-byte aligned, else scalar.
template <class T>
void encoder_forward_cuda(T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int T_, int C,
                          cudaStream_t stream);

// dwte[tok,:] += sum over tok's positions i of dout[i,:];  dwpe[t,:] += sum_b dout[b,t,:], in b order.
// The dwte sum has a fixed order given by the plan: 8 partial sums, partial w taking the token's
// positions number w, w+8, w+16, ... in plan order, then the 8 partials added in order w = 0..7
// (so a frequent token is summed by 8 warps, not 1).
//   [in]  dout (B,T_,C);  plan_device: encoder_backward_plan's vector for these B*T_ tokens, on the
//         device;  num_unique: its return value (U)
//   [in,out] dwte (V,C), dwpe (maxT,C)   (accumulated with +=; rows without tokens untouched)
// Each sum is formed in fp32 and added to the stored T value once.
template <class T>
void encoder_backward_cuda(T* dwte, T* dwpe, const T* dout, const int32_t* plan_device, int num_unique, int B, int T_,
                           int C, cudaStream_t stream);

}  // namespace gpt2::kernels
