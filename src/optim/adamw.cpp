#include "optim/adamw.hpp"

#include <cstring>

#include "kernels/adamw/adamw.hpp"

namespace gpt2 {

float clip_factor(double grad_norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double f = static_cast<double>(max_norm) / (grad_norm + 1e-6);
  return f < 1.0 ? static_cast<float>(f) : 1.0f;
}

AdamW::AdamW(std::vector<ParamSegment> segments, std::vector<FlatRange> owned, const AdamWConfig& cfg)
    : cfg_(cfg), owned_(std::move(owned)), pieces_(owned_pieces(std::move(segments), owned_)) {
  m_.assign(total_size(owned_), 0.0f);
  v_.assign(total_size(owned_), 0.0f);
}

void AdamW::step(float* params, const float* grads, float lr, float grad_scale) {
  ++t_;
  for (const OwnedPiece& p : pieces_) {
    kernels::AdamWStep s{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, p.decay ? cfg_.weight_decay : 0.0f, grad_scale, t_};
    kernels::adamw_update_cpu(params + p.flat, grads + p.flat, m_.data() + p.local, v_.data() + p.local,
                              static_cast<long>(p.size), s);
  }
}

void AdamW::export_moments(float* m_flat, float* v_flat) const {
  size_t local = 0;
  for (const FlatRange& r : owned_) {
    std::memcpy(m_flat + r.begin, m_.data() + local, r.size() * sizeof(float));
    std::memcpy(v_flat + r.begin, v_.data() + local, r.size() * sizeof(float));
    local += r.size();
  }
}

void AdamW::import_moments(const float* m_flat, const float* v_flat) {
  size_t local = 0;
  for (const FlatRange& r : owned_) {
    std::memcpy(m_.data() + local, m_flat + r.begin, r.size() * sizeof(float));
    std::memcpy(v_.data() + local, v_flat + r.begin, r.size() * sizeof(float));
    local += r.size();
  }
}

}  // namespace gpt2
