// What the two attention drivers (attention_driver.cpp, attention_bwd_driver.cpp) share: the guard
// poison around every buffer the kernel gets, bf16 bit access, the problem shape (hs = 64), and the
// GPU tests' shape list.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace emu_driver {

using bf16 = __nv_bfloat16;

constexpr size_t kGuard = 256;  // elements of poison around every buffer
constexpr uint16_t kBf16Poison = 0xFFFF;

inline float bf(double x) { return __bfloat162float(__float2bfloat16(static_cast<float>(x))); }
inline uint16_t bits(bf16 x) {
  uint16_t u;
  std::memcpy(&u, &x, 2);
  return u;
}
inline bf16 from_bits(uint16_t u) {
  bf16 x;
  std::memcpy(&x, &u, 2);
  return x;
}

struct Shape {
  int B, T, NH;
  float scale = 1.0f;
};

// tests/gpu/test_attention.cpp's kWgmmaShapes (AttentionWgmmaForward/Backward.MatchesCpu), as (B, T, NH):
// both drivers run it under --test-shapes.
inline std::vector<Shape> gpu_test_shapes() {
  return {{1, 1, 1}, {2, 64, 2}, {3, 37, 4}, {2, 128, 2}, {2, 129, 3}, {1, 257, 1}, {2, 200, 4}, {1, 150, 4, 3.0f}};
}

}  // namespace emu_driver
