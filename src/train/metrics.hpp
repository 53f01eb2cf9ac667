// <out>/metrics.jsonl (rank 0): one JSON object per line, as DESIGN.md section 5 describes.
#pragma once

#include <cstdio>
#include <string>

namespace gpt2 {

struct StepMetrics {
  long step = 0;              // 1-based: the optimizer step just completed
  double loss = 0;            // mean training loss over the global batch
  double lr = 0;
  double grad_norm = 0;       // global L2 norm before clipping
  double ms = 0;              // wall time of the step
  double tokens_per_s = 0;    // global
  double mfu = 0;             // fraction of peak (6N + 6LCT flops per token)
  double comm_exposed_ms = 0; // time the optimizer waited for gradient communication
  // Stragglers (multi-rank runs): each rank's busy time is its step time less the communication it
  // waited for; skew = the slowest rank's busy time over the median rank's (1.0: balanced).
  double skew = 1.0;
  int slowest_rank = 0;
};

class MetricsWriter {
 public:
  // Opens <out>/metrics.jsonl; appends when `append`, else truncates. Empty out: no file. With
  // keep_up_to_step >= 0 (resume), lines of later steps (written after that checkpoint by a run that
  // then died) are dropped first, so no step appears twice.
  MetricsWriter(const std::string& out_dir, bool append, long keep_up_to_step = -1);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void step(const StepMetrics& m);
  void val(long step, double val_loss);
  // Any other line, e.g. the benchmark summary; `json_object` must be a complete JSON object.
  void raw(const std::string& json_object);

 private:
  void flush_or_die(int printed);  // printed: fprintf's result
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace gpt2
