// CUDA launchers of causal multi-head self-attention: fused flash-attention forward and backward.
// Host-safe (g++ compiles it). Semantics equal the CPU reference (attention.hpp) except that the
// (B,NH,T,T) probabilities are never materialised: the forward saves the log-sum-exp of each query
// row instead, and the backward recomputes the probabilities from it.
//
// Shape flow:  qkv (B,T,3C) -> [forward] -> out (B,T,C), lse (B,NH,T)
//              dout (B,T,C), qkv, out, lse -> [backward] -> dqkv (B,T,3C)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/cuda_dtype.hpp"

namespace gpt2::kernels {

// qkv (B,T,3C) holds [q | k | v] per token, each (NH, hs) with hs = C / NH <= 128. With
// s[b,h,t,t2] = q[b,t,h] . k[b,t2,h] / sqrt(hs):
//   lse[b,h,t] = log sum_{t2<=t} exp(s[b,h,t,t2])                  (fp32, natural log)
//   out[b,t,h] = sum_{t2<=t} exp(s[b,h,t,t2] - lse[b,h,t]) * v[b,t2,h]
//   [in] qkv (B,T,3C);  [out] out (B,T,C) overwritten, lse (B,NH,T) overwritten (saved for backward)
// Fp32 statistics (online softmax); T = bf16 with hs in {64, 80, 96, 128} runs on the tensor cores
// (bf16 operands, fp32 accumulation), everything else on an fp32 SIMT path.
template <class T>
void attention_forward_cuda(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH, cudaStream_t stream);

// Which kernel runs the bf16 tensor-core forward. Both meet the same contract.
//   kMmaSync: mma.sync m16n8k16 (attention.cu), sm_80 and later, every tensor-core head size.
//   kWgmma:   wgmma fed by TMA, a producer and two consumer warpgroups (FlashAttention-3's structure,
//             attention_sm90.cu), where it applies: compute capability 9.0 with a build for
//             architecture 90, hs = 64, 16-byte aligned qkv and out. Elsewhere kMmaSync runs.
//   kWgmmaPingPong: the same kernel with its two consumers taking turns at the tensor cores
//             (FlashAttention-3's ping-pong schedule); applies where kWgmma does.
// The default is kMmaSync: the wgmma ones have not run on a GPU yet (docs/performance.md). The environment
// variable GPT2_ATTENTION_FWD=wgmma, wgmma-pingpong (or mma-sync) chooses at the first launch;
// attention_set_forward_path overrides it (tests, benchmarks). Not thread-safe.
enum class AttentionForwardPath { kMmaSync, kWgmma, kWgmmaPingPong };
void attention_set_forward_path(AttentionForwardPath path);
AttentionForwardPath attention_forward_path();
// Whether kWgmma and kWgmmaPingPong can run in this process (a 9.0 device and the kernel's sm_90a code),
// for tests to skip.
bool attention_fwd_wgmma_available();

// How the bf16 tensor-core backward gets dQ. Both are deterministic and meet the same contract; the
// fp32 SIMT path (other head sizes, T = float, attention_force_generic) ignores the choice.
//   kRecomputeDq:  blocks of one kind own the dK, dV of a key tile; blocks of another own the dQ of a
//                  query tile and recompute S = QK^T and dP = dO V^T for it: 7 matrix products, no
//                  ordering between blocks.
//   kAccumulateDq: one block per key tile computes dK, dV and adds its share dS K to an fp32 dQ
//                  accumulator, the key tiles of each query tile taking turns, highest first
//                  (dq_turns.cuh; FlashAttention's deterministic mode): 5 matrix products, plus the
//                  accumulator's traffic and the waits.
//   kWgmma:        kAccumulateDq's scheme on Hopper's instructions: wgmma fed by TMA, a producer and a
//                  consumer warpgroup (FlashAttention-3's structure, attention_bwd_sm90.cu), where it
//                  applies: compute capability 9.0 with a build for architecture 90, hs = 64, 16-byte
//                  aligned dqkv, dout and qkv. Elsewhere kRecomputeDq runs.
//   kStoreDs:      the dK, dV blocks also store dS (bf16, the causal 64 x 64 tiles: B*NH*T*T/2 values and a
//                  diagonal, 1.06 MiB a head at T = 1024) in the scratch; a second launch sums dQ = dS K
//                  from it: 5 matrix products, plus dS written and read once, and no waits (every tensor
//                  core head size, on any GPU with the mma.sync kernels).
//   kWgmmaStoreDs: kStoreDs with kWgmma's dK/dV kernel (which then has no dQ share, turns or waits on
//                  other blocks: 4 products a tile), where kWgmma applies; elsewhere kStoreDs runs. dK, dV
//                  are kWgmma's bits; dQ is summed from dS by kStoreDs's second launch.
// The default is kRecomputeDq: no other path has beaten it end to end on a GPU yet (docs/performance.md).
// The environment variable GPT2_ATTENTION_BWD=accumulate-dq, wgmma, store-ds or wgmma-store-ds (or
// recompute-dq) chooses at the first launch; attention_set_backward_path overrides it (tests,
// benchmarks). Not thread-safe.
enum class AttentionBackwardPath { kRecomputeDq, kAccumulateDq, kWgmma, kStoreDs, kWgmmaStoreDs };
void attention_set_backward_path(AttentionBackwardPath path);
AttentionBackwardPath attention_backward_path();
// Whether kWgmma and kWgmmaStoreDs can run in this process (a 9.0 device and the kernel's sm_90a code), for
// tests to skip.
bool attention_bwd_wgmma_available();

// Bytes of scratch attention_backward_cuda needs on `path`: D = rowsum(dout * out), fp32 (B,NH,T); for
// kAccumulateDq and kWgmma the dQ accumulator, fp32 (B,T,C), the turn counters and a block ticket; for
// kStoreDs and kWgmmaStoreDs the dS tiles, bf16. Size a buffer for one path only where the path cannot change after
// (the model, for the path of the process). The scratch must be 256-byte aligned (cudaMalloc's pointers are).
size_t attention_backward_scratch_bytes(int B, int T_, int C, int NH, AttentionBackwardPath path);
// The most any path needs, so the path can change without reallocating (tests, benchmarks).
size_t attention_backward_scratch_bytes(int B, int T_, int C, int NH);

// Backward of attention_forward_cuda. With P = exp(s - lse) recomputed from qkv and lse,
// D[b,h,t] = dout[b,t,h] . out[b,t,h] and dS = P * (dout.v - D) / sqrt(hs):
//   dq = dS k,  dk = dS^T q,  dv = P^T dout   (per head, causal)
//   [in] dout (B,T,C), qkv (B,T,3C), out (B,T,C) (the forward output), lse (B,NH,T);
//   [out] dqkv (B,T,3C) overwritten (q, k and v parts); scratch: attention_backward_scratch_bytes
// Deterministic: every dK, dV element has one owner, and dQ is either owned too (kRecomputeDq, kStoreDs,
// kWgmmaStoreDs) or summed in a fixed order (kAccumulateDq, kWgmma); no float atomics.
// bias_chunks (optional, attention_bias_chunks_bytes, fp32): the qkv projection's bias gradient is the column
// sums of dqkv over its B*T rows, which the blocks that store dqkv can sum as they store it, once at their end,
// instead of a pass over dqkv's 3C columns afterwards. Where the path does (kRecomputeDq, kStoreDs on the
// mma.sync kernels: bf16, hs 64, 80, 96 or 128), each 64-row tile of a sequence writes its column sums of the
// bf16 values it stored, row b * ceil(T/64) + tile of a (attention_bias_chunk_rows(B, T), 3C) fp32 matrix, and
// the call returns that row count: column_sums_add_cuda (kernels/reduce) then adds them into dbias. It returns
// 0 (bias_chunks untouched) where the path does not: the caller sums dqkv's columns itself.
template <class T>
int attention_backward_cuda(T* dqkv, void* scratch, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                            int T_, int C, int NH, cudaStream_t stream, float* bias_chunks = nullptr);
// Rows of attention_backward_cuda's bias chunks, and their bytes (3C fp32 each).
int attention_bias_chunk_rows(int B, int T_);
size_t attention_bias_chunks_bytes(int B, int T_, int C);
// Whether the model asks the attention backward for the qkv bias gradient's chunks (bias_chunks above) instead
// of summing dqkv's columns after it: GPT2_ATTENTION_BIAS_SUMS=on (off, the default, until a GPU has timed it:
// docs/performance.md), read at the first call; attention_set_bias_sums(1 or 0) overrides it, -1 goes back to
// the variable (tests). Not thread-safe.
bool attention_bias_sums();
void attention_set_bias_sums(int on);

// One query against a key/value cache: the newest token's attention during text generation
// (attention_decode.cu). Same semantics as attention_decode_cpu (attention.hpp):
//   out[h] = sum_{t<len} softmax_t( q[h] . kcache[h,t] / sqrt(hs) ) * vcache[h,t]
//   [in] q (NH,hs) = (C) of the newest token; kcache, vcache (NH,maxT,hs) holding positions 0..len-1
//        (the newest included), 1 <= len <= maxT;  [out] out (NH,hs) = (C) overwritten.
// hs = C / NH <= 128, any value. One block per head with an online softmax per warp (fp32 statistics
// and arithmetic, storage in T), warps merged in a fixed order: deterministic, no scratch, any len.
template <class T>
void attention_decode_cuda(T* out, const T* q, const T* kcache, const T* vcache, int len, int maxT, int C, int NH,
                           cudaStream_t stream);

// Test hook: while true, every launch takes the fp32 SIMT path (also for bf16 and the tensor-core
// head sizes), so tests can compare it against the tensor-core path. Not thread-safe; default false.
void attention_force_generic(bool force);

// Test and benchmark hook: at most how many heads a group of the mma.sync kernels' block order holds
// (tile_order.hpp: heaviest tiles first across a group's heads; the groups are then evened out). 0 (the
// default) bounds a group by the inputs that stay in L2; 1 is each head alone, a head's tiles heaviest
// first; B * NH or more is one group. Results are the same bits whatever the order (every output has one
// owner). Not thread-safe.
void attention_set_tile_group_heads(int heads);

}  // namespace gpt2::kernels
