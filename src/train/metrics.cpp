#include "train/metrics.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace gpt2 {

MetricsWriter::MetricsWriter(const std::string& out_dir, bool append, long keep_up_to_step) {
  if (out_dir.empty()) return;
  const std::string path = out_dir + "/metrics.jsonl";
  if (append && keep_up_to_step >= 0) {
    std::ifstream in(path);
    std::string line, kept;
    while (std::getline(in, line)) {
      long step = -1;
      // step lines, and --profile-step's line of a step (written after that step's line)
      if ((std::sscanf(line.c_str(), "{\"step\":%ld", &step) == 1 ||
           std::sscanf(line.c_str(), "{\"profile_step\":%ld", &step) == 1) &&
          step > keep_up_to_step)
        continue;
      kept += line + "\n";
    }
    write_file_atomic(path, kept);  // a full disk must not leave a truncated metrics.jsonl behind
  }
  path_ = path;
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  GPT2_REQUIRE(f_ != nullptr, "cannot open " << path << " for writing: " << os_error_text(errno));
}

void MetricsWriter::flush_or_die(int printed) {
  // fprintf may only buffer: the error (ENOSPC, EIO) shows at fflush. Either way the run stops,
  // naming the file, instead of losing its metrics silently.
  int e = 0;
  if (printed < 0) e = errno != 0 ? errno : EIO;
  if (e == 0 && std::fflush(f_) != 0) e = errno != 0 ? errno : EIO;
  if (e == 0 && std::ferror(f_)) e = EIO;
  if (e != 0) fatal(msg() << "cannot write " << path_ << ": " << os_error_text(e));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::step(const StepMetrics& m) {
  if (!f_) return;
  const int n = std::fprintf(f_,
               "{\"step\":%ld,\"loss\":%.9g,\"lr\":%.6e,\"grad_norm\":%.9g,\"ms\":%.3f,\"tokens_per_s\":%.1f,"
               "\"mfu\":%.5f,\"comm_exposed_ms\":%.3f,\"skew\":%.4f,\"slowest_rank\":%d}\n",
               m.step, m.loss, m.lr, m.grad_norm, m.ms, m.tokens_per_s, m.mfu, m.comm_exposed_ms, m.skew,
               m.slowest_rank);
  flush_or_die(n);
}

void MetricsWriter::val(long step, double val_loss) {
  if (!f_) return;
  // JSON has no NaN or infinity: null (the trainer stops on one before it gets here)
  if (std::isfinite(val_loss))
    flush_or_die(std::fprintf(f_, "{\"step\":%ld,\"val_loss\":%.9g}\n", step, val_loss));
  else
    flush_or_die(std::fprintf(f_, "{\"step\":%ld,\"val_loss\":null}\n", step));
}

void MetricsWriter::raw(const std::string& json_object) {
  if (!f_) return;
  flush_or_die(std::fprintf(f_, "%s\n", json_object.c_str()));
}

}  // namespace gpt2
