// Host helpers of the sm_90a kernels (gemm_sm90.cu, attention_sm90.cu): TMA tensor maps (one home for the
// driver entry point and the encoding) and whether such a kernel can run here. .cu files of the sm_90a
// object library only.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums only: the driver entry point comes through cudart
#include <cuda_bf16.h>

#include <cstdint>

namespace gpt2::kernels {

// A bf16 tensor of rank 2 or 3 read in boxes with the 128-byte swizzle (box[0] * 2 bytes must be <= 128:
// the swizzle's inner extent). dims[0] is the contiguous dimension (elements); byte_strides[i] is the
// stride of dimension i + 1 in bytes (a multiple of 16); box[i] <= 256. Out-of-bounds box elements read
// as zero and still count towards the transaction bytes. `what` names the tensor in the error.
CUtensorMap make_bf16_tensor_map(const __nv_bfloat16* base, int rank, const uint64_t* dims,
                                 const uint64_t* byte_strides, const uint32_t* box, const char* what);

// The current device has compute capability 9.0 (sm_90a code runs there only) and `kernel`'s code is in
// the binary (a kernel-attribute query on it succeeds). No device is not an error: false.
bool sm90a_kernel_runs_here(const void* kernel);

// The current device's multiprocessor count: the grid of a persistent kernel (one block per SM).
int sm_count();

}  // namespace gpt2::kernels
