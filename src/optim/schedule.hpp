// Learning-rate schedules. Step s counts optimizer steps from 0.
#pragma once

#include <string>

namespace gpt2 {

enum class ScheduleKind {
  kCosine,    // linear warmup, then cosine from lr down to min_lr_frac * lr at max_steps
  kConstant,  // linear warmup, then lr
  kLinear,    // linear warmup, then linear from lr down to min_lr_frac * lr at max_steps
  kWsd,       // warmup-stable-decay: warmup, lr until the last decay_frac of steps, then linear to the floor
};

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::kCosine;
  float lr = 6e-4f;          // peak learning rate
  long warmup_steps = 0;     // lr ramps linearly over these: (s + 1) / warmup_steps * lr
  long max_steps = 1;        // the schedule ends here
  float min_lr_frac = 0.1f;  // floor as a fraction of the peak
  float decay_frac = 0.2f;   // WSD: fraction of max_steps spent decaying

  float at(long step) const;
};

// Parses "cosine", "constant", "linear", "wsd"; returns false if unknown.
bool parse_schedule_kind(const std::string& s, ScheduleKind* out);

}  // namespace gpt2
