// The dS^T buffer of the store-ds attention backwards (AttentionBackwardPath::kStoreDs and
// kWgmmaStoreDs, attention_cuda.hpp), in the backward's scratch: the dK/dV launch stores dS^T, the bf16
// values its dK product used, and a second launch (attention.cu's attention_bwd_tc_dq_from_ds) sums
// dQ = dS K from them. Shared by attention.cu's mma.sync dK/dV blocks (64-key tiles, query tiles of 64
// or 32: each fills one tile or half of one) and attention_bwd_sm90.cu's wgmma blocks (128 keys: each
// consumer warpgroup's 64 keys are one tile row).
//
// For each head (b * NH + h), the causal 64 x 64 tiles, key block a <= query block c, in the order
// (0,0) (0,1) .. (0,n-1) (1,1) .. (n-1,n-1) with n = ceil(T / 64); a tile is [64 keys][64 queries] bf16,
// 8 KiB, 128 bytes a key row. Keys on rows: the dK/dV accumulators (keys on rows) store as adjacent
// query pairs, and dQ's A operand (queries x keys) is read back transposed by ldmatrix. Rows and columns
// past T hold zeros (P^T is 0 there: masked keys, or lse = +inf for queries past T).
//
// Internal to kernels/attention/ (.cu files only).
#pragma once

#include <cstddef>

namespace gpt2::kernels::attention_detail {

struct DsTiles {
  static constexpr int kSide = 64;
  static constexpr size_t kElems = static_cast<size_t>(kSide) * kSide;
  __host__ __device__ static size_t blocks(int T_) { return (static_cast<size_t>(T_) + kSide - 1) / kSide; }
  __host__ __device__ static size_t per_head(int T_) { return blocks(T_) * (blocks(T_) + 1) / 2 * kElems; }
  // First element of tile (a, c), a <= c, of head `head`.
  __device__ static size_t tile(int head, int a, int c, int T_) {
    const size_t n = blocks(T_), ua = static_cast<size_t>(a);
    return head * per_head(T_) + (ua * n - ua * (ua - 1) / 2 + static_cast<size_t>(c - a)) * kElems;
  }
};

}  // namespace gpt2::kernels::attention_detail
