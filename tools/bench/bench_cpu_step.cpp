// One full CPU training step (forward, backward, AdamW) of a small GPT-2, the configuration the
// foundation issue sets the bar at: L=4 H=4 C=128 V=50257 maxT=256, B=4 T=64, 2 threads.
//   build/bin/bench_cpu_step --benchmark_out=step.json --benchmark_out_format=json
// Threads: GPT2_BENCH_THREADS (default 2).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/rng.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/reduce/reduce.hpp"
#include "model/gpt2.hpp"
#include "optim/adamw.hpp"

namespace {

void BM_CpuTrainStep(benchmark::State& state) {
  const int L = static_cast<int>(state.range(0)), C = static_cast<int>(state.range(1));
  const int B = static_cast<int>(state.range(2)), T = static_cast<int>(state.range(3));
  const char* env = std::getenv("GPT2_BENCH_THREADS");
  const int threads = env ? std::atoi(env) : 2;
  gpt2::kernels::set_cpu_threads(threads);
  gpt2::GPT2Config cfg;
  cfg.n_layer = L;
  cfg.n_head = C / 32;
  cfg.n_embd = C;
  cfg.vocab_size = 50257;
  cfg.max_seq_len = 256;
  gpt2::GPT2 model(cfg);
  model.init(1);
  gpt2::AdamW opt(model.table().segments(), {{0, model.table().total()}}, gpt2::AdamWConfig{});
  std::vector<int32_t> tokens(static_cast<size_t>(B) * (T + 1));
  gpt2::Rng rng(7);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
  std::vector<int32_t> in(tokens.begin(), tokens.begin() + B * T), tg(tokens.begin() + 1, tokens.begin() + 1 + B * T);
  for (auto _ : state) {
    model.zero_grad();
    float loss = model.forward_train(in.data(), tg.data(), B, T, 1.0f / (B * T));
    model.backward();
    const double norm = std::sqrt(gpt2::kernels::sum_squares_cpu(model.grads().data(), model.grads().size()));
    opt.step(model.params().data(), model.grads().data(), 1e-4f, gpt2::clip_factor(norm, 1.0f));
    benchmark::DoNotOptimize(loss);
  }
  const double tokens_per_step = static_cast<double>(B) * T;
  state.counters["threads"] = threads;
  state.counters["tokens_per_s"] = benchmark::Counter(tokens_per_step * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["GFLOP_per_s"] = benchmark::Counter(cfg.flops_per_token(T) * tokens_per_step * state.iterations() / 1e9,
                                                     benchmark::Counter::kIsRate);
}
// args: L, C, B, T  (heads = C / 32, so C=128 gives H=4)
BENCHMARK(BM_CpuTrainStep)->Args({4, 128, 4, 64})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

}  // namespace

BENCHMARK_MAIN();
