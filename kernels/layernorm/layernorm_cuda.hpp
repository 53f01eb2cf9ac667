// CUDA layernorm launchers (kernels in layernorm.cu). Same semantics as the CPU reference in
// layernorm.hpp, so the model can swap one for the other. Host-safe: g++ compiles this header.
//
// T is the storage type (float or gpt2::bf16); statistics (mean, rstd) and all arithmetic are fp32.
// Every launcher enqueues on `stream`, never synchronizes and never allocates. Results are
// deterministic: the same inputs give the same bits on every run (no float atomics anywhere).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/cuda_dtype.hpp"

namespace gpt2::kernels {

// out = (x - mean(x)) * rstd * weight + bias,  rstd = 1 / sqrt(var(x) + 1e-5), per row;
// mean first, then var = mean((x - mean)^2) from the row held in registers (two passes, no
// E[x^2] - E[x]^2 cancellation).
//   [in]  inp (N,C), weight (C), bias (C)
//   [out] out (N,C), mean (N), rstd (N)      (overwritten; mean/rstd are kept for the backward)
// N >= 0, C >= 1, any C: a warp per row with 128-bit loads when C % (16/sizeof(T)) == 0, every T
// pointer is 16-byte aligned and the row fits in registers (C <= 512 * 16/sizeof(T)); otherwise a
// scalar warp-per-row kernel.
template <class T>
void layernorm_forward_cuda(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N,
                            int C, cudaStream_t stream);

// Residual add fused with the layernorm that follows it:
//   residual = round_T(a + b);  out = layernorm(residual)
// The normalisation reads the ROUNDED residual, i.e. exactly what is stored and what the backward
// later reads as `inp`, so forward statistics and backward agree bit for bit.
//   [in]  a, b (N,C), weight (C), bias (C)
//   [out] residual (N,C), out (N,C), mean (N), rstd (N)   (overwritten)
template <class T>
void residual_layernorm_forward_cuda(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                     const T* weight, const T* bias, int N, int C, cudaStream_t stream);

// The forward's output from its saved statistics (activation recompute; layernorm_apply_cpu's
// counterpart): out = (inp - mean) * rstd * weight + bias with the forward kernels' own per-element
// expression, so given the mean/rstd a forward saved over the same inp, out is bit-identical to
// the output it wrote.
//   [in]  inp (N,C), mean (N), rstd (N), weight (C), bias (C)
//   [out] out (N,C)   (overwritten)
// N >= 0, C >= 1, any C and alignment (128-bit path when C is a whole number of 16-byte packs).
template <class T>
void layernorm_apply_cuda(T* out, const T* inp, const float* mean, const float* rstd, const T* weight, const T* bias,
                          int N, int C, cudaStream_t stream);

// Bytes of scratch layernorm_backward_cuda needs for (N, C): fp32 per-block partial sums of
// dweight/dbias. Depends on N and C only (never on the device), so the summation order, and with
// it every bit of dweight/dbias, is the same on every GPU.
size_t layernorm_backward_scratch_bytes(int N, int C);

// Backward of layernorm_forward_cuda.
//   dnorm = dout * weight,  xhat = (inp - mean) * rstd
//   dinp    += rstd * (dnorm - mean_c(dnorm) - xhat * mean_c(dnorm * xhat))
//   dweight += sum_rows xhat * dout,   dbias += sum_rows dout
//   [in]  dout (N,C), inp (N,C), weight (C), mean (N), rstd (N)
//   [in,out] dinp (N,C), dweight (C), dbias (C)   (all accumulated with +=, like the CPU reference)
//   scratch: at least layernorm_backward_scratch_bytes(N, C) bytes of device memory, 4-byte
//   aligned (16-byte aligned with C even lets the partial sums read float4s); its contents on entry
//   do not matter.
// dweight/dbias are summed in fp32 (per-block partials over fixed row chunks, then a second kernel
// adds the partials in a fixed order) and added to the stored T value once. The order depends on N,
// C and which path runs (the alignments below and scratch's), never on the device or the run.
// N >= 0, C >= 1, any C: a warp per row with 128-bit loads and per-warp shared-memory dweight/dbias
// sums when C % (16/sizeof(T)) == 0, C <= 2048 and the T pointers are 16-byte aligned; otherwise
// scalar kernels (a warp per row for dinp, a thread per channel for the partials).
template <class T>
void layernorm_backward_cuda(T* dinp, T* dweight, T* dbias, void* scratch, const T* dout, const T* inp, const T* weight,
                             const float* mean, const float* rstd, int N, int C, cudaStream_t stream);

// Test and benchmark hook: while true, the backward's fast path has each warp load its next row before it
// finishes the current one (two rows in flight a warp; rows of up to 8 packs of 16 bytes a lane: C <= 2048
// bf16, C <= 1024 fp32); the same bits. Not yet measured on a GPU, so off by default (docs/performance.md).
// Not thread-safe.
void layernorm_backward_prefetch_rows(bool on);

}  // namespace gpt2::kernels
