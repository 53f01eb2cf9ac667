// Vectorisable elementwise math for the CPU kernels. glibc's expf/tanhf are scalar calls that stop
// the compiler from vectorising a loop; these are branch-free polynomials the compiler turns into
// SIMD code inside `#pragma omp simd` loops. Deterministic: pure functions of their input.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace gpt2::cpu {

// exp(x) for x in [-87.3, 88.3] to within 2 ulp (Cephes expf polynomial); clamps outside, so
// exp(-inf) -> ~0 (1e-38), which is what softmax needs. The top stays below 127.5 ln 2 (88.37):
// beyond it n rounds to 128 and the 2^n bit pattern below would be infinity. NaN gives NaN.
inline float fast_expf(float in) {
  // The clamps are written so that NaN fails both comparisons and becomes -87.3: the float -> int
  // conversion and the shift below then see a small integer, never NaN (undefined behaviour), and
  // they still compile to one max and one min. The NaN goes back in by the select at the end.
  float x = in > -87.3f ? in : -87.3f;
  x = x < 88.3f ? x : 88.3f;
  // round(x / ln 2) by the 1.5 * 2^23 trick: plain adds that always vectorise (std::nearbyint may not).
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  float r = x - n * 0.693359375f;  // Cody-Waite: ln2 = hi + lo
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // n is in [-126, 127], so n + 127 is in [1, 254]: the shift of a positive value is defined.
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return in == in ? p * scale : in;  // NaN in, NaN out (a blend in the vectorised loop)
}

// tanh(x) = 1 - 2 / (exp(2x) + 1); saturates correctly for large |x| thanks to the clamp in exp.
inline float fast_tanhf(float x) { return 1.0f - 2.0f / (fast_expf(2.0f * x) + 1.0f); }

}  // namespace gpt2::cpu
