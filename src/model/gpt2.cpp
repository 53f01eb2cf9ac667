#include "model/gpt2.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "kernels/attention/attention.hpp"
#include "kernels/encoder/encoder.hpp"
#include "kernels/gelu/gelu.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/layernorm/layernorm.hpp"
#include "kernels/softmax_xent/softmax_xent.hpp"

namespace gpt2 {

using namespace kernels;

GPT2::GPT2(const GPT2Config& cfg) : cfg_(cfg), table_(cfg), params_(table_.total(), 0.0f), grads_(table_.total(), 0.0f) {}

void GPT2::zero_grad() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

namespace {
// Layer l's slice of an activation holding `per` floats per layer, or the one-layer slot (refilled
// in backward) when the buffer holds a single layer.
float* slot(std::vector<float>& v, int l, size_t per) { return v.data() + (v.size() == per ? 0 : l * per); }

}  // namespace

double GPT2::activation_bytes(const GPT2Config& cfg, int B, int T, Recompute recompute) {
  const KeptLayers k = kept_layers(cfg.n_layer, recompute);
  const double L = cfg.n_layer, C = cfg.n_embd, NH = cfg.n_head, Vp = cfg.padded_vocab_size();
  const double BT = static_cast<double>(B) * T;
  const double ln = k.ln, gelu = k.gelu, inner = k.inner;
  const double layers = ln * BT * C * 2                     // ln1, ln2
                        + gelu * BT * 4 * C                 // fch_gelu
                        + inner * (BT * C * 2               // atty, residual2
                                   + BT * 2                 // ln2 mean and rstd
                                   + BT * 3 * C             // qkv
                                   + BT * 4 * C             // fch
                                   + static_cast<double>(B) * NH * T * T)  // att
                        + L * (BT * C + BT * 2);            // residual3, ln1 mean and rstd
  const double once = BT * C * 4               // encoded, lnf, dresidual, btc
                      + BT * 3                 // lnf mean and rstd, losses
                      + BT * Vp                // logits
                      + BT * 3 * C + BT * 4 * C;  // dqkv, dbt4c
  return (layers + once) * sizeof(float);
}

void GPT2::set_recompute(Recompute r) {
  if (r == recompute_) return;
  recompute_ = r;
  acts_ = Activations{};  // reallocated at the next forward with the new layout
  have_dlogits_ = false;
}

void GPT2::ensure_activations(int B, int T) {
  if (acts_.B == B && acts_.T == T && acts_.recompute == recompute_) return;
  const size_t L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, Vp = cfg_.padded_vocab_size();
  const size_t BT = static_cast<size_t>(B) * T;
  const KeptLayers k = kept_layers(cfg_.n_layer, recompute_);
  Activations& a = acts_;
  a = Activations{};  // free the old layout before the new one is allocated
  a.B = B;
  a.T = T;
  a.recompute = recompute_;
  a.encoded.assign(BT * C, 0.0f);
  a.ln1.assign(k.ln * BT * C, 0.0f);
  a.ln1_mean.assign(L * BT, 0.0f);
  a.ln1_rstd.assign(L * BT, 0.0f);
  a.qkv.assign(k.inner * BT * 3 * C, 0.0f);
  a.att.assign(k.inner * B * NH * T * T, 0.0f);
  a.atty.assign(k.inner * BT * C, 0.0f);
  a.residual2.assign(k.inner * BT * C, 0.0f);
  a.ln2.assign(k.ln * BT * C, 0.0f);
  a.ln2_mean.assign(k.inner * BT, 0.0f);
  a.ln2_rstd.assign(k.inner * BT, 0.0f);
  a.fch.assign(k.inner * BT * 4 * C, 0.0f);
  a.fch_gelu.assign(k.gelu * BT * 4 * C, 0.0f);
  a.residual3.assign(L * BT * C, 0.0f);
  a.lnf.assign(BT * C, 0.0f);
  a.lnf_mean.assign(BT, 0.0f);
  a.lnf_rstd.assign(BT, 0.0f);
  a.logits.assign(BT * Vp, 0.0f);
  a.losses.assign(BT, 0.0f);
  a.dresidual.assign(BT * C, 0.0f);
  a.btc.assign(BT * C, 0.0f);
  a.dqkv.assign(BT * 3 * C, 0.0f);
  a.dbt4c.assign(BT * 4 * C, 0.0f);
}

void GPT2::forward(const int32_t* inputs, int B, int T) {
  GPT2_REQUIRE(T >= 1 && T <= cfg_.max_seq_len,
               "sequence length " << T << " exceeds the model's max_seq_len " << cfg_.max_seq_len);
  GPT2_REQUIRE(B >= 1, "batch size must be positive");
  const int L = cfg_.n_layer, C = cfg_.n_embd, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size();
  const int N = B * T;
  for (int i = 0; i < N; ++i)
    GPT2_REQUIRE(inputs[i] >= 0 && inputs[i] < V, "token id " << inputs[i] << " out of range [0, " << V << ")");
  ensure_activations(B, T);
  inputs_.assign(inputs, inputs + N);
  have_dlogits_ = false;

  const ModelTensors p = table_.tensors(params_.data());
  Activations& a = acts_;

  encoder_forward_cpu(a.encoded.data(), inputs, p.wte, p.wpe, B, T, C);  // (B,T) -> (B,T,C)
  const BlockTensors& b0 = p.blocks[0];
  layernorm_forward_cpu(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), a.encoded.data(), b0.ln1w, b0.ln1b, N, C);
  for (int l = 0; l < L; ++l) forward_block(l, /*rerun=*/false);
  lm_head_forward_cpu(a.logits.data(), a.lnf.data(), p.wte, N, C, Vp);  // (B,T,C) -> (B,T,Vp)
}

void GPT2::forward_block(int l, bool rerun) {
  const int L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head;
  const int B = acts_.B, T = acts_.T, N = B * T;
  const size_t BTC = static_cast<size_t>(N) * C;
  const ModelTensors p = table_.tensors(params_.data());
  const BlockTensors& w = p.blocks[l];
  Activations& a = acts_;
  const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * BTC;
  float* ln1 = slot(a.ln1, l, BTC);
  float* qkv = slot(a.qkv, l, 3 * BTC);
  float* att = slot(a.att, l, static_cast<size_t>(B) * NH * T * T);
  float* atty = slot(a.atty, l, BTC);
  float* residual2 = slot(a.residual2, l, BTC);
  float* ln2 = slot(a.ln2, l, BTC);
  float* ln2_mean = slot(a.ln2_mean, l, N);
  float* ln2_rstd = slot(a.ln2_rstd, l, N);
  float* fch = slot(a.fch, l, 4 * BTC);
  float* fch_gelu = slot(a.fch_gelu, l, 4 * BTC);
  // The projections go to the scratch btc: only the residual add after each reads them (in backward,
  // btc is free whenever a block is rerun: its last reader, the block above's ln_1 backward, is done).
  float* attproj = a.btc.data();
  float* fcproj = a.btc.data();
  float* residual3 = a.residual3.data() + l * BTC;

  // ln_1 of block l was written by the previous block's fused residual add (or by forward()).
  if (rerun)
    layernorm_apply_cpu(ln1, residual, a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, w.ln1w, w.ln1b, N, C);
  linear_forward_cpu(qkv, ln1, w.qkvw, w.qkvb, N, C, 3 * C);          // (B,T,C) -> (B,T,3C)
  attention_forward_cpu(atty, att, qkv, B, T, C, NH);                 // (B,T,3C) -> (B,T,C)
  linear_forward_cpu(attproj, atty, w.attprojw, w.attprojb, N, C, C);  // (B,T,C) -> (B,T,C)
  residual_layernorm_forward_cpu(residual2, ln2, ln2_mean, ln2_rstd, residual, attproj, w.ln2w, w.ln2b, N, C);
  linear_forward_cpu(fch, ln2, w.fcw, w.fcb, N, C, 4 * C);            // (B,T,C) -> (B,T,4C)
  gelu_forward_cpu(fch_gelu, fch, 4 * static_cast<long>(BTC));
  if (rerun) return;  // residual3 (block l's output) and what follows from it are kept
  linear_forward_cpu(fcproj, fch_gelu, w.fcprojw, w.fcprojb, N, 4 * C, C);  // (B,T,4C) -> (B,T,C)
  // residual3 = residual2 + fcproj, fused with the next layernorm: ln_1 of block l+1, or ln_f.
  if (l + 1 < L) {
    const BlockTensors& wn = p.blocks[l + 1];
    residual_layernorm_forward_cpu(residual3, slot(a.ln1, l + 1, BTC), a.ln1_mean.data() + (l + 1) * N,
                                   a.ln1_rstd.data() + (l + 1) * N, residual2, fcproj, wn.ln1w, wn.ln1b, N, C);
  } else {
    residual_layernorm_forward_cpu(residual3, a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), residual2, fcproj,
                                   p.lnfw, p.lnfb, N, C);
  }
}

static void check_targets(const int32_t* targets, int N, int V) {
  for (int i = 0; i < N; ++i)
    GPT2_REQUIRE(targets[i] >= 0 && targets[i] < V, "target token id " << targets[i] << " out of range [0, " << V << ")");
}

static float mean_of(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += x;
  return static_cast<float>(s / static_cast<double>(v.size()));
}

float GPT2::forward_train(const int32_t* inputs, const int32_t* targets, int B, int T, float dloss) {
  check_targets(targets, B * T, cfg_.vocab_size);
  forward(inputs, B, T);
  softmax_xent_cpu(acts_.losses.data(), acts_.logits.data(), targets, B * T, cfg_.vocab_size,
                   cfg_.padded_vocab_size(), dloss, /*write_grad=*/true);
  have_dlogits_ = true;
  return mean_of(acts_.losses);
}

float GPT2::forward_eval(const int32_t* inputs, const int32_t* targets, int B, int T) {
  check_targets(targets, B * T, cfg_.vocab_size);
  forward(inputs, B, T);
  softmax_xent_cpu(acts_.losses.data(), acts_.logits.data(), targets, B * T, cfg_.vocab_size,
                   cfg_.padded_vocab_size(), 0.0f, /*write_grad=*/false);
  return mean_of(acts_.losses);
}

const float* GPT2::forward_logits(const int32_t* inputs, int B, int T) {
  forward(inputs, B, T);
  return acts_.logits.data();
}

const float* GPT2::decode_step(int32_t token, KVCache* cache) {
  const int L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, hs = C / NH, V = cfg_.vocab_size;
  const int maxT = cfg_.max_seq_len, Vp = cfg_.padded_vocab_size();
  const size_t per_layer = static_cast<size_t>(NH) * maxT * hs;
  if (cache->k.size() != L * per_layer) {
    cache->k.assign(L * per_layer, 0.0f);
    cache->v.assign(L * per_layer, 0.0f);
    cache->len = 0;
  }
  const int pos = cache->len;
  GPT2_REQUIRE(pos < maxT, "the key/value cache is full (" << maxT << " tokens)");
  GPT2_REQUIRE(token >= 0 && token < V, "token id " << token << " out of range [0, " << V << ")");
  dec_x_.resize(C);
  dec_ln_.resize(C);
  dec_qkv_.resize(3 * C);
  dec_atty_.resize(C);
  dec_proj_.resize(C);
  dec_res_.resize(C);
  dec_fch_.resize(4 * C);
  dec_fchg_.resize(4 * C);
  dec_logits_.resize(Vp);
  const ModelTensors p = table_.tensors(params_.data());
  float mean = 0, rstd = 0;
  // The same kernels as forward() with one row, so a decoded token's logits equal the full forward's.
  for (int c = 0; c < C; ++c)
    dec_x_[c] = p.wte[static_cast<size_t>(token) * C + c] + p.wpe[static_cast<size_t>(pos) * C + c];
  layernorm_forward_cpu(dec_ln_.data(), &mean, &rstd, dec_x_.data(), p.blocks[0].ln1w, p.blocks[0].ln1b, 1, C);
  for (int l = 0; l < L; ++l) {
    const BlockTensors& w = p.blocks[l];
    linear_forward_cpu(dec_qkv_.data(), dec_ln_.data(), w.qkvw, w.qkvb, 1, C, 3 * C);
    float* kc = cache->k.data() + l * per_layer;
    float* vc = cache->v.data() + l * per_layer;
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < hs; ++i) {
        kc[(static_cast<size_t>(h) * maxT + pos) * hs + i] = dec_qkv_[C + h * hs + i];
        vc[(static_cast<size_t>(h) * maxT + pos) * hs + i] = dec_qkv_[2 * C + h * hs + i];
      }
    attention_decode_cpu(dec_atty_.data(), dec_qkv_.data(), kc, vc, pos + 1, maxT, C, NH);
    linear_forward_cpu(dec_proj_.data(), dec_atty_.data(), w.attprojw, w.attprojb, 1, C, C);
    residual_layernorm_forward_cpu(dec_res_.data(), dec_ln_.data(), &mean, &rstd, dec_x_.data(), dec_proj_.data(),
                                   w.ln2w, w.ln2b, 1, C);
    linear_forward_cpu(dec_fch_.data(), dec_ln_.data(), w.fcw, w.fcb, 1, C, 4 * C);
    gelu_forward_cpu(dec_fchg_.data(), dec_fch_.data(), 4 * C);
    linear_forward_cpu(dec_proj_.data(), dec_fchg_.data(), w.fcprojw, w.fcprojb, 1, 4 * C, C);
    const bool last = l + 1 == L;
    residual_layernorm_forward_cpu(dec_x_.data(), dec_ln_.data(), &mean, &rstd, dec_res_.data(), dec_proj_.data(),
                                   last ? p.lnfw : p.blocks[l + 1].ln1w, last ? p.lnfb : p.blocks[l + 1].ln1b, 1, C);
  }
  lm_head_forward_cpu(dec_logits_.data(), dec_ln_.data(), p.wte, 1, C, Vp);
  cache->len = pos + 1;
  return dec_logits_.data();
}

void GPT2::backward(const GradReadyFn& on_ready) {
  GPT2_CHECK(have_dlogits_, "backward() needs a forward_train() first");
  have_dlogits_ = false;
  const int L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, Vp = cfg_.padded_vocab_size();
  const int B = acts_.B, T = acts_.T, N = B * T;
  const size_t BTC = static_cast<size_t>(N) * C;
  const ModelTensors p = table_.tensors(params_.data());
  const ModelTensors g = table_.tensors(grads_.data());
  Activations& a = acts_;
  auto ready = [&](size_t from) {
    if (on_ready) on_ready(from);
  };

  // LM head (tied): dwte gets its first contribution here; its last comes from the encoder below.
  lm_head_backward_cpu(a.btc.data(), g.wte, a.logits.data(), a.lnf.data(), p.wte, N, C, Vp);
  std::fill(a.dresidual.begin(), a.dresidual.end(), 0.0f);
  layernorm_backward_cpu(a.dresidual.data(), g.lnfw, g.lnfb, a.btc.data(), a.residual3.data() + (L - 1) * BTC,
                         p.lnfw, a.lnf_mean.data(), a.lnf_rstd.data(), N, C);
  ready(table_.block_begin(L));

  for (int l = L - 1; l >= 0; --l) {
    const BlockTensors& w = p.blocks[l];
    const BlockTensors& dw = g.blocks[l];
    const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * BTC;
    float* ln1 = slot(a.ln1, l, BTC);
    float* ln2 = slot(a.ln2, l, BTC);
    float* fch_gelu = slot(a.fch_gelu, l, 4 * BTC);
    const float* fch = slot(a.fch, l, 4 * BTC);
    const float* ln2_mean = slot(a.ln2_mean, l, N);
    const float* ln2_rstd = slot(a.ln2_rstd, l, N);
    // Refill what the forward dropped, with the forward's kernels, so the gradients do not change.
    if (a.recompute == Recompute::kFull) {
      forward_block(l, /*rerun=*/true);  // qkv .. fch_gelu of block l from its input, ln1 and ln2 included
    } else if (a.recompute == Recompute::kSelective) {
      layernorm_apply_cpu(ln2, a.residual2.data() + l * BTC, ln2_mean, ln2_rstd, w.ln2w, w.ln2b, N, C);
      layernorm_apply_cpu(ln1, residual, a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, w.ln1w, w.ln1b, N, C);
      gelu_forward_cpu(fch_gelu, fch, 4 * static_cast<long>(BTC));
    }
    // dresidual holds d(residual3[l]); the identity paths add into it via layernorm_backward's +=.
    linear_backward_cpu(a.dbt4c.data(), dw.fcprojw, dw.fcprojb, a.dresidual.data(), fch_gelu, w.fcprojw, N, 4 * C, C);
    gelu_backward_cpu(a.dbt4c.data(), fch, a.dbt4c.data(), 4 * static_cast<long>(BTC));
    linear_backward_cpu(a.btc.data(), dw.fcw, dw.fcb, a.dbt4c.data(), ln2, w.fcw, N, C, 4 * C);
    layernorm_backward_cpu(a.dresidual.data(), dw.ln2w, dw.ln2b, a.btc.data(), slot(a.residual2, l, BTC), w.ln2w,
                           ln2_mean, ln2_rstd, N, C);
    // dresidual now holds d(residual2[l])
    linear_backward_cpu(a.btc.data(), dw.attprojw, dw.attprojb, a.dresidual.data(), slot(a.atty, l, BTC),
                        w.attprojw, N, C, C);
    attention_backward_cpu(a.dqkv.data(), a.btc.data(), slot(a.qkv, l, 3 * BTC),
                           slot(a.att, l, static_cast<size_t>(B) * NH * T * T), B, T, C, NH);
    linear_backward_cpu(a.btc.data(), dw.qkvw, dw.qkvb, a.dqkv.data(), ln1, w.qkvw, N, C, 3 * C);
    layernorm_backward_cpu(a.dresidual.data(), dw.ln1w, dw.ln1b, a.btc.data(), residual, w.ln1w,
                           a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, N, C);
    // dresidual now holds d(residual entering block l)
    ready(table_.block_begin(l));
  }
  encoder_backward_cpu(g.wte, g.wpe, a.dresidual.data(), inputs_.data(), B, T, C);
  ready(0);  // wte (tied) is final only now, so the bucket holding it is always the last one
}

}  // namespace gpt2
