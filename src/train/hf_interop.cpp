#include "train/hf_interop.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "train/checkpoint.hpp"
#include "train/safetensors.hpp"

namespace gpt2 {

namespace {

constexpr const char* kPrefix = "transformer.";  // GPT2LMHeadModel's state dict nests GPT2Model under it
constexpr int kGpt2EndOfText = 50256;

std::string dir_of(const std::string& path) {
  const size_t s = path.rfind('/');
  return s == std::string::npos ? "." : path.substr(0, s);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip_prefix(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 ? name.substr(std::char_traits<char>::length(kPrefix)) : name;
}

// "h.<i>.<rest>": true and *layer = i (rest must be non-empty).
bool block_index(const std::string& name, int* layer, std::string* rest) {
  if (name.rfind("h.", 0) != 0) return false;
  size_t i = 2;
  long v = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && v < 1000000) v = v * 10 + (name[i++] - '0');
  if (i == 2 || i >= name.size() - 1 || name[i] != '.') return false;
  *layer = static_cast<int>(v);
  *rest = name.substr(i + 1);
  return true;
}

// Tensors a transformers GPT-2 file may hold that are not parameters of ours: the causal-mask buffers
// of older transformers versions, and the LM head, which is tied to wte.
bool ignored_tensor(const std::string& base) {
  if (base == "lm_head.weight") return true;
  int layer = 0;
  std::string rest;
  return block_index(base, &layer, &rest) && (rest == "attn.bias" || rest == "attn.masked_bias");
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The tensor `name` of `f`, with or without the "transformer." prefix; nullptr when neither exists.
const SafetensorsTensor* find_param(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensor* plain = f.find(name);
  const SafetensorsTensor* prefixed = f.find(kPrefix + name);
  GPT2_REQUIRE(plain == nullptr || prefixed == nullptr, "safetensors file " << f.path() << " holds both '" << name
                                                                            << "' and '" << kPrefix << name
                                                                            << "': which one to load is ambiguous");
  return plain != nullptr ? plain : prefixed;
}

const SafetensorsTensor& require_param(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensor* t = find_param(f, name);
  GPT2_REQUIRE(t != nullptr, "safetensors file " << f.path() << " has no tensor '" << name << "' (nor '" << kPrefix
                                                 << name << "'): not a GPT-2 model, or a different number of layers");
  return *t;
}

// n_head (and a consistency check of the other dimensions) from the config.json beside `path`.
// Returns 0 when there is no config.json.
int n_head_from_config_json(const std::string& path, const GPT2Config& from_tensors) {
  const std::string cfg_path = dir_of(path) + "/config.json";
  std::ifstream is(cfg_path, std::ios::binary);
  if (!is.good()) return 0;
  std::ostringstream ss;
  ss << is.rdbuf();
  const JsonValue root = parse_json(ss.str(), cfg_path);
  GPT2_REQUIRE(root.kind == JsonValue::Kind::kObject, cfg_path << " is not a JSON object");
  auto int_field = [&](const char* key, int64_t* out) {
    const JsonValue* v = root.get(key);
    if (v == nullptr || v->kind == JsonValue::Kind::kNull) return false;
    GPT2_REQUIRE(v->as_int64(out), cfg_path << ": \"" << key << "\" is not an integer");
    return true;
  };
  const struct {
    const char* key;
    int value;
  } checks[] = {{"n_layer", from_tensors.n_layer},
                {"n_embd", from_tensors.n_embd},
                {"vocab_size", from_tensors.vocab_size},
                {"n_positions", from_tensors.max_seq_len}};
  for (const auto& c : checks) {
    int64_t v = 0;
    if (int_field(c.key, &v))
      GPT2_REQUIRE(v == c.value,
                   cfg_path << " says " << c.key << " " << v << " but the tensors of " << path << " have " << c.value);
  }
  int64_t n_head = 0;
  if (!int_field("n_head", &n_head)) return 0;
  GPT2_REQUIRE(n_head > 0 && n_head <= from_tensors.n_embd,
               cfg_path << ": n_head " << n_head << " is not valid for n_embd " << from_tensors.n_embd);
  return static_cast<int>(n_head);
}

}  // namespace

std::string model_options_for(const GPT2Config& cfg) {
  std::ostringstream os;
  std::vector<std::string> presets = {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m",
                                      "d" + std::to_string(cfg.n_layer)};
  std::string preset;
  for (const std::string& name : presets) {
    GPT2Config p = cfg;
    if (apply_model_preset(name, &p) && p.n_layer == cfg.n_layer && p.n_head == cfg.n_head && p.n_embd == cfg.n_embd) {
      preset = name;
      break;
    }
  }
  if (!preset.empty())
    os << "--model " << preset;
  else
    os << "--n-layer " << cfg.n_layer << " --n-head " << cfg.n_head << " --n-embd " << cfg.n_embd;
  os << " --vocab-size " << cfg.vocab_size << " --max-seq-len " << cfg.max_seq_len;
  return os.str();
}

std::string hf_config_json(const GPT2Config& cfg) {
  // GPT-2 BPE ids: 50256 is <|endoftext|>, GPT-2's bos and eos. Another vocabulary has no such token.
  const std::string eot = cfg.vocab_size > kGpt2EndOfText ? std::to_string(kGpt2EndOfText) : "null";
  // Keys sorted, as transformers writes them; the values not given by the model are GPT2Config's
  // defaults, except dropout, which our training does not use (0).
  std::ostringstream os;
  os << "{\n"
     << "  \"activation_function\": \"gelu_new\",\n"
     << "  \"architectures\": [\n    \"GPT2LMHeadModel\"\n  ],\n"
     << "  \"attn_pdrop\": 0.0,\n"
     << "  \"bos_token_id\": " << eot << ",\n"
     << "  \"embd_pdrop\": 0.0,\n"
     << "  \"eos_token_id\": " << eot << ",\n"
     << "  \"initializer_range\": 0.02,\n"
     << "  \"layer_norm_epsilon\": 1e-05,\n"
     << "  \"model_type\": \"gpt2\",\n"
     << "  \"n_ctx\": " << cfg.max_seq_len << ",\n"
     << "  \"n_embd\": " << cfg.n_embd << ",\n"
     << "  \"n_head\": " << cfg.n_head << ",\n"
     << "  \"n_inner\": null,\n"
     << "  \"n_layer\": " << cfg.n_layer << ",\n"
     << "  \"n_positions\": " << cfg.max_seq_len << ",\n"
     << "  \"reorder_and_upcast_attn\": false,\n"
     << "  \"resid_pdrop\": 0.0,\n"
     << "  \"scale_attn_by_inverse_layer_idx\": false,\n"
     << "  \"scale_attn_weights\": true,\n"
     << "  \"summary_activation\": null,\n"
     << "  \"summary_first_dropout\": 0.1,\n"
     << "  \"summary_proj_to_labels\": true,\n"
     << "  \"summary_type\": \"cls_index\",\n"
     << "  \"summary_use_proj\": true,\n"
     << "  \"tie_word_embeddings\": true,\n"
     << "  \"torch_dtype\": \"float32\",\n"
     << "  \"use_cache\": true,\n"
     << "  \"vocab_size\": " << cfg.vocab_size << "\n"
     << "}\n";
  return os.str();
}

void export_hf(const std::string& ckpt_path, const std::string& dir) {
  const GPT2Config cfg = read_checkpoint_config(ckpt_path);
  GPT2 model(cfg);
  load_checkpoint(ckpt_path, model, nullptr, nullptr);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  GPT2_REQUIRE(!ec, "cannot create directory " << dir << ": " << ec.message());
  // Our internal layout is Hugging Face's except for wte's padding rows, which come after the first
  // vocab_size rows: hf_shape leaves them out.
  std::vector<SafetensorsF32Tensor> tensors;
  for (const ParamInfo& p : model.table().params())
    tensors.push_back(
        {p.name, std::vector<int64_t>(p.hf_shape.begin(), p.hf_shape.end()), model.params().data() + p.offset});
  write_safetensors_f32(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  write_file_atomic(dir + "/config.json", hf_config_json(cfg));
}

bool is_safetensors(const std::string& path) {
  return ends_with(path, ".safetensors") || looks_like_safetensors(path);
}

GPT2Config read_hf_config(const std::string& safetensors_path, const GPT2Config& fallback) {
  const SafetensorsFile f(safetensors_path);
  const std::string& path = f.path();
  const SafetensorsTensor& wte = require_param(f, "wte.weight");
  const SafetensorsTensor& wpe = require_param(f, "wpe.weight");
  GPT2_REQUIRE(wte.shape.size() == 2 && wpe.shape.size() == 2 && wte.shape[1] == wpe.shape[1] && wte.shape[0] > 0 &&
                   wpe.shape[0] > 0 && wte.shape[1] > 0,
               "safetensors file " << path << ": wte.weight " << shape_str(wte.shape) << " and wpe.weight "
                                   << shape_str(wpe.shape) << " are not (V, C) and (maxT, C)");
  GPT2_REQUIRE(wte.shape[0] <= (1 << 30) && wpe.shape[0] <= (1 << 30) && wte.shape[1] <= (1 << 20),
               "safetensors file " << path << ": wte.weight " << shape_str(wte.shape) << " is implausibly large");
  GPT2Config c;
  c.vocab_size = static_cast<int>(wte.shape[0]);
  c.n_embd = static_cast<int>(wte.shape[1]);
  c.max_seq_len = static_cast<int>(wpe.shape[0]);
  int n_layer = 0;
  for (const SafetensorsTensor& t : f.tensors()) {
    int layer = 0;
    std::string rest;
    if (block_index(strip_prefix(t.name), &layer, &rest)) n_layer = std::max(n_layer, layer + 1);
  }
  GPT2_REQUIRE(n_layer > 0, "safetensors file " << path << " holds no transformer blocks (no h.0.* tensors)");
  c.n_layer = n_layer;
  const int from_json = n_head_from_config_json(path, c);
  c.n_head = from_json > 0 ? from_json : fallback.n_head;
  GPT2_REQUIRE(c.n_head > 0, "cannot tell the number of attention heads of "
                                 << path
                                 << ": the file does not record it, there is no config.json with n_head beside "
                                    "it, and no --n-head was given");
  const std::string err = c.validate();
  GPT2_REQUIRE(err.empty(), "safetensors file " << path << " describes an invalid model: " << err
                                                << (from_json > 0 ? " (n_head from config.json)" : ""));
  return c;
}

void load_hf_weights(const std::string& path, GPT2& model) {
  const SafetensorsFile f(path);
  const std::vector<ParamInfo>& params = model.table().params();
  // Resolve and check every name and shape before touching the model.
  std::vector<const SafetensorsTensor*> src;
  std::set<std::string> used;
  for (const ParamInfo& p : params) {
    const SafetensorsTensor& t = require_param(f, p.name);
    const std::vector<int64_t> want(p.hf_shape.begin(), p.hf_shape.end());
    GPT2_REQUIRE(t.shape == want, "safetensors file " << path << ", tensor '" << t.name << "' has shape "
                                                      << shape_str(t.shape) << " but the model "
                                                      << model.config().describe() << " needs " << shape_str(want));
    src.push_back(&t);
    used.insert(t.name);
  }
  for (const SafetensorsTensor& t : f.tensors()) {
    if (used.count(t.name) != 0 || ignored_tensor(strip_prefix(t.name))) continue;
    fatal(msg() << "safetensors file " << path << " holds tensor '" << t.name << "' " << shape_str(t.shape)
                << ", which is not a parameter of the model " << model.config().describe()
                << " (a different number of layers, or not a GPT-2 model)");
  }
  std::vector<float>& buf = model.params();
  std::fill(buf.begin(), buf.end(), 0.0f);  // wte's padding rows and the alignment gaps stay zero
  for (size_t i = 0; i < params.size(); ++i) f.read_f32(*src[i], buf.data() + params[i].offset);
}

}  // namespace gpt2
