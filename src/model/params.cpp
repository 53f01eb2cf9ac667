#include "model/params.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace gpt2 {

namespace {
constexpr size_t kAlign = 64;  // floats: 256-byte aligned tensors for SIMD loads and GPU vector access
}

ParamTable::ParamTable(const GPT2Config& cfg) : cfg_(cfg) {
  const std::string err = cfg.validate();
  GPT2_REQUIRE(err.empty(), "invalid model: " << err);
  const size_t C = cfg.n_embd, Vp = cfg.padded_vocab_size(), V = cfg.vocab_size, maxT = cfg.max_seq_len;
  size_t off = 0;
  auto add = [&](const std::string& name, std::vector<size_t> shape, bool decay, int block,
                 std::vector<size_t> hf_shape = {}) {
    ParamInfo p;
    p.name = name;
    p.shape = shape;
    p.hf_shape = hf_shape.empty() ? shape : hf_shape;
    p.numel = 1;
    for (size_t d : shape) p.numel *= d;
    p.offset = off;
    p.decay = decay;
    p.block = block;
    off += (p.numel + kAlign - 1) / kAlign * kAlign;
    params_.push_back(std::move(p));
  };
  add("wte.weight", {Vp, C}, true, -1, {V, C});
  add("wpe.weight", {maxT, C}, true, -1);
  for (int l = 0; l < cfg.n_layer; ++l) {
    block_begin_.push_back(off);
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C}, false, l);
    add(h + "ln_1.bias", {C}, false, l);
    add(h + "attn.c_attn.weight", {C, 3 * C}, true, l);
    add(h + "attn.c_attn.bias", {3 * C}, false, l);
    add(h + "attn.c_proj.weight", {C, C}, true, l);
    add(h + "attn.c_proj.bias", {C}, false, l);
    add(h + "ln_2.weight", {C}, false, l);
    add(h + "ln_2.bias", {C}, false, l);
    add(h + "mlp.c_fc.weight", {C, 4 * C}, true, l);
    add(h + "mlp.c_fc.bias", {4 * C}, false, l);
    add(h + "mlp.c_proj.weight", {4 * C, C}, true, l);
    add(h + "mlp.c_proj.bias", {C}, false, l);
  }
  block_begin_.push_back(off);
  add("ln_f.weight", {C}, false, cfg.n_layer);
  add("ln_f.bias", {C}, false, cfg.n_layer);
  total_ = off;
}

std::vector<ParamSegment> ParamTable::segments() const {
  std::vector<ParamSegment> out;
  out.reserve(params_.size());
  for (const ParamInfo& p : params_) out.push_back({p.offset, p.numel, p.decay});
  return out;
}

int ParamTable::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return static_cast<int>(i);
  return -1;
}

ModelTensors ParamTable::tensors(float* base) const {
  ModelTensors t;
  size_t i = 0;
  auto next = [&]() { return base + params_[i++].offset; };
  t.wte = next();
  t.wpe = next();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    // Member pointers in table order (the order add() used above).
    static constexpr float* BlockTensors::*kFields[12] = {
        &BlockTensors::ln1w, &BlockTensors::ln1b, &BlockTensors::qkvw,    &BlockTensors::qkvb,
        &BlockTensors::attprojw, &BlockTensors::attprojb, &BlockTensors::ln2w, &BlockTensors::ln2b,
        &BlockTensors::fcw,  &BlockTensors::fcb,  &BlockTensors::fcprojw, &BlockTensors::fcprojb};
    BlockTensors b{};
    for (auto field : kFields) b.*field = next();
    t.blocks.push_back(b);
  }
  t.lnfw = next();
  t.lnfb = next();
  return t;
}

void init_gpt2_params(const ParamTable& table, float* params, uint64_t seed) {
  std::memset(params, 0, table.total() * sizeof(float));
  const float residual_scale = 1.0f / std::sqrt(2.0f * table.config().n_layer);
  const auto& ps = table.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    const ParamInfo& p = ps[i];
    float* w = params + p.offset;
    const bool is_bias = p.name.size() >= 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
    const bool is_ln = p.name.find("ln_") != std::string::npos;
    if (is_bias) continue;  // zero
    if (is_ln) {
      for (size_t k = 0; k < p.numel; ++k) w[k] = 1.0f;
      continue;
    }
    float std = 0.02f;
    if (p.name.find("c_proj.weight") != std::string::npos) std *= residual_scale;
    Rng rng(seed, i);
    // Only the Hugging Face rows get values: padded wte rows stay zero.
    size_t n = 1;
    for (size_t d : p.hf_shape) n *= d;
    for (size_t k = 0; k < n; ++k) w[k] = static_cast<float>(rng.normal() * std);
  }
}

}  // namespace gpt2
