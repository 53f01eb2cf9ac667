#include "model/config.hpp"

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "core/error.hpp"

namespace gpt2 {

long long GPT2Config::num_params() const {
  // In 128 bits, clamped: a corrupt checkpoint header (found by fuzz_checkpoint) or an absurd option
  // may ask for n_embd ~ 2^31 and n_layer ~ 2^31, whose count overflows 64 bits.
  using Wide = __int128;
  const Wide C = n_embd, L = n_layer;
  const Wide per_block = 2 * C            // ln_1
                         + C * 3 * C + 3 * C  // c_attn
                         + C * C + C          // attn.c_proj
                         + 2 * C              // ln_2
                         + C * 4 * C + 4 * C  // c_fc
                         + 4 * C * C + C;     // mlp.c_proj
  const Wide n = static_cast<Wide>(vocab_size) * C + static_cast<Wide>(max_seq_len) * C + L * per_block + 2 * C;
  return n > static_cast<Wide>(LLONG_MAX) ? LLONG_MAX : static_cast<long long>(n);
}

std::string GPT2Config::validate() const {
  if (n_layer <= 0) return "n_layer must be positive (got " + std::to_string(n_layer) + ")";
  if (n_head <= 0) return "n_head must be positive (got " + std::to_string(n_head) + ")";
  if (n_embd <= 0) return "n_embd must be positive (got " + std::to_string(n_embd) + ")";
  if (n_embd % n_head != 0)
    return "n_head (" + std::to_string(n_head) + ") must divide n_embd (" + std::to_string(n_embd) + ")";
  if (vocab_size <= 0) return "vocab_size must be positive (got " + std::to_string(vocab_size) + ")";
  if (max_seq_len <= 0) return "max_seq_len must be positive (got " + std::to_string(max_seq_len) + ")";
  return "";
}

std::string GPT2Config::describe() const {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "L%d H%d C%d V%d maxT%d (%.2fM params)", n_layer, n_head, n_embd, vocab_size,
                max_seq_len, num_params() / 1e6);
  return buf;
}

double GPT2Config::flops_per_token(int seq_len) const {
  return 6.0 * static_cast<double>(num_params()) + 6.0 * n_layer * n_embd * static_cast<double>(seq_len);
}

bool apply_model_preset(const std::string& name, GPT2Config* cfg) {
  struct Preset {
    const char* name;
    int L, NH, C;
  };
  static const Preset presets[] = {
      {"gpt2-124m", 12, 12, 768},
      {"gpt2-350m", 24, 16, 1024},
      {"gpt2-774m", 36, 20, 1280},
      {"gpt2-1558m", 48, 25, 1600},
  };
  for (const auto& p : presets) {
    if (name == p.name) {
      cfg->n_layer = p.L;
      cfg->n_head = p.NH;
      cfg->n_embd = p.C;
      return true;
    }
  }
  if (name.size() >= 2 && name[0] == 'd') {
    char* end = nullptr;
    long n = std::strtol(name.c_str() + 1, &end, 10);
    if (*end == '\0' && n > 0 && n <= 1000) {
      cfg->n_layer = static_cast<int>(n);
      cfg->n_head = static_cast<int>(n);
      cfg->n_embd = static_cast<int>(64 * n);
      return true;
    }
  }
  return false;
}

std::string model_preset_names() { return "gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, d<N> (L=N, H=N, C=64N)"; }

KeptLayers kept_layers(int L, Recompute r) {
  const size_t all = static_cast<size_t>(L);
  return {r == Recompute::kNone ? all : 1, r == Recompute::kNone ? all : 1, r == Recompute::kFull ? 1 : all};
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

}  // namespace gpt2
