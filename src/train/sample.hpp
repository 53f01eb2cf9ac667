// Text generation from a trained model: seeded top-k sampling with temperature.
#pragma once

#include <cstdint>
#include <vector>

#include "model/gpt2.hpp"

namespace gpt2 {

struct SampleOptions {
  int max_new_tokens = 200;
  float temperature = 1.0f;  // <= 0: greedy
  int top_k = 40;            // 0: the whole vocabulary
  uint64_t seed = 42;
};

// Continues `prompt` (non-empty) by max_new_tokens tokens; the context is the last max_seq_len tokens.
// Only real-vocabulary logits are considered (never the padding columns). Returns the new tokens.
std::vector<int32_t> generate(GPT2& model, const std::vector<int32_t>& prompt, const SampleOptions& opt);

}  // namespace gpt2
