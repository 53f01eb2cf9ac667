// GPT-2 on the CPU backend: forward and backward as a sequence of kernel calls.
// The CPU backend is the executable specification the GPU backend is tested against.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/config.hpp"
#include "model/params.hpp"

namespace gpt2 {

// Activations of one micro-batch (B, T), kept for backward. Shapes per field as kept with
// --recompute none; a field marked [sel] holds one layer (1,B,T,..) with selective or full recompute,
// one marked [full] holds one layer with full recompute: that slot is scratch, refilled in backward
// (see Recompute in model/config.hpp). Unmarked per-layer fields are always kept for every layer.
struct Activations {
  int B = 0, T = 0;
  Recompute recompute = Recompute::kNone;
  std::vector<float> encoded;   // (B,T,C)   wte[x] + wpe: the residual stream entering block 0
  std::vector<float> ln1;       // (L,B,T,C)   [sel]
  std::vector<float> ln1_mean;  // (L,B,T)
  std::vector<float> ln1_rstd;  // (L,B,T)
  std::vector<float> qkv;       // (L,B,T,3C)  [full]
  std::vector<float> att;       // (L,B,NH,T,T) [full] softmax probabilities (causal; upper triangle 0)
  std::vector<float> atty;      // (L,B,T,C)   [full] attention output before its projection
  std::vector<float> residual2; // (L,B,T,C)   [full] residual + attention branch
  std::vector<float> ln2;       // (L,B,T,C)   [sel]
  std::vector<float> ln2_mean;  // (L,B,T)     [full]
  std::vector<float> ln2_rstd;  // (L,B,T)     [full]
  std::vector<float> fch;       // (L,B,T,4C)  [full] MLP pre-activation
  std::vector<float> fch_gelu;  // (L,B,T,4C)  [sel]
  std::vector<float> residual3; // (L,B,T,C)   block output = the next block's input (the last: ln_f's)
  std::vector<float> lnf;       // (B,T,C)
  std::vector<float> lnf_mean;  // (B,T)
  std::vector<float> lnf_rstd;  // (B,T)
  std::vector<float> logits;    // (B,T,Vp)    after a training forward: dlogits
  std::vector<float> losses;    // (B,T)
  // scratch
  std::vector<float> dresidual; // (B,T,C)
  std::vector<float> btc;       // (B,T,C)   forward: a projection (attention's, then the MLP's) before
                                //           its residual add, which is all that reads it; backward: d(LN input)
  std::vector<float> dqkv;      // (B,T,3C)
  std::vector<float> dbt4c;     // (B,T,4C)
};

// Called during backward with an offset into the flat gradient buffer: every gradient at or after
// it is final for this step. It is called with block_begin(L) (ln_f done), then block_begin(l) for
// l = L-1..0, and finally 0 once the encoder (and so tied wte) is done. BucketScheduler hangs on it.
using GradReadyFn = std::function<void(size_t ready_from)>;

// Keys and values of the tokens decoded so far, per layer and head, for generation (GPT2::decode_step).
struct KVCache {
  std::vector<float> k, v;  // (L, NH, maxT, hs)
  int len = 0;              // tokens held; the next token goes to position len
};

class GPT2 {
 public:
  explicit GPT2(const GPT2Config& cfg);

  // Bytes of Activations for a micro-batch (B, T), in double so that impossible sizes (n_embd 2e9,
  // B = 2^31) are measured instead of overflowing. Mirrors ensure_activations(); a unit test keeps
  // the two in step.
  static double activation_bytes(const GPT2Config& cfg, int B, int T, Recompute recompute = Recompute::kNone);

  // What the next forward keeps for backward (default kNone); gradients are the same bits either way.
  void set_recompute(Recompute r);
  Recompute recompute() const { return recompute_; }

  const GPT2Config& config() const { return cfg_; }
  const ParamTable& table() const { return table_; }
  std::vector<float>& params() { return params_; }
  std::vector<float>& grads() { return grads_; }
  const std::vector<float>& params() const { return params_; }
  const std::vector<float>& grads() const { return grads_; }

  void init(uint64_t seed) { init_gpt2_params(table_, params_.data(), seed); }
  void zero_grad();

  // Training forward: loss of predicting targets from inputs, both (B,T). dloss is the weight of each
  // token's loss in the objective (1 / tokens per optimizer step): dlogits are written for backward.
  // Returns the mean loss over the B*T tokens.
  float forward_train(const int32_t* inputs, const int32_t* targets, int B, int T, float dloss);
  // Mean loss without preparing backward.
  float forward_eval(const int32_t* inputs, const int32_t* targets, int B, int T);
  // Logits (B,T,Vp) of inputs (no loss); valid until the next forward. Columns >= vocab_size are padding.
  const float* forward_logits(const int32_t* inputs, int B, int T);
  // Accumulates (+=) gradients of the last forward_train into grads().
  void backward(const GradReadyFn& on_ready = {});

  const Activations& activations() const { return acts_; }

  // Generation with a key/value cache: runs the model on `token` at position cache->len (which must be
  // < max_seq_len), appends its keys and values and returns the next-token logits (Vp), valid until the
  // next call. O(len) work per token instead of a forward over the whole window. A cache of another
  // model's shape (or a default-constructed one) is (re)allocated.
  const float* decode_step(int32_t token, KVCache* cache);

 private:
  void forward(const int32_t* inputs, int B, int T);
  void ensure_activations(int B, int T);
  // Block l's forward from its input. rerun: backward is recomputing it (full recompute): ln_1 is
  // re-applied from the saved statistics and it stops after the GELU, the last activation backward
  // reads; otherwise it goes on to the residual add fused with the next layernorm.
  void forward_block(int l, bool rerun);

  GPT2Config cfg_;
  ParamTable table_;
  std::vector<float> params_;
  std::vector<float> grads_;
  Activations acts_;
  Recompute recompute_ = Recompute::kNone;
  std::vector<int32_t> inputs_;  // (B,T) of the last forward, for the encoder backward
  // decode_step scratch, one token: x/ln/atty/proj/residual (C), qkv (3C), fch/fch_gelu (4C), logits (Vp)
  std::vector<float> dec_x_, dec_ln_, dec_qkv_, dec_atty_, dec_proj_, dec_res_, dec_fch_, dec_fchg_, dec_logits_;
  bool have_dlogits_ = false;
};

}  // namespace gpt2
