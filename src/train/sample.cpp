#include "train/sample.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace gpt2 {

void generate(const NextLogitsFn& next_logits, int vocab_size, int max_seq_len, const std::vector<int32_t>& prompt,
              const SampleOptions& opt, const TokenSinkFn& emit) {
  GPT2_REQUIRE(!prompt.empty(), "sampling needs a non-empty prompt");
  GPT2_REQUIRE(std::isfinite(opt.temperature) && opt.temperature >= 0.0f,
               "the sampling temperature must be a finite number >= 0 (got " << opt.temperature << ")");
  GPT2_CHECK(vocab_size >= 1 && max_seq_len >= 1, "vocab_size " << vocab_size << ", max_seq_len " << max_seq_len);
  const int V = vocab_size;
  const int maxT = max_seq_len;
  Rng rng(opt.seed, 0x5A3F1E);
  // Only the newest max_seq_len tokens of the context are ever read (prefill), so older ones are
  // dropped once it holds twice that: bounded memory, amortised O(1) per token.
  std::vector<int32_t> ctx = prompt;
  std::vector<std::pair<float, int>> cand(V);
  // Keys and values are cached, so each new token costs one token's forward. When the cache is full
  // (max_seq_len tokens) it is rebuilt from the newest half of the context: positions must restart.
  int cached = 0;  // tokens in the model's cache
  const float* logits = nullptr;
  auto prefill = [&](size_t keep) {
    cached = 0;
    for (size_t i = ctx.size() - keep; i < ctx.size(); ++i) {
      logits = next_logits(ctx[i], cached == 0);
      ++cached;
    }
  };
  prefill(std::min<size_t>(ctx.size(), static_cast<size_t>(maxT)));
  for (int n = 0; n < opt.max_new_tokens; ++n) {
    if (n > 0) {
      if (cached == maxT) {
        prefill(static_cast<size_t>(std::max(1, maxT / 2)));
      } else {
        logits = next_logits(ctx.back(), false);
        ++cached;
      }
    }
    int next = 0;
    if (opt.temperature <= 0.0f) {
      next = static_cast<int>(std::max_element(logits, logits + V) - logits);
    } else {
      for (int j = 0; j < V; ++j) cand[j] = {logits[j] / opt.temperature, j};
      const int k = (opt.top_k > 0 && opt.top_k < V) ? opt.top_k : V;
      // Ties broken by token id so the choice never depends on the sort implementation.
      auto greater = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      };
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), greater);
      double sum = 0.0;
      std::vector<double> p(k);
      for (int j = 0; j < k; ++j) sum += p[j] = std::exp(static_cast<double>(cand[j].first - cand[0].first));
      double u = rng.uniform() * sum;
      next = cand[k - 1].second;
      for (int j = 0; j < k; ++j) {
        if (u < p[j]) {
          next = cand[j].second;
          break;
        }
        u -= p[j];
      }
    }
    ctx.push_back(next);
    if (ctx.size() >= 2 * static_cast<size_t>(maxT)) ctx.erase(ctx.begin(), ctx.end() - maxT);
    emit(next);
  }
}

std::vector<int32_t> generate(const NextLogitsFn& next_logits, int vocab_size, int max_seq_len,
                              const std::vector<int32_t>& prompt, const SampleOptions& opt) {
  std::vector<int32_t> out;
  generate(next_logits, vocab_size, max_seq_len, prompt, opt, [&](int32_t t) { out.push_back(t); });
  return out;
}

void generate(GPT2& model, const std::vector<int32_t>& prompt, const SampleOptions& opt, const TokenSinkFn& emit) {
  KVCache cache;
  auto next_logits = [&](int32_t token, bool restart) {
    if (restart) cache.len = 0;
    return model.decode_step(token, &cache);
  };
  generate(next_logits, model.config().vocab_size, model.config().max_seq_len, prompt, opt, emit);
}

std::vector<int32_t> generate(GPT2& model, const std::vector<int32_t>& prompt, const SampleOptions& opt) {
  std::vector<int32_t> out;
  generate(model, prompt, opt, [&](int32_t t) { out.push_back(t); });
  return out;
}

}  // namespace gpt2
