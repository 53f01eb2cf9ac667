// The Hopper forward and backward of attention (attention_sm90.cu, attention_bwd_sm90.cu): TMA -> mbarrier
// pipeline -> wgmma, a producer warpgroup and two consumer warpgroups (FlashAttention-3's structure).
// Internal to kernels/attention/; attention.cu dispatches to them. Both files are compiled only when the
// CUDA architectures include 90, and then for sm_90a alone (CMakeLists.txt), which defines
// GPT2_HAVE_SM90A for attention.cu.
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
// pingpong: the two consumer warpgroups take turns at the tensor cores (AttentionForwardPath::kWgmmaPingPong).
void attention_fwd_wgmma(bool pingpong, __nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T_, int C,
                         int NH, cudaStream_t stream);

// Keys a block of the backward takes: two consumer warpgroups of 64 (attention_bwd_sm90.cu). Its grid
// is ceil(T / kWgmmaBwdKeyTile) x NH x B blocks, which is what the ticket counts.
constexpr int kWgmmaBwdKeyTile = 128;

// The backward (attention_bwd_sm90.cu): the same readiness check for its own kernel.
bool attention_bwd_wgmma_ready();

// Whether the backward kernel takes this call: hs == kWgmmaHeadSize, C % 8 == 0 and 16-byte aligned
// dqkv, dout and qkv (TMA reads qkv and dout). Otherwise the caller uses mma.sync (kRecomputeDq).
bool attention_bwd_wgmma_takes(const __nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv, int C,
                               int NH);

// dK, dV of attention_backward_cuda (attention_cuda.hpp) into dqkv's k and v parts, and dQ / scale summed
// into dq_acc (B,T,C) fp32 in turn order (dq_turns.cuh, attention.cu's kAccumulateDq protocol; the
// caller then scales it into dqkv's q part). [in] dout (B,T,C), qkv (B,T,3C), lse (B,NH,T),
// D = rowsum(dout * out) (B,NH,T); dq_turns (B,NH,ceil(T/64)) ints and *ticket zeroed before the launch.
// dq_acc needs no clearing.
void attention_bwd_wgmma(__nv_bfloat16* dqkv, float* dq_acc, int* dq_turns, int* ticket, const __nv_bfloat16* dout,
                         const __nv_bfloat16* qkv, const float* lse, const float* D, int B, int T_, int C, int NH,
                         cudaStream_t stream);

// The same dK, dV (the same bits), and instead of dQ, dS^T into the causal tiles ds (DsTiles,
// ds_tiles.cuh; B*NH*DsTiles::per_head(T) bf16, 16-byte aligned) for attention.cu's
// attention_bwd_tc_dq_from_ds to sum dQ = dS K from (AttentionBackwardPath::kWgmmaStoreDs). No turns,
// accumulator or ticket.
void attention_bwd_wgmma_store_ds(__nv_bfloat16* dqkv, __nv_bfloat16* ds, const __nv_bfloat16* dout,
                                  const __nv_bfloat16* qkv, const float* lse, const float* D, int B, int T_, int C,
                                  int NH, cudaStream_t stream);

}  // namespace gpt2::kernels::attention_detail
