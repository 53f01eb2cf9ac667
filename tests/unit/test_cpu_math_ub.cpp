// kernels/common/cpu_math.hpp under UndefinedBehaviorSanitizer (this file alone is built with
// -fsanitize=undefined,float-cast-overflow -fno-sanitize-recover=all): NaN, infinities and values far
// outside the polynomial's range must take only defined paths (no float->int conversion of NaN, no
// shift of a negative value), and NaN must come out as NaN so a diverged loss stays visible.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common/cpu_math.hpp"

namespace {

using gpt2::cpu::fast_expf;
using gpt2::cpu::fast_tanhf;

TEST(CpuMathUB, SpecialValuesAreDefined) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(fast_expf(nan)));
  EXPECT_TRUE(std::isnan(fast_expf(-nan)));
  EXPECT_TRUE(std::isnan(fast_tanhf(nan)));
  EXPECT_TRUE(std::isfinite(fast_expf(inf)) && fast_expf(inf) > 1e38f);
  EXPECT_TRUE(fast_expf(-inf) >= 0.0f && fast_expf(-inf) < 1.3e-38f);
  EXPECT_EQ(fast_tanhf(inf), 1.0f);
  EXPECT_EQ(fast_tanhf(-inf), -1.0f);
  for (float x : {-1e30f, -1e6f, -88.0f, 88.0f, 89.0f, 1e6f, 1e30f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::lowest(), std::numeric_limits<float>::denorm_min()})
    EXPECT_TRUE(std::isfinite(fast_expf(x))) << x;
}

// The same inputs through the vectorised loop shape the kernels use.
TEST(CpuMathUB, SimdLoopWithNaN) {
  std::vector<float> in(67), out(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = -100.0f + 3.0f * static_cast<float>(i);
  in[5] = std::numeric_limits<float>::quiet_NaN();
  in[40] = -std::numeric_limits<float>::infinity();
  const int n = static_cast<int>(in.size());
#pragma omp simd
  for (int i = 0; i < n; ++i) out[i] = fast_expf(in[i]);
  for (int i = 0; i < n; ++i) {
    if (i == 5) EXPECT_TRUE(std::isnan(out[i]));
    else EXPECT_TRUE(std::isfinite(out[i]) && out[i] >= 0.0f) << in[i] << " -> " << out[i];
  }
  EXPECT_NEAR(out[33] / std::exp(in[33]), 1.0, 1e-6);  // in[33] = -1
}

}  // namespace
