// hf_logits: the test hook of the Hugging Face interop tests (test_hf.py). Two modes:
//
//   hf_logits logits MODEL TOKENS B T OUT [N_HEAD]
//       Loads MODEL (one of our HDF5 checkpoints, or a safetensors file through read_hf_config +
//       load_hf_weights, n_head from a config.json beside it, else N_HEAD), reads B*T int32 token ids
//       from the raw file TOKENS, runs our CPU forward and writes the logits of the real vocabulary,
//       (B, T, V) float32 row-major, to the raw file OUT.
//   hf_logits tensor FILE NAME OUT
//       Reads tensor NAME of the safetensors file FILE as fp32 (SafetensorsFile::read_f32, so F16 and
//       BF16 are converted) and writes it raw to OUT.
//   hf_logits json FILE
//       Parses FILE with parse_json (the parser of safetensors headers and config.json) and prints the
//       value back as JSON (numbers as written, strings re-escaped), for comparison with Python's json.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/gpt2.hpp"
#include "train/checkpoint.hpp"
#include "train/hf_interop.hpp"
#include "train/safetensors.hpp"

namespace {

void write_raw(const std::string& path, const float* data, size_t n) {
  std::ofstream os(path, std::ios::binary | std::ios::trunc);
  os.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
  GPT2_REQUIRE(os.good(), "cannot write " << path);
}

int logits_mode(int argc, char** argv) {
  const std::string model_path = argv[2], tokens_path = argv[3], out = argv[6];
  const int B = std::atoi(argv[4]), T = std::atoi(argv[5]);
  GPT2_REQUIRE(B > 0 && T > 0, "B and T must be positive");
  gpt2::GPT2Config fallback;
  fallback.n_head = argc == 8 ? std::atoi(argv[7]) : 0;
  const bool hf = gpt2::is_safetensors(model_path);
  const gpt2::GPT2Config cfg =
      hf ? gpt2::read_hf_config(model_path, fallback) : gpt2::read_checkpoint_config(model_path);
  GPT2_REQUIRE(T <= cfg.max_seq_len, "T " << T << " exceeds the model's max_seq_len " << cfg.max_seq_len);
  gpt2::GPT2 model(cfg);
  if (hf)
    gpt2::load_hf_weights(model_path, model);
  else
    gpt2::load_checkpoint(model_path, model, nullptr, nullptr);

  std::vector<int32_t> tokens(static_cast<size_t>(B) * T);
  std::ifstream is(tokens_path, std::ios::binary);
  is.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * sizeof(int32_t)));
  GPT2_REQUIRE(is.good(), "cannot read " << tokens.size() << " int32 tokens from " << tokens_path);
  for (const int32_t t : tokens) GPT2_REQUIRE(t >= 0 && t < cfg.vocab_size, "token " << t << " out of range");

  const int V = cfg.vocab_size, Vp = cfg.padded_vocab_size();
  const float* lg = model.forward_logits(tokens.data(), B, T);
  std::vector<float> logits(tokens.size() * V);
  for (size_t i = 0; i < tokens.size(); ++i)
    for (int j = 0; j < V; ++j) logits[i * V + j] = lg[i * Vp + j];
  write_raw(out, logits.data(), logits.size());
  std::printf("hf_logits: %s (%s) -> %s\n", model_path.c_str(), cfg.describe().c_str(), out.c_str());
  return 0;
}

void print_json(const gpt2::JsonValue& v, std::string& out) {
  using Kind = gpt2::JsonValue::Kind;
  auto quote = [&](const std::string& str) {
    out += '"';
    for (const char c : str) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
        out += buf;
      } else {
        out += c;
      }
    }
    out += '"';
  };
  switch (v.kind) {
    case Kind::kNull:
      out += "null";
      break;
    case Kind::kBool:
      out += v.boolean ? "true" : "false";
      break;
    case Kind::kNumber:
      out += v.text;
      break;
    case Kind::kString:
      quote(v.text);
      break;
    case Kind::kArray:
      out += '[';
      for (size_t i = 0; i < v.array.size(); ++i) {
        if (i) out += ',';
        print_json(v.array[i], out);
      }
      out += ']';
      break;
    case Kind::kObject:
      out += '{';
      for (size_t i = 0; i < v.object.size(); ++i) {
        if (i) out += ',';
        quote(v.object[i].first);
        out += ':';
        print_json(v.object[i].second, out);
      }
      out += '}';
      break;
  }
}

int json_mode(const std::string& path) {
  std::ifstream is(path, std::ios::binary);
  GPT2_REQUIRE(is.good(), "cannot read " << path);
  const std::string text((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
  std::string out;
  print_json(gpt2::parse_json(text, path), out);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int tensor_mode(char** argv) {
  const gpt2::SafetensorsFile f(argv[2]);
  const gpt2::SafetensorsTensor* t = f.find(argv[3]);
  GPT2_REQUIRE(t != nullptr, argv[2] << " has no tensor '" << argv[3] << "'");
  std::vector<float> data(t->numel());
  f.read_f32(*t, data.data());
  write_raw(argv[4], data.data(), data.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "logits" && (argc == 7 || argc == 8)) return logits_mode(argc, argv);
  if (mode == "tensor" && argc == 5) return tensor_mode(argv);
  if (mode == "json" && argc == 3) return json_mode(argv[2]);
  std::fprintf(stderr,
               "usage: hf_logits logits MODEL TOKENS B T OUT [N_HEAD]\n"
               "       hf_logits tensor FILE NAME OUT\n"
               "       hf_logits json FILE\n");
  return 2;
}
