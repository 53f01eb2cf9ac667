// The Hopper forward of attention (attention_sm90.cu): TMA -> mbarrier pipeline -> wgmma, a producer
// warpgroup and two consumer warpgroups (FlashAttention-3's structure). Internal to kernels/attention/;
// attention.cu dispatches to it. attention_sm90.cu is compiled only when the CUDA architectures include
// 90, and then for sm_90a alone (CMakeLists.txt), which defines GPT2_HAVE_SM90A for attention.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace gpt2::kernels::attention_detail {

// The one head size the kernel is built for: GPT-2's (every preset has hs = 64).
constexpr int kWgmmaHeadSize = 64;

// This process's device is compute capability 9.0 and the binary holds the kernel's sm_90a code. Read
// once per process.
bool attention_fwd_wgmma_ready();

// Whether the kernel takes this call: hs == kWgmmaHeadSize, and TMA can describe qkv (a 16-byte aligned
// base; the row stride 3C * 2 bytes a multiple of 16, so C % 8 == 0). Otherwise the caller uses mma.sync.
bool attention_fwd_wgmma_takes(const __nv_bfloat16* qkv, const __nv_bfloat16* out, int C, int NH);

// Same contract as attention_forward_cuda (attention_cuda.hpp): qkv (B,T,3C) -> out (B,T,C), lse (B,NH,T).
void attention_fwd_wgmma(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T_, int C, int NH,
                         cudaStream_t stream);

}  // namespace gpt2::kernels::attention_detail
