// What the two attention drivers (attention_driver.cpp, attention_bwd_driver.cpp) share: the guard
// poison around every buffer the kernel gets, bf16 bit access, and the problem shape (hs = 64).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

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

}  // namespace emu_driver
