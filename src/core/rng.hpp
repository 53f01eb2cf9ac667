// Deterministic random numbers that do not depend on thread count, platform or library version:
// SplitMix64 for integers, Box-Muller for normals. Every consumer derives its own stream from
// (seed, stream id), so adding a consumer never shifts another one's numbers.
#pragma once

#include <cmath>
#include <cstdint>

namespace gpt2 {

class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0) : state_(seed * 0x9E3779B97F4A7C15ULL ^ (stream + 0x632BE59BD9B4E019ULL)) {
    next_u64();
  }
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [0, n) without modulo bias worth caring about for n << 2^64.
  uint64_t below(uint64_t n) { return static_cast<uint64_t>(uniform() * static_cast<double>(n)) % n; }
  double normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    double u1 = uniform();
    double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    have_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
  double spare_ = 0.0;
  bool have_spare_ = false;
};

}  // namespace gpt2
