#include "train/metrics.hpp"

#include <cstdio>
#include <fstream>

#include "core/error.hpp"

namespace gpt2 {

MetricsWriter::MetricsWriter(const std::string& out_dir, bool append, long keep_up_to_step) {
  if (out_dir.empty()) return;
  const std::string path = out_dir + "/metrics.jsonl";
  if (append && keep_up_to_step >= 0) {
    std::ifstream in(path);
    std::string line, kept;
    while (std::getline(in, line)) {
      long step = -1;
      if (std::sscanf(line.c_str(), "{\"step\":%ld", &step) == 1 && step > keep_up_to_step) continue;
      kept += line + "\n";
    }
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::trunc) << kept;
    GPT2_REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rewrite " << path);
  }
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  GPT2_REQUIRE(f_ != nullptr, "cannot open " << path << " for writing");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::step(const StepMetrics& m) {
  if (!f_) return;
  std::fprintf(f_,
               "{\"step\":%ld,\"loss\":%.9g,\"lr\":%.6e,\"grad_norm\":%.9g,\"ms\":%.3f,\"tokens_per_s\":%.1f,"
               "\"mfu\":%.5f,\"comm_exposed_ms\":%.3f}\n",
               m.step, m.loss, m.lr, m.grad_norm, m.ms, m.tokens_per_s, m.mfu, m.comm_exposed_ms);
  std::fflush(f_);
}

void MetricsWriter::val(long step, double val_loss) {
  if (!f_) return;
  std::fprintf(f_, "{\"step\":%ld,\"val_loss\":%.9g}\n", step, val_loss);
  std::fflush(f_);
}

void MetricsWriter::raw(const std::string& json_object) {
  if (!f_) return;
  std::fprintf(f_, "%s\n", json_object.c_str());
  std::fflush(f_);
}

}  // namespace gpt2
