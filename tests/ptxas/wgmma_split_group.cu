// The ptxas guard's test case (tests/ptxas/check_guard.sh): one wgmma group on a warpgroup's accumulator,
// retired in the branch that issued it (SPLIT=0: ptxas keeps the schedule and says nothing) or in a later
// branch whose condition ptxas cannot relate to the first (SPLIT=1: ptxas serializes the wgmma and says
// so only as "info", "Potential Performance Loss"). The wgmma attention backward had the second form
// (its dQ share's group split over two branches on the same condition) from 678fa73 to 2026-11-29.
// Compiled only, never run.
#include <cstdint>
#include "kernels/common/ptx.cuh"
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void fence_acc(float (&r)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) gpt2::cuda::wgmma_fence_operand(r[i]);
}
#endif
__global__ void wgmma_group_across_branches(float* out, const uint32_t* in, int n) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ alignas(1024) unsigned char tile[8192];
  const int c = threadIdx.x / 128;
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.f;
  uint32_t a[4] = {in[0], in[1], in[2], in[3]};
  const uint64_t d = gpt2::cuda::wgmma_desc(gpt2::cuda::smem_u32(tile), 16, 1024, gpt2::cuda::WgmmaSwizzle::k128B);
  for (int j = 0; j < n; ++j) {
    if (j >= c) {  // issued in one branch ...
      gpt2::cuda::wgmma_fence();
      fence_acc(acc);
      gpt2::cuda::wgmma_m64n64k16_bf16_rs<0>(acc, a, d, 1);
      gpt2::cuda::wgmma_commit_group();
#if !SPLIT
      gpt2::cuda::wgmma_wait_group<0>();
#endif
    }
#if SPLIT
    if (c == j % 2) {  // ... retired in another on a condition ptxas cannot relate to the first
      gpt2::cuda::wgmma_wait_group<0>();
    }
#endif
    fence_acc(acc);
  }
  gpt2::cuda::wgmma_wait_group<0>();
  fence_acc(acc);
#pragma unroll
  for (int i = 0; i < 32; ++i) out[threadIdx.x * 32 + i] = acc[i];
#endif
}
