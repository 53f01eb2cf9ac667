// Checkpoint write and read: what a run waits for at every --ckpt-every, and what --resume costs. A
// checkpoint holds the parameters and Adam's m and v in fp32, each tensor with its CRC-32 attribute
// (src/core/hdf5.cpp); a write includes the sums, the fsync and the rename, a read the CRC-32 and NaN/Inf
// checks (not the --resume auto probe, which reads a candidate once more).
//
//   bench_checkpoint [benchmark flags]      (files go to $TMPDIR, default /tmp; removed at exit)
//
// bytes_per_second: the checkpoint's bytes (3 x 4 bytes a parameter) over the wall time. The preemption
// logic assumes 0.5 GB/s for the first checkpoint of a run (src/train/checkpointer.cpp), then times it.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "model/gpt2.hpp"
#include "optim/adamw.hpp"
#include "train/checkpoint.hpp"

namespace {

namespace fs = std::filesystem;

// One model with its optimizer state, built once per preset.
struct Saved {
  gpt2::GPT2 model;
  std::vector<float> m, v;
  fs::path dir;
  explicit Saved(const gpt2::GPT2Config& c) : model(c) {
    model.init(1);
    m.resize(model.table().total());
    v.resize(model.table().total());
    for (size_t i = 0; i < m.size(); ++i) {  // values of Adam's size and variety, not zeros
      m[i] = 1e-3f * model.params()[i];
      v[i] = 1e-6f * model.params()[i] * model.params()[i];
    }
    dir = fs::temp_directory_path() / ("gpt2_bench_ckpt_" + std::to_string(::getpid()));
    fs::create_directories(dir);
  }
  ~Saved() { fs::remove_all(dir); }
  gpt2::OptimizerState opt() { return gpt2::OptimizerState{gpt2::AdamWConfig{}, 0, m.data(), v.data()}; }
  double bytes() const { return 3.0 * static_cast<double>(model.table().total()) * sizeof(float); }
};

gpt2::GPT2Config config(int64_t arg) {
  gpt2::GPT2Config c;  // vocab 50257, maxT 1024
  gpt2::apply_model_preset(arg == 0 ? "d4" : "gpt2-124m", &c);
  return c;
}

Saved& saved(int64_t arg) {
  static Saved small(config(0)), m124(config(1));
  return arg == 0 ? small : m124;
}

// Arg: 0 = d4 (L4 C256, 16.3M parameters, 196 MB), 1 = gpt2-124m (124.4M parameters, 1.49 GB).
void BM_CheckpointSave(benchmark::State& state) {
  Saved& s = saved(state.range(0));
  gpt2::OptimizerState opt = s.opt();
  gpt2::TrainState ts;
  int64_t step = 0;
  for (auto _ : state) {
    const std::string path = gpt2::checkpoint_path(s.dir.string(), ++step);
    gpt2::save_checkpoint(path, s.model, &opt, ts);
    state.PauseTiming();
    fs::remove(path);
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<int64_t>(s.bytes()) * state.iterations());
  state.counters["params_M"] = static_cast<double>(s.model.table().total()) * 1e-6;
}

void BM_CheckpointLoad(benchmark::State& state) {
  Saved& s = saved(state.range(0));
  gpt2::OptimizerState opt = s.opt();
  const std::string path = gpt2::checkpoint_path(s.dir.string(), 0);
  gpt2::save_checkpoint(path, s.model, &opt, gpt2::TrainState{});
  gpt2::GPT2 back(s.model.config());
  std::vector<float> m(s.m.size()), v(s.v.size());
  gpt2::OptimizerState opt_back{gpt2::AdamWConfig{}, 0, m.data(), v.data()};
  gpt2::TrainState ts;
  for (auto _ : state) benchmark::DoNotOptimize(gpt2::load_checkpoint(path, back, &opt_back, &ts));
  state.SetBytesProcessed(static_cast<int64_t>(s.bytes()) * state.iterations());
  fs::remove(path);
}

BENCHMARK(BM_CheckpointSave)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CheckpointLoad)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
