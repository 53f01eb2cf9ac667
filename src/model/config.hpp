// GPT-2 model dimensions and the named presets.
#pragma once

#include <cstddef>
#include <string>

namespace gpt2 {

struct GPT2Config {
  int n_layer = 0;        // L: transformer blocks
  int n_head = 0;         // NH: attention heads; divides n_embd
  int n_embd = 0;         // C: channels
  int vocab_size = 50257; // V: real vocabulary (GPT-2 BPE: 50257; byte-level: 256)
  int max_seq_len = 1024; // maxT: rows of the position embedding

  // Vocabulary rounded up to a multiple of 128 so the LM-head GEMM has friendly shapes. The padded
  // rows of wte stay zero and their logits never reach the loss or a sample.
  int padded_vocab_size() const { return (vocab_size + 127) / 128 * 128; }
  int head_size() const { return n_embd / n_head; }

  // Parameters as Hugging Face counts them (no padding rows).
  long long num_params() const;
  // Empty when valid, otherwise what is wrong, phrased for the user.
  std::string validate() const;
  // "L12 H12 C768 V50257 maxT1024 (124.4M params)"
  std::string describe() const;
  // Training FLOPs per token: 6N + 6LCT (forward + backward; causal attention counted at half).
  double flops_per_token(int seq_len) const;
};

// Fills the dimensions of `name`: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, or d<N>
// (L = N, NH = N, C = 64 N). Leaves vocab_size and max_seq_len alone. Returns false if unknown.
bool apply_model_preset(const std::string& name, GPT2Config* cfg);

// Which activations a training forward keeps for backward (--recompute). Whatever is dropped is
// recomputed in backward by the same kernels from what is kept, so gradients do not change by a bit.
//   kNone:      everything.
//   kSelective: not the layernorm outputs (ln1, ln2: re-applied from their input and the saved
//               mean/rstd) nor the GELU output (from the kept pre-activation).
//   kFull:      per block only its input (the residual stream entering it) and ln_1's mean/rstd;
//               backward reruns each block's forward, in reverse, into one block's worth of buffers.
enum class Recompute { kNone, kSelective, kFull };
const char* recompute_name(Recompute r);
// How many layers' worth of each kind of activation a forward keeps under a Recompute: L, or 1 (one
// layer's slot, refilled in backward). The CPU and CUDA models and the memory estimates use it.
struct KeptLayers {
  size_t ln;     // layernorm outputs ln1, ln2
  size_t gelu;   // the GELU output fch_gelu
  size_t inner;  // everything else inside a block (qkv, attention, residual2, ln2 statistics, fch, ...)
};
KeptLayers kept_layers(int L, Recompute r);
// The list above, for --help and error messages.
std::string model_preset_names();

}  // namespace gpt2
