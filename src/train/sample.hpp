// Text generation from a trained model: seeded top-k sampling with temperature. One sampling loop for
// every backend: it asks a "next logits" callback for each token's logits, so the CPU model
// (GPT2::decode_step) and the CUDA model (GPT2Cuda::decode_step) share it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/gpt2.hpp"

namespace gpt2 {

struct SampleOptions {
  int max_new_tokens = 200;
  float temperature = 1.0f;  // 0: greedy; must be finite and >= 0
  int top_k = 40;            // 0: the whole vocabulary
  uint64_t seed = 42;
};

// Runs the model on `token` at the next position of its key/value cache and returns the next-token
// logits (at least vocab_size entries; valid until the next call). restart = true empties the cache
// first, so `token` goes to position 0. The loop never asks for more than max_seq_len cached tokens.
using NextLogitsFn = std::function<const float*(int32_t token, bool restart)>;

// Receives each new token as soon as it is chosen.
using TokenSinkFn = std::function<void(int32_t token)>;

// Continues `prompt` (non-empty) by max_new_tokens tokens; the context is the last max_seq_len tokens.
// Only real-vocabulary logits are considered (never the padding columns). Each new token goes to
// `emit` as it is generated; memory stays bounded (O(max_seq_len + vocab)) however many tokens are
// asked for. When the cache is full (max_seq_len tokens) it is rebuilt from the newest half of the context.
void generate(const NextLogitsFn& next_logits, int vocab_size, int max_seq_len, const std::vector<int32_t>& prompt,
              const SampleOptions& opt, const TokenSinkFn& emit);
// The same, collecting the new tokens.
std::vector<int32_t> generate(const NextLogitsFn& next_logits, int vocab_size, int max_seq_len,
                              const std::vector<int32_t>& prompt, const SampleOptions& opt);

// The CPU model, with a key/value cache of its own (GPT2::decode_step).
void generate(GPT2& model, const std::vector<int32_t>& prompt, const SampleOptions& opt, const TokenSinkFn& emit);
std::vector<int32_t> generate(GPT2& model, const std::vector<int32_t>& prompt, const SampleOptions& opt);

}  // namespace gpt2
