// Device-side helpers shared by the CUDA kernels.
#pragma once

#include <cuda_runtime.h>

namespace gpt2 {

// y += a * x on the device (the toolchain smoke kernel, tested against a CPU loop).
void axpy_device(float* y, const float* x, float a, int n, cudaStream_t stream);

}  // namespace gpt2
