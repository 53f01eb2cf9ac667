#include "train/memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "model/gpt2.hpp"

namespace gpt2 {

std::string format_bytes(double bytes) {
  char buf[48];
  if (bytes >= 1024.0 * 1024 * 1024 * 1024) std::snprintf(buf, sizeof(buf), "%.3g TiB", bytes / (1024.0 * 1024 * 1024 * 1024));
  else if (bytes >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  else if (bytes >= 1024.0 * 1024) std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1024.0 * 1024));
  else std::snprintf(buf, sizeof(buf), "%.1f KiB", bytes / 1024.0);
  return buf;
}

std::string MemoryEstimate::describe() const {
  return "parameters " + format_bytes(params) + " + gradients " + format_bytes(grads) + " + optimizer " +
         format_bytes(optimizer) + " + activations " + format_bytes(activations) + " + batches " +
         format_bytes(batches) + " = " + format_bytes(total());
}

namespace {

// The exact parameter count of ParamTable (padding and 64-float alignment included) would need the
// table, whose size_t offsets overflow for absurd widths; the count in double differs by < 1%.
double approx_param_count(const GPT2Config& m) {
  const double C = m.n_embd, L = m.n_layer;
  return static_cast<double>(m.padded_vocab_size()) * C + static_cast<double>(m.max_seq_len) * C +
         L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
}

}  // namespace

MemoryEstimate estimate_device_memory(const GPT2Config& m, int micro_batch, int seq_len, bool bf16, Recompute recompute,
                                      double workspace_bytes) {
  const double n = approx_param_count(m), elem = bf16 ? 2.0 : 4.0;
  const double L = m.n_layer, C = m.n_embd, NH = m.n_head, Vp = m.padded_vocab_size();
  const double BT = static_cast<double>(micro_batch) * seq_len, f32 = sizeof(float);
  // Layers of each kind kept, as in both models (GPT2::activation_bytes, GPT2Cuda's ensure_activations).
  const KeptLayers k = kept_layers(m.n_layer, recompute);
  const double ln = k.ln, gelu = k.gelu, inner = k.inner;
  MemoryEstimate e;
  e.params = n * elem + (bf16 ? n * f32 : 0.0);
  e.grads = n * elem;
  e.optimizer = 2.0 * n * f32;
  e.activations = ln * BT * C * 2 * elem                              // ln1, ln2
                  + gelu * BT * 4 * C * elem                          // fch_gelu
                  + inner * (BT * (3 * C + C + C + 4 * C) * elem      // qkv, atty, residual2, fch
                             + BT * NH * f32 + BT * 2 * f32)          // lse, ln2 mean/rstd
                  + L * (BT * C * elem + BT * 2 * f32)                // residual3, ln1 mean/rstd
                  + BT * (C * 2 + Vp + C * 2 + 3 * C + 4 * C) * elem  // encoded, lnf, logits, btc,
                                                                      // dresidual, dqkv, dbt4c
                  + BT * 3 * f32;                                     // lnf mean/rstd, losses
  e.activations += workspace_bytes;
  return e;
}

MemoryEstimate estimate_training_memory(const GPT2Config& m, int micro_batch, int seq_len, int64_t seqs_per_rank,
                                        bool on_gpu, Recompute recompute, int optimizer_shards) {
  const double n = approx_param_count(m);
  MemoryEstimate e;
  e.params = n * sizeof(float);
  e.grads = n * sizeof(float);
  e.optimizer = 2.0 * n * sizeof(float) / std::max(1, optimizer_shards);
  e.activations = on_gpu ? 0.0 : GPT2::activation_bytes(m, micro_batch, seq_len, recompute);
  e.batches = 2.0 * static_cast<double>(seqs_per_rank) * (seq_len + 1.0) * sizeof(int32_t) +
              2.0 * static_cast<double>(micro_batch) * seq_len * sizeof(int32_t);
  return e;
}

double available_host_memory() {
  std::ifstream is("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (is >> key >> kb) {
    std::getline(is, unit);
    if (key == "MemAvailable:") return kb * 1024.0;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * page : 0.0;
}

}  // namespace gpt2
