#include "train/metrics.hpp"

#include "core/error.hpp"

namespace gpt2 {

MetricsWriter::MetricsWriter(const std::string& out_dir, bool append) {
  if (out_dir.empty()) return;
  const std::string path = out_dir + "/metrics.jsonl";
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  GPT2_REQUIRE(f_ != nullptr, "cannot open " << path << " for writing");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::step(const StepMetrics& m) {
  if (!f_) return;
  std::fprintf(f_,
               "{\"step\":%ld,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"ms\":%.3f,\"tokens_per_s\":%.1f,"
               "\"mfu\":%.5f,\"comm_exposed_ms\":%.3f}\n",
               m.step, m.loss, m.lr, m.grad_norm, m.ms, m.tokens_per_s, m.mfu, m.comm_exposed_ms);
  std::fflush(f_);
}

void MetricsWriter::val(long step, double val_loss) {
  if (!f_) return;
  std::fprintf(f_, "{\"step\":%ld,\"val_loss\":%.6f}\n", step, val_loss);
  std::fflush(f_);
}

void MetricsWriter::raw(const std::string& json_object) {
  if (!f_) return;
  std::fprintf(f_, "%s\n", json_object.c_str());
  std::fflush(f_);
}

}  // namespace gpt2
