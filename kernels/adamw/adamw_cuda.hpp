// AdamW on the GPU: adamw_update_cpu (adamw.hpp) on fp32 master weights and fp32 moments, with the
// working copy of the parameters (T in {float, bf16}) refreshed from the new master. Host-safe header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/param_segment.hpp"
#include "kernels/adamw/adamw.hpp"
#include "kernels/common/cuda_dtype.hpp"

namespace gpt2::kernels {

// For each i:  g = grad_scale * grads[i]
//   master *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   master -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//   params = master rounded to T (round to nearest even)
//   [in] grads (n);  [in,out] master (n), m (n), v (n);  [out] params (n) overwritten
// For T = float, params may equal master (then master is updated once, in place, and written once);
// otherwise params must not overlap master, m or v.
template <class T>
void adamw_update_cuda(float* master, T* params, const T* grads, float* m, float* v, long n, const AdamWStep& s,
                       cudaStream_t stream);

// ---- multi-tensor AdamW: the whole optimizer step in one launch ----------------------------------
// The model's tensors (or under ZeRO-1 the owned part of each) are runs of the flat buffers with their
// own weight decay; one launch per run costs ~150 launches a step at 12 layers, most of them tiny
// (biases, layernorm gains). Instead the runs are cut once, on the host, into chunks of at most
// kAdamWChunkElems elements, a block's work each, and uploaded; every step is then one launch over
// the chunk table. Per element it is adamw_update_cuda's arithmetic: the same bits.
struct AdamWChunk {
  int64_t flat;    // first element in master, params and grads
  int64_t moment;  // first element in m and v (the owned runs concatenated: OwnedPiece::local)
  int32_t n;       // elements, 1 .. kAdamWChunkElems
  int32_t decay;   // 1: the run takes weight decay; 0: not (biases, layernorm gains)
};
constexpr int kAdamWChunkElems = 8192;

// The chunks of `pieces`, in order: each piece cut at multiples of kAdamWChunkElems from its start.
std::vector<AdamWChunk> adamw_chunks(const std::vector<OwnedPiece>& pieces);

// One AdamW step of every chunk (a device array of num_chunks, as adamw_chunks made them). s.weight_decay
// applies to the chunks with decay = 1, none to the others. params as in adamw_update_cuda (fp32: may be
// master). A chunk whose element offsets are not 16-byte aligned for every array takes a scalar loop.
//   [out] nonfinite (optional, one int on the device): set to 1 when any updated master weight is not
//         finite (an overflowing update: a huge lr), else left as it was; the caller zeroes it before.
//         What the step's check reads instead of a second pass over the weights.
template <class T>
void adamw_update_multi_cuda(float* master, T* params, const T* grads, float* m, float* v, const AdamWChunk* chunks,
                             int num_chunks, const AdamWStep& s, cudaStream_t stream, int* nonfinite = nullptr);

}  // namespace gpt2::kernels
