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

// The second pass of a sum over rows that a kernel left as fp32 partial rows (one per block or row chunk):
//   out[c] += sum_g partials[g][c] for 0 <= c < width, where out[c] is lo[c] for c < split and hi[c - split]
//   after it (layernorm's dweight then dbias: split = C, width = 2C; one output: split = width, hi unused).
//   [in] partials (num_partials, width) fp32;  [in,out] lo (split), hi (width - split) +=
// The partials are added in a fixed order that depends on num_partials only: the same bits in every run.
template <class T>
void column_sums_add_cuda(T* lo, T* hi, int split, const float* partials, int num_partials, int width,
                          cudaStream_t stream);

// x[i] *= a (in fp32, stored back as T)
//   [in,out] x (n)
template <class T>
void scale_cuda(T* x, float a, long n, cudaStream_t stream);

}  // namespace gpt2::kernels
