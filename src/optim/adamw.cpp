#include "optim/adamw.hpp"

#include "kernels/adamw/adamw.hpp"

namespace gpt2 {

float clip_factor(double grad_norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double f = static_cast<double>(max_norm) / (grad_norm + 1e-6);
  return f < 1.0 ? static_cast<float>(f) : 1.0f;
}

AdamW::AdamW(const ParamTable& table, const AdamWConfig& cfg)
    : table_(table), cfg_(cfg), m_(table.total(), 0.0f), v_(table.total(), 0.0f) {}

void AdamW::step(float* params, const float* grads, float lr, float grad_scale) {
  ++t_;
  for (const ParamInfo& p : table_.params()) {
    kernels::AdamWStep s{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, p.decay ? cfg_.weight_decay : 0.0f, grad_scale, t_};
    kernels::adamw_update_cpu(params + p.offset, grads + p.offset, m_.data() + p.offset, v_.data() + p.offset,
                              static_cast<long>(p.numel), s);
  }
}

}  // namespace gpt2
