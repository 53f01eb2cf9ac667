// The parameter table: one flat fp32 buffer in layer-major order
//   wte, wpe, h.0.*, h.1.*, ..., h.{L-1}.*, ln_f.*
// Gradients use a buffer of the same layout, so a bucket of the all-reduce is a contiguous slice,
// and the gradients of block l and everything after it are final once block l's backward is done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/param_segment.hpp"
#include "model/config.hpp"

namespace gpt2 {

struct ParamInfo {
  std::string name;           // Hugging Face GPT-2 state-dict name, e.g. "h.3.attn.c_attn.weight"
  std::vector<size_t> shape;  // internal shape (wte has padded_vocab_size rows)
  std::vector<size_t> hf_shape;  // shape in a Hugging Face checkpoint (wte: vocab_size rows)
  size_t offset = 0;          // into the flat buffer, in floats
  size_t numel = 0;           // product of shape
  bool decay = false;         // AdamW weight decay applies (2-D weights and embeddings only)
  int block = -1;             // transformer block, -1 for wte/wpe, n_layer for ln_f
};

// Pointers to each parameter inside one flat buffer (parameters, gradients or optimizer moments).
// Weights are in Hugging Face Conv1D layout [in, out].
struct BlockTensors {
  float* ln1w;      // (C)
  float* ln1b;      // (C)
  float* qkvw;      // (C, 3C)
  float* qkvb;      // (3C)
  float* attprojw;  // (C, C)
  float* attprojb;  // (C)
  float* ln2w;      // (C)
  float* ln2b;      // (C)
  float* fcw;       // (C, 4C)
  float* fcb;       // (4C)
  float* fcprojw;   // (4C, C)
  float* fcprojb;   // (C)
};
static_assert(sizeof(BlockTensors) == 12 * sizeof(float*), "one pointer per block parameter, in table order");

struct ModelTensors {
  float* wte;  // (Vp, C), tied with the LM head
  float* wpe;  // (maxT, C)
  std::vector<BlockTensors> blocks;  // L entries
  float* lnfw;  // (C)
  float* lnfb;  // (C)
};

class ParamTable {
 public:
  explicit ParamTable(const GPT2Config& cfg);

  const std::vector<ParamInfo>& params() const { return params_; }
  const GPT2Config& config() const { return cfg_; }
  // Size of the flat buffer in floats (each tensor starts on a 64-float boundary; gaps stay zero).
  size_t total() const { return total_; }
  // First offset of block l's parameters; block_begin(n_layer) is where ln_f starts.
  size_t block_begin(int l) const { return block_begin_[l]; }
  // Index in params() of `name`, or -1.
  int find(const std::string& name) const;
  // Every tensor as a segment of the flat buffer, in table order: what the optimizer updates.
  std::vector<ParamSegment> segments() const;
  ModelTensors tensors(float* base) const;

 private:
  GPT2Config cfg_;
  std::vector<ParamInfo> params_;
  std::vector<size_t> block_begin_;
  size_t total_ = 0;
};

// GPT-2 initialisation, seeded and deterministic: N(0, 0.02) for weights and embeddings, the two
// residual projections (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2L), layernorm weights 1, biases
// 0, padded wte rows 0. Each tensor draws from its own stream, so the values of a tensor do not
// depend on the model's other shapes.
void init_gpt2_params(const ParamTable& table, float* params, uint64_t seed);

}  // namespace gpt2
