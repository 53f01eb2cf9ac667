// Where a training step's device time goes (gpt2-train --profile-step N): the device time of each op of
// the step (a GEMM of one kind, the attention backward, the layernorm backward, AdamW ...), summed over
// the layers and micro-steps that run it, with the rate it reached. The CUDA backend fills it from CUDA
// events recorded on its stream at each op's launches (GPT2Cuda::begin_profile); this is the plain
// bookkeeping and the report, so it is tested without a GPU.
#pragma once

#include <string>
#include <vector>

namespace gpt2 {

// One op of the step: every launch under the same name, summed.
struct OpTime {
  std::string name;  // "gemm mlp_up forward (+bias, GELU)", "attention backward"
  std::string kind;  // what the by-kind summary adds it to: "gemm", "attention", "layernorm", ...
  int calls = 0;
  double ms = 0;
  double flops = 0;  // the useful floating-point work, 0 where not counted (memory-bound ops)
  double bytes = 0;  // the bytes it must move at least (each tensor read or written once), 0 where not counted
};

class StepProfile {
 public:
  // One launch (or group of launches) of `name`: its time and work. Launches of a name already seen
  // add to its entry; new names keep the order they first ran in.
  void add(const std::string& name, const std::string& kind, double ms, double flops, double bytes);
  // Device time in the step with no op running: the device waiting for the host (a synchronisation,
  // the host's own work between the model's calls).
  void add_idle(double ms) { idle_ms_ += ms; }

  const std::vector<OpTime>& ops() const { return ops_; }
  double ops_ms() const;
  double idle_ms() const { return idle_ms_; }
  bool empty() const { return ops_.empty(); }

  // The report: one row per op, longest first (calls, ms, share of the device time, TFLOP/s, GB/s),
  // the idle row, the totals against `step_ms` (the step's wall time on the host), and the time and
  // rate of each kind. `heading` is its first line.
  std::string table(const std::string& heading, double step_ms) const;
  // The same as one JSON object (a metrics.jsonl line): {"profile_step":step,"step_ms":..,"device_ms":..,
  // "idle_ms":..,"ops":[{"op":..,"kind":..,"calls":..,"ms":..,"flops":..,"bytes":..}, ...]}, ops in
  // the order they first ran, flops and bytes to a double's precision.
  std::string json(long step, double step_ms) const;

 private:
  std::vector<OpTime> ops_;
  double idle_ms_ = 0;
};

}  // namespace gpt2
