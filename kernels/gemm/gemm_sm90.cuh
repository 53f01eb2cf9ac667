// The Hopper path of the hand GEMM (gemm_sm90.cu): TMA -> mbarrier pipeline -> wgmma, persistent tiles.
// Internal to kernels/gemm/; gemm.cu dispatches to it. gemm_sm90.cu is compiled only when the CUDA
// architectures include 90, and then for sm_90a alone (CMakeLists.txt), which defines GPT2_HAVE_SM90A
// for gemm.cu.
#pragma once

#include <cuda_runtime.h>

#include "kernels/gemm/gemm_common.cuh"
#include "kernels/gemm/gemm_cuda.hpp"

namespace gpt2::kernels::gemm_detail {

// K step of the wgmma kernel: split-K ranges for it are multiples of this (a TMA box does not stop at a
// split boundary, only at K).
constexpr int kWgmmaBK = 64;

// This process's device is compute capability 9.0 and the binary holds the kernel's sm_90a code (a
// kernel-attribute query on it succeeds). Read once per process.
bool wgmma_device_ready();

// Whether TMA can describe these operands (16-byte aligned bases, leading dimensions that are multiples
// of 8 elements: tensor-map strides are multiples of 16 bytes). Otherwise the caller uses mma.sync.
bool wgmma_takes(const bf16* a, const bf16* b, int lda, int ldb);

// The output tile of `kernel` is 128 x wgmma_tile_n (not kDefault or kByShape); wgmma_tiles of them cover an
// M x N product.
inline int wgmma_tile_n(GemmWgmmaKernel kernel) { return kernel == GemmWgmmaKernel::k128x256 ? 256 : 128; }
inline int wgmma_tiles(GemmWgmmaKernel kernel, int M, int N) {
  return static_cast<int>(cuda::ceil_div(M, 128) * cuda::ceil_div(N, wgmma_tile_n(kernel)));
}

// C tile work for one launch: [splits][tile_count] units, the tiles tile0 .. tile0 + tile_count - 1 of
// `kernel`'s shape (not kDefault) in gemm_common.cuh's tile order (all wgmma_tiles(kernel, M, N) of them,
// or one part of a split tail: gemm.cu, gemm_hand), over a persistent grid of one block per SM, or of
// max_blocks (> 0) if fewer. With partial != nullptr each split writes its fp32 partials of those tiles
// (partial + split*M*N, at the tiles' places) and `ep` is not applied; otherwise C = ep(acc).
// k_per_split: a multiple of kWgmmaBK. lda = trans_a ? M : K, ldb = trans_b ? K : N.
// The bias gradient fused into a weight gradient (A transposed, B not, epilogue kNone; otherwise both
// nullptr): dbias += B's column sums with splits == 1, or with split-K each split's sums into
// dbias_partial [splits][N] fp32, for the caller to add into dbias in split order.
// How a launch's epilogue got kDGelu's pre-activations: read from global memory by the epilogue alone, loaded
// by TMA into shared memory during the products, or read by the epilogue after TMA prefetched them into L2
// during the products.
enum class WgmmaAuxRead { kEpilogue, kTma, kPrefetchL2 };
// What a launch did: how it read kDGelu's pre-activations, and whether its epilogue stored with bulk copies.
struct WgmmaRan {
  WgmmaAuxRead aux;
  bool bulk_store;
};
// aux_by_tma: kDGelu's pre-activations may be loaded by TMA during the products (where the kernel has the
// room and TMA can describe ep.aux); aux_prefetch: where they are not, they may be prefetched into L2 during
// the products (TMA can describe ep.aux); otherwise the epilogue reads them. bulk_store: the epilogue may
// finish its tiles in registers and copy bf16 rows out with cp.async.bulk (the cooperative kernels, where the
// output allows it: no split-K partials, no C +=, not kDGelu, N a multiple of 8, 16-byte aligned C and
// pre-activations); otherwise its threads store them. Returns what it did.
WgmmaRan gemm_bf16_wgmma(GemmWgmmaKernel kernel, int max_blocks, bool aux_by_tma, bool aux_prefetch, bool bulk_store,
                         const bf16* a, const bf16* b, int M, int N, int K, bool trans_a, bool trans_b, int k_per_split,
                         int splits, int tile0, int tile_count, float* partial, const EpilogueParams<bf16>& ep,
                         GemmEpilogue epilogue, bf16* dbias, float* dbias_partial, cudaStream_t stream);

}  // namespace gpt2::kernels::gemm_detail
