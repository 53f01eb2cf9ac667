// Shared by the GPU tests: skipping without a GPU, random inputs, bf16 rounding and the two accuracy
// rules of the project (DESIGN.md section 7):
//   fp32: max |gpu - ref| <= 1e-5 * max |ref|            (norm-wise relative error, summation order free)
//   bf16: max |gpu - ref| <= 2 * max |naive_bf16 - ref|  (+ a floor of one bf16 ulp of max |ref|)
// where ref is the CPU reference in fp32 on the same (bf16-rounded) inputs and naive_bf16 is the CPU
// reference with every stored intermediate rounded to bf16, as a naive chain of bf16 kernels would.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/cuda_dtype.hpp"

namespace gpt2::test {

inline std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

inline float round_bf16(float x) { return to_float_host(from_float_host<bf16>(x)); }
inline std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}
// Rounds to the storage type T (identity for float).
template <class T>
inline std::vector<float> round_to(std::vector<float> v) {
  for (auto& x : v) x = to_float_host(from_float_host<T>(x));
  return v;
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

// fp32 rule. `what` names the tensor in the failure message.
inline void expect_close_fp32(const std::vector<float>& gpu, const std::vector<float>& ref, const char* what,
                              double rel = 1e-5) {
  const double err = max_abs_diff(gpu, ref), scale = std::max(max_abs(ref), 1e-30);
  EXPECT_LE(err, rel * scale) << what << ": max abs error " << err << " vs max |ref| " << scale << " (rel "
                              << err / scale << ", allowed " << rel << ")";
}

// bf16 rule.
inline void expect_close_bf16(const std::vector<float>& gpu, const std::vector<float>& ref,
                              const std::vector<float>& naive, const char* what) {
  const double err = max_abs_diff(gpu, ref), naive_err = max_abs_diff(naive, ref);
  const double floor = max_abs(ref) * (1.0 / 512.0);  // half a bf16 ulp at the largest magnitude
  EXPECT_LE(err, 2.0 * naive_err + floor) << what << ": gpu max abs error " << err << ", naive bf16 " << naive_err
                                          << ", floor " << floor;
}

// Picks the rule by storage type: T = float -> fp32 rule; T = bf16 -> bf16 rule against `naive`.
template <class T>
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& ref, const std::vector<float>& naive,
                         const char* what) {
  if constexpr (std::is_same_v<T, float>) {
    (void)naive;
    expect_close_fp32(gpu, ref, what);
  } else {
    expect_close_bf16(gpu, ref, naive, what);
  }
}

}  // namespace gpt2::test
