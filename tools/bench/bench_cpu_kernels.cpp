// CPU kernel benchmarks at the shapes of the step benchmark (B*T = 256 rows, C = 128, V = 50257),
// so the step time can be broken down. GB/s counts each input read and output written once.
//   build/bin/bench_cpu_kernels --benchmark_out=kernels.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <vector>

#include "core/rng.hpp"
#include "kernels/adamw/adamw.hpp"
#include "kernels/attention/attention.hpp"
#include "kernels/encoder/encoder.hpp"
#include "kernels/gelu/gelu.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/layernorm/layernorm.hpp"
#include "kernels/softmax_xent/softmax_xent.hpp"

namespace {

constexpr int kB = 4, kT = 64, kC = 128, kNH = 4, kV = 50257, kVp = 50304, kN = kB * kT;

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  gpt2::Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal()) * scale;
  return v;
}

void threads_from_env() {
  const char* env = std::getenv("GPT2_BENCH_THREADS");
  gpt2::kernels::set_cpu_threads(env ? std::atoi(env) : 2);
}

void flops(benchmark::State& s, double per_iter) {
  s.counters["GFLOP_per_s"] = benchmark::Counter(per_iter * s.iterations() / 1e9, benchmark::Counter::kIsRate);
}
void bytes(benchmark::State& s, double per_iter) {
  s.counters["GB_per_s"] = benchmark::Counter(per_iter * s.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_LmHeadForward(benchmark::State& s) {
  threads_from_env();
  auto x = randn(size_t{kN} * kC, 1), w = randn(size_t{kVp} * kC, 2, 0.02f);
  std::vector<float> logits(size_t{kN} * kVp);
  for (auto _ : s) gpt2::kernels::lm_head_forward_cpu(logits.data(), x.data(), w.data(), kN, kC, kVp);
  flops(s, 2.0 * kN * kC * kVp);
}

void BM_LmHeadBackward(benchmark::State& s) {
  threads_from_env();
  auto x = randn(size_t{kN} * kC, 1), w = randn(size_t{kVp} * kC, 2, 0.02f), d = randn(size_t{kN} * kVp, 3, 1e-4f);
  std::vector<float> dx(size_t{kN} * kC), dw(size_t{kVp} * kC);
  for (auto _ : s) gpt2::kernels::lm_head_backward_cpu(dx.data(), dw.data(), d.data(), x.data(), w.data(), kN, kC, kVp);
  flops(s, 4.0 * kN * kC * kVp);
}

void BM_SoftmaxXent(benchmark::State& s) {
  threads_from_env();
  auto src = randn(size_t{kN} * kVp, 4);
  std::vector<float> logits(src.size()), losses(kN);
  std::vector<int32_t> targets(kN);
  for (int i = 0; i < kN; ++i) targets[i] = (i * 7919) % kV;
  for (auto _ : s) {
    s.PauseTiming();
    logits = src;
    s.ResumeTiming();
    gpt2::kernels::softmax_xent_cpu(losses.data(), logits.data(), targets.data(), kN, kV, kVp, 1.0f / kN, true);
  }
  bytes(s, 2.0 * 4.0 * kN * kVp);  // read and write the logits
}

void BM_LayernormForward(benchmark::State& s) {
  threads_from_env();
  auto x = randn(size_t{kN} * kC, 5), w = randn(kC, 6), b = randn(kC, 7);
  std::vector<float> out(x.size()), mean(kN), rstd(kN);
  for (auto _ : s)
    gpt2::kernels::layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC);
  bytes(s, 2.0 * 4.0 * kN * kC);
}

void BM_LayernormBackward(benchmark::State& s) {
  threads_from_env();
  auto x = randn(size_t{kN} * kC, 5), w = randn(kC, 6), b = randn(kC, 7), d = randn(size_t{kN} * kC, 8);
  std::vector<float> out(x.size()), mean(kN), rstd(kN), dx(x.size()), dw(kC), db(kC);
  gpt2::kernels::layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC);
  for (auto _ : s)
    gpt2::kernels::layernorm_backward_cpu(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), mean.data(),
                                          rstd.data(), kN, kC);
  bytes(s, 3.0 * 4.0 * kN * kC);
}

void BM_AttentionForward(benchmark::State& s) {
  threads_from_env();
  auto qkv = randn(size_t{kN} * 3 * kC, 9);
  std::vector<float> out(size_t{kN} * kC), att(size_t{kB} * kNH * kT * kT);
  for (auto _ : s) gpt2::kernels::attention_forward_cpu(out.data(), att.data(), qkv.data(), kB, kT, kC, kNH);
  flops(s, 2.0 * kB * kT * kT * kC);  // causal: half of 4 B T^2 C
}

void BM_AttentionBackward(benchmark::State& s) {
  threads_from_env();
  auto qkv = randn(size_t{kN} * 3 * kC, 9), d = randn(size_t{kN} * kC, 10);
  std::vector<float> out(size_t{kN} * kC), att(size_t{kB} * kNH * kT * kT), dqkv(qkv.size());
  gpt2::kernels::attention_forward_cpu(out.data(), att.data(), qkv.data(), kB, kT, kC, kNH);
  for (auto _ : s)
    gpt2::kernels::attention_backward_cpu(dqkv.data(), d.data(), qkv.data(), att.data(), kB, kT, kC, kNH);
  flops(s, 4.0 * kB * kT * kT * kC);
}

void BM_Gelu(benchmark::State& s) {
  threads_from_env();
  auto x = randn(size_t{kN} * 4 * kC, 11);
  std::vector<float> y(x.size());
  for (auto _ : s) gpt2::kernels::gelu_forward_cpu(y.data(), x.data(), static_cast<long>(x.size()));
  bytes(s, 2.0 * 4.0 * x.size());
}

void BM_AdamW(benchmark::State& s) {
  threads_from_env();
  const long n = static_cast<long>(kVp) * kC + 4L * 12 * kC * kC;  // about the step benchmark's parameters
  auto p = randn(n, 12, 0.02f), g = randn(n, 13, 1e-3f);
  std::vector<float> m(n), v(n);
  long t = 0;
  for (auto _ : s)
    gpt2::kernels::adamw_update_cpu(p.data(), g.data(), m.data(), v.data(), n,
                                    {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, ++t});
  bytes(s, 7.0 * 4.0 * n);  // read p, g, m, v; write p, m, v
}

// The host side of the GPU step's encoder backward (encoder_backward_plan: the positions grouped by token), for
// a GPU micro-batch of B*T tokens (arg: 8192, 16384 = 124M at micro-batch 16, 65536), GPT-2 ids uniform over
// the vocabulary. The device waits for it at the start of every step, so its time is the step's.
void BM_encoder_backward_plan(benchmark::State& s) {
  const int n = static_cast<int>(s.range(0));
  gpt2::Rng rng(5);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = static_cast<int32_t>(rng.next_u64() % kV);
  std::vector<int32_t> plan;
  for (auto _ : s) benchmark::DoNotOptimize(gpt2::kernels::encoder_backward_plan(tokens.data(), n, &plan));
  s.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(n) * s.iterations(), benchmark::Counter::kIsRate);
}

BENCHMARK(BM_LmHeadForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LmHeadBackward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SoftmaxXent)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AdamW)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LayernormForward)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_LayernormBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_AttentionForward)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_AttentionBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Gelu)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_encoder_backward_plan)->Arg(8192)->Arg(16384)->Arg(65536)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
