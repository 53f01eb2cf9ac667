// Deterministic reductions over large flat buffers.
#pragma once

namespace gpt2::kernels {

// sum_i x[i]^2 in double. Fixed-size chunks are summed independently and then added in chunk order,
// so the result has the same bits for any thread count.
double sum_squares_cpu(const float* x, long n);

// x[i] *= a
void scale_cpu(float* x, float a, long n);

}  // namespace gpt2::kernels
