// Hugging Face interop: our checkpoints out as a transformers GPT-2 (model.safetensors + config.json),
// and the released GPT-2 weights (model.safetensors) in as --init-from.
//
// Names and shapes are those of transformers' GPT2Model state dict, which our checkpoints already use
// (DESIGN.md section 5): wte.weight (V, C) without our padding rows, wpe.weight (maxT, C), h.{i}.* with
// Conv1D weights in [in, out] layout, ln_f.*. The LM head is tied to wte, so lm_head.weight is neither
// written nor read.
#pragma once

#include <string>

#include "model/config.hpp"
#include "model/gpt2.hpp"

namespace gpt2 {

// Loads the HDF5 checkpoint `ckpt_path` (model only) and writes `dir`/model.safetensors (F32, metadata
// {"format": "pt"}) and `dir`/config.json, which transformers' GPT2LMHeadModel.from_pretrained(dir) loads
// as they are. `dir` is created; each file is written to a temporary name and renamed.
void export_hf(const std::string& ckpt_path, const std::string& dir);

// The config.json text export_hf writes for `cfg` (GPT-2 defaults, dropout 0, tied embeddings,
// gelu_new, layer_norm_epsilon 1e-5; bos/eos 50256 when the vocabulary holds GPT-2's <|endoftext|>).
std::string hf_config_json(const GPT2Config& cfg);

// True when `path` should be read as safetensors rather than as one of our HDF5 checkpoints: its name
// ends in ".safetensors", or its first bytes look like a safetensors header.
bool is_safetensors(const std::string& path);

// The model dimensions of a GPT-2 safetensors file: n_layer, n_embd, vocab_size and max_seq_len from the
// tensor shapes; n_head (which no shape shows) from a config.json beside the file, else from
// `fallback`.n_head; an error if neither has one. A config.json that disagrees with the tensors is an
// error too.
GPT2Config read_hf_config(const std::string& safetensors_path, const GPT2Config& fallback);

// Loads GPT-2 weights from a safetensors file into `model` (F32, F16 or BF16 tensors, converted to fp32):
// names with or without a "transformer." prefix; the attention-mask buffers h.*.attn.bias and
// h.*.attn.masked_bias and lm_head.weight (tied to wte) are ignored; any other tensor that is not one
// of the model's parameters, a missing one, or a shape that differs is an error naming the tensor.
// wte's padding rows (vocab_size .. padded_vocab_size) are set to zero.
void load_hf_weights(const std::string& path, GPT2& model);

// The gpt2-train options that build a model of `cfg`, for error messages:
// "--model gpt2-124m --vocab-size 50257 --max-seq-len 1024" when a preset matches, else
// "--n-layer L --n-head H --n-embd C --vocab-size V --max-seq-len T".
std::string model_options_for(const GPT2Config& cfg);

}  // namespace gpt2
