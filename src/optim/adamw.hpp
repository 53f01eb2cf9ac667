// AdamW over the flat parameter buffer, with global-norm gradient clipping.
#pragma once

#include <vector>

#include "model/params.hpp"

namespace gpt2 {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied only to tensors with ParamInfo::decay (2-D weights, embeddings)
  float grad_clip = 1.0f;     // max global L2 norm of the gradient; 0 disables clipping
};

// Factor that torch.nn.utils.clip_grad_norm_ multiplies gradients by: min(1, max_norm / (norm + 1e-6)).
float clip_factor(double grad_norm, float max_norm);

class AdamW {
 public:
  AdamW(const ParamTable& table, const AdamWConfig& cfg);

  // One update of every parameter with learning rate lr; gradients are multiplied by grad_scale
  // (the clipping factor) first. Increments the step count used for bias correction.
  void step(float* params, const float* grads, float lr, float grad_scale);

  const AdamWConfig& config() const { return cfg_; }
  long step_count() const { return t_; }
  void set_step_count(long t) { t_ = t; }
  std::vector<float>& m() { return m_; }  // first moments, same layout as the parameters
  std::vector<float>& v() { return v_; }  // second moments
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }

 private:
  const ParamTable& table_;
  AdamWConfig cfg_;
  std::vector<float> m_, v_;
  long t_ = 0;
};

}  // namespace gpt2
