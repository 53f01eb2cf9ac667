#include "optim/schedule.hpp"

#include <algorithm>
#include <cmath>

namespace gpt2 {

float LrSchedule::at(long s) const {
  if (s < warmup_steps) return lr * static_cast<float>(s + 1) / static_cast<float>(warmup_steps);
  const float floor_lr = lr * min_lr_frac;
  const double span = std::max<long>(1, max_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(s - warmup_steps) / span);
  switch (kind) {
    case ScheduleKind::kConstant:
      return lr;
    case ScheduleKind::kCosine:
      return static_cast<float>(floor_lr + (lr - floor_lr) * 0.5 * (1.0 + std::cos(M_PI * progress)));
    case ScheduleKind::kLinear:
      return static_cast<float>(lr + (floor_lr - lr) * progress);
    case ScheduleKind::kWsd: {
      const long decay_steps = std::max<long>(1, static_cast<long>(std::lround(decay_frac * max_steps)));
      const long decay_start = std::max(warmup_steps, max_steps - decay_steps);
      if (s < decay_start) return lr;
      const double p = std::min(1.0, static_cast<double>(s - decay_start) / std::max<long>(1, max_steps - decay_start));
      return static_cast<float>(lr + (floor_lr - lr) * p);
    }
  }
  return lr;
}

bool parse_schedule_kind(const std::string& s, ScheduleKind* out) {
  if (s == "cosine") *out = ScheduleKind::kCosine;
  else if (s == "constant") *out = ScheduleKind::kConstant;
  else if (s == "linear") *out = ScheduleKind::kLinear;
  else if (s == "wsd") *out = ScheduleKind::kWsd;
  else return false;
  return true;
}

}  // namespace gpt2
