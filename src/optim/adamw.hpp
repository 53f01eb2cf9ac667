// AdamW over parameter segments of a flat buffer, with global-norm gradient clipping. The optimizer
// knows nothing of the model: it is given the tensors as segments (offset, size, decay) and the runs of
// the buffer this rank owns (all of it, or a ZeRO-1 shard), and keeps moments for those runs only.
#pragma once

#include <vector>

#include "core/param_segment.hpp"

namespace gpt2 {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied only to segments with ParamSegment::decay (2-D weights, embeddings)
  float grad_clip = 1.0f;     // max global L2 norm of the gradient; 0 disables clipping
};

// Factor that torch.nn.utils.clip_grad_norm_ multiplies gradients by: min(1, max_norm / (norm + 1e-6)).
float clip_factor(double grad_norm, float max_norm);

class AdamW {
 public:
  // segments: every parameter tensor of the flat buffer. owned: the runs of it this rank updates,
  // ascending and disjoint ({0, total}: all of it; a ZeRO-1 shard: one piece per bucket). Elements of
  // an owned run that no segment covers (alignment gaps) are never updated and keep zero moments.
  AdamW(std::vector<ParamSegment> segments, std::vector<FlatRange> owned, const AdamWConfig& cfg);

  // One update of the owned parameters with learning rate lr; gradients are multiplied by grad_scale
  // (the clipping factor) first. params and grads are the whole flat buffers. Increments the step count.
  void step(float* params, const float* grads, float lr, float grad_scale);

  const AdamWConfig& config() const { return cfg_; }
  long step_count() const { return t_; }
  void set_step_count(long t) { t_ = t; }
  const std::vector<FlatRange>& owned() const { return owned_; }
  // The moments of the owned runs, concatenated in order. With one run {0, total} this is the flat
  // layout of the buffer itself.
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }
  // Between the owned runs and buffers in the flat layout (checkpoints): export writes only the owned
  // runs of m_flat and v_flat; import reads only them.
  void export_moments(float* m_flat, float* v_flat) const;
  void import_moments(const float* m_flat, const float* v_flat);

 private:
  AdamWConfig cfg_;
  std::vector<FlatRange> owned_;
  std::vector<OwnedPiece> pieces_;
  std::vector<float> m_, v_;
  long t_ = 0;
};

}  // namespace gpt2
