// Deterministic reductions over large flat buffers, on the GPU (reduce.hpp is the CPU twin).
// Host-safe header (g++ compiles it).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/cuda_dtype.hpp"

namespace gpt2::kernels {

// Bytes of device scratch that sum_squares_cuda needs for n elements (a fixed function of n).
size_t sum_squares_scratch_bytes(long n);

// *result_device = sum_i x[i]^2, accumulated in double. A grid fixed by n alone (never by the device or
// the stream timing) writes one partial per block into scratch, then one block adds the partials in a
// fixed order: the same bits on every run.
//   [in] x (n);  [out] *result_device (one double, device memory) overwritten;
//   scratch: sum_squares_scratch_bytes(n) bytes of device memory, 8-byte aligned, contents ignored
template <class T>
void sum_squares_cuda(double* result_device, void* scratch, const T* x, long n, cudaStream_t stream);

// x[i] *= a (in fp32, stored back as T)
//   [in,out] x (n)
template <class T>
void scale_cuda(T* x, float a, long n, cudaStream_t stream);

}  // namespace gpt2::kernels
