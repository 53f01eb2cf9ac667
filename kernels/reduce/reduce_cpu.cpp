#include <cstddef>
#include <vector>

#include "kernels/reduce/reduce.hpp"

namespace gpt2::kernels {

namespace {
constexpr long kChunk = 1 << 14;  // fixed partition: independent of the number of threads
}

double sum_squares_cpu(const float* x, long n) {
  const long chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static)
  for (long c = 0; c < chunks; ++c) {
    const long i0 = c * kChunk;
    const long i1 = i0 + kChunk < n ? i0 + kChunk : n;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (long i = i0; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[c] = s;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void scale_cpu(float* x, float a, long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) x[i] *= a;
}

}  // namespace gpt2::kernels
