// Generation with a key/value cache: each decoded token's logits equal those of a full forward over
// the same context, and generation keeps going past max_seq_len (the cache is rebuilt).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/gemm/gemm.hpp"
#include "model/gpt2.hpp"
#include "train/sample.hpp"

namespace gpt2 {
namespace {

GPT2Config tiny(int maxT) {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 3;
  c.n_embd = 72;
  c.vocab_size = 300;
  c.max_seq_len = maxT;
  return c;
}

TEST(Generate, KvCacheLogitsMatchFullForward) {
  kernels::set_cpu_threads(2);
  GPT2 model(tiny(64));
  model.init(5);
  const int T = 37, Vp = model.config().padded_vocab_size(), V = model.config().vocab_size;
  std::vector<int32_t> tokens(T);
  for (int t = 0; t < T; ++t) tokens[t] = (t * 37 + 11) % V;
  const float* full = model.forward_logits(tokens.data(), 1, T);
  const std::vector<float> ref(full, full + static_cast<size_t>(T) * Vp);
  KVCache cache;
  for (int t = 0; t < T; ++t) {
    const float* step = model.decode_step(tokens[t], &cache);
    double err = 0, scale = 1e-30;
    for (int j = 0; j < V; ++j) {
      err = std::max(err, std::fabs(static_cast<double>(step[j]) - ref[static_cast<size_t>(t) * Vp + j]));
      scale = std::max(scale, std::fabs(static_cast<double>(ref[static_cast<size_t>(t) * Vp + j])));
    }
    EXPECT_LE(err, 1e-5 * scale) << "position " << t;
  }
  EXPECT_EQ(cache.len, T);
}

TEST(Generate, DecodeRejectsFullCacheAndBadToken) {
  GPT2 model(tiny(4));
  model.init(1);
  KVCache cache;
  for (int t = 0; t < 4; ++t) model.decode_step(1, &cache);
  EXPECT_DEATH(model.decode_step(1, &cache), "key/value cache is full");
  KVCache fresh;
  EXPECT_DEATH(model.decode_step(300, &fresh), "out of range");
}

TEST(Generate, RunsPastMaxSeqLenAndIsSeeded) {
  GPT2 model(tiny(8));
  model.init(3);
  SampleOptions opt;
  opt.max_new_tokens = 30;  // well past max_seq_len = 8: the cache is rebuilt several times
  opt.top_k = 20;
  opt.seed = 9;
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> a = generate(model, prompt, opt), b = generate(model, prompt, opt);
  ASSERT_EQ(a.size(), 30u);
  EXPECT_EQ(a, b);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 300);
  opt.temperature = 0.0f;  // greedy: the argmax of the cached logits
  KVCache cache;
  const float* first = nullptr;
  for (int32_t t : prompt) first = model.decode_step(t, &cache);
  const int argmax = static_cast<int>(std::max_element(first, first + 300) - first);
  EXPECT_EQ(generate(model, prompt, opt)[0], argmax);
}

// The memory estimate's activation term (GPT2::activation_bytes, used before anything is allocated)
// matches what a forward really allocates.
TEST(MemoryEstimate, ActivationBytesMatchAllocation) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    GPT2 model(tiny(16));
    model.init(1);
    model.set_recompute(r);
    const int B = 3, T = 11;
    std::vector<int32_t> in(B * T, 1), tg(B * T, 2);
    model.forward_eval(in.data(), tg.data(), B, T);
    const Activations& a = model.activations();
    size_t floats = 0;
    for (const std::vector<float>* v :
         {&a.encoded, &a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.att, &a.atty, &a.residual2, &a.ln2,
          &a.ln2_mean, &a.ln2_rstd, &a.fch, &a.fch_gelu, &a.residual3, &a.lnf, &a.lnf_mean, &a.lnf_rstd,
          &a.logits, &a.losses, &a.dresidual, &a.btc, &a.dqkv, &a.dbt4c})
      floats += v->size();
    EXPECT_EQ(GPT2::activation_bytes(model.config(), B, T, r), static_cast<double>(floats * sizeof(float)))
        << recompute_name(r);
  }
}

// Streaming generation: each token reaches the sink as soon as it is chosen (before the model is asked
// for the next logits), far past max_seq_len, with the prompt's context rebuilt from its newest half.
TEST(Generate, StreamsEachTokenBeforeTheNext) {
  GPT2 model(tiny(8));
  model.init(3);
  KVCache cache;
  int calls = 0;
  auto next_logits = [&](int32_t token, bool restart) {
    ++calls;
    if (restart) cache.len = 0;
    return model.decode_step(token, &cache);
  };
  SampleOptions o;
  o.max_new_tokens = 40;
  std::vector<int> calls_at_emit;
  generate(next_logits, model.config().vocab_size, 8, {1, 2, 3}, o, [&](int32_t) { calls_at_emit.push_back(calls); });
  ASSERT_EQ(calls_at_emit.size(), 40u);
  for (size_t k = 1; k < calls_at_emit.size(); ++k)
    EXPECT_GT(calls_at_emit[k], calls_at_emit[k - 1]) << "token " << k << " was not emitted before the next forward";
}

}  // namespace
}  // namespace gpt2
