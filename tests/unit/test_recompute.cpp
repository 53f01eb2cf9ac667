// --recompute selective|full drops activations and recomputes them in backward with the forward's
// kernels: the loss and every gradient must be the same bits as with --recompute none, and the
// activations must really take less memory.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/gemm/gemm.hpp"
#include "model/gpt2.hpp"
#include "train/memory.hpp"

namespace gpt2 {
namespace {

// Awkward on purpose: C = 36 is no multiple of 8 (SIMD width), head size 12, T = 13 odd, V padded.
GPT2Config awkward() {
  GPT2Config c;
  c.n_layer = 3;
  c.n_head = 3;
  c.n_embd = 36;
  c.vocab_size = 301;
  c.max_seq_len = 16;
  return c;
}

struct Result {
  std::vector<float> losses;  // mean loss of each micro-step
  std::vector<float> grads;
};

// Two micro-steps of forward + backward (gradients accumulate), as the trainer runs them.
Result run(Recompute r, int B, int T) {
  GPT2 model(awkward());
  model.init(7);
  model.set_recompute(r);
  model.zero_grad();
  Result res;
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<int32_t> in(B * T), tg(B * T);
    for (int i = 0; i < B * T; ++i) {
      in[i] = (i * 37 + micro * 11 + 5) % 301;
      tg[i] = (i * 53 + micro * 7 + 3) % 301;
    }
    res.losses.push_back(model.forward_train(in.data(), tg.data(), B, T, 1.0f / (2 * B * T)));
    model.backward();
  }
  res.grads = model.grads();
  return res;
}

void expect_same_bits(const Result& want, const Result& got, const char* what) {
  ASSERT_EQ(want.losses.size(), got.losses.size());
  EXPECT_EQ(0, std::memcmp(want.losses.data(), got.losses.data(), want.losses.size() * sizeof(float)))
      << what << ": losses differ";
  ASSERT_EQ(want.grads.size(), got.grads.size());
  size_t first_diff = want.grads.size();
  for (size_t i = 0; i < want.grads.size() && first_diff == want.grads.size(); ++i)
    if (std::memcmp(&want.grads[i], &got.grads[i], sizeof(float)) != 0) first_diff = i;
  EXPECT_EQ(first_diff, want.grads.size()) << what << ": first differing gradient at flat index " << first_diff << " ("
                                           << want.grads[first_diff % want.grads.size()] << " vs "
                                           << got.grads[first_diff % want.grads.size()] << ")";
}

TEST(Recompute, GradientsAndLossBitIdenticalToNone) {
  for (int threads : {1, 3}) {
    kernels::set_cpu_threads(threads);
    const Result none = run(Recompute::kNone, 3, 13);
    // The gradients are not trivially equal: they are non-zero.
    double norm = 0;
    for (float g : none.grads) norm += static_cast<double>(g) * g;
    EXPECT_GT(norm, 0.0);
    const std::string tag = std::to_string(threads) + " thread(s)";
    expect_same_bits(none, run(Recompute::kSelective, 3, 13), ("selective, " + tag).c_str());
    expect_same_bits(none, run(Recompute::kFull, 3, 13), ("full, " + tag).c_str());
  }
  kernels::set_cpu_threads(1);
}

size_t allocated_bytes(const Activations& a) {
  size_t floats = 0;
  for (const std::vector<float>* v :
       {&a.encoded, &a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.att, &a.atty, &a.residual2, &a.ln2,
        &a.ln2_mean, &a.ln2_rstd, &a.fch, &a.fch_gelu, &a.residual3, &a.lnf, &a.lnf_mean, &a.lnf_rstd,
        &a.logits, &a.losses, &a.dresidual, &a.btc, &a.dqkv, &a.dbt4c})
    floats += v->size();
  return floats * sizeof(float);
}

// What each mode allocates, counted by hand from the fields: selective drops (L-1) layers of ln1, ln2
// (C each) and fch_gelu (4C); full keeps one layer of everything inside a block.
TEST(Recompute, ActivationsAllocateLess) {
  const GPT2Config cfg = awkward();
  const size_t L = cfg.n_layer, C = cfg.n_embd, NH = cfg.n_head, B = 3, T = 13, BT = B * T;
  size_t bytes[3];
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    GPT2 model(cfg);
    model.init(1);
    model.set_recompute(r);
    std::vector<int32_t> in(BT, 1), tg(BT, 2);
    model.forward_train(in.data(), tg.data(), B, T, 1.0f);
    bytes[static_cast<int>(r)] = allocated_bytes(model.activations());
    // The estimate printed before allocation is what a forward allocates, in every mode.
    EXPECT_EQ(GPT2::activation_bytes(cfg, B, T, r), static_cast<double>(bytes[static_cast<int>(r)]))
        << recompute_name(r);
    EXPECT_EQ(estimate_training_memory(cfg, B, T, B, /*on_gpu=*/false, r).activations,
              static_cast<double>(bytes[static_cast<int>(r)]))
        << recompute_name(r);
  }
  const size_t f = sizeof(float);
  const size_t selective_saves = (L - 1) * BT * (C + C + 4 * C) * f;
  const size_t inner = BT * (3 * C + C + C + 2 + 4 * C) + B * NH * T * T;  // qkv, atty, residual2, ln2 stats, fch, att
  const size_t full_saves = selective_saves + (L - 1) * inner * f;
  EXPECT_EQ(bytes[0] - bytes[1], selective_saves);
  EXPECT_EQ(bytes[0] - bytes[2], full_saves);
  EXPECT_LT(bytes[2], bytes[1]);
}

// Switching modes on a model that already ran reallocates, and a mode change between forward and
// backward cannot happen silently: the pending backward is refused.
TEST(Recompute, SwitchingModeNeedsANewForward) {
  GPT2 model(awkward());
  model.init(1);
  std::vector<int32_t> in(2 * 5, 1), tg(2 * 5, 2);
  model.forward_train(in.data(), tg.data(), 2, 5, 0.1f);
  model.set_recompute(Recompute::kFull);
  EXPECT_DEATH(model.backward(), "needs a forward_train");
}

}  // namespace
}  // namespace gpt2
