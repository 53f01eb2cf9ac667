// GPU layernorm benchmarks at GPT-2 shapes in bf16 (124M: C = 768 at B*T = 8192 and 65536; 1.5B:
// C = 1600): forward, forward fused with the residual add, and backward. Layernorm is memory-bound, so
// the yardstick is a plain device-to-device copy (cudaMemcpyAsync) moving the same bytes; the target
// is >= 80% of the copy's bandwidth.
//   GB_per_s       every tensor read or written once, counted once (the backward's fp32 partial sums
//                  in scratch are overhead and not counted)
//   copy_GB_per_s  the copy of the same activation bytes, measured the same way (L2 flushed first)
//   pct_of_copy    100 * GB_per_s / copy_GB_per_s
// The BM_copy_d2d rows report that copy on its own: /N/C/k copies k (N,C) bf16 tensors (k = 1 is the
// forward's traffic, k = 2 the fused forward's and the backward's).
// BM_layernorm_bwd_prefetch_bf16: the backward with each warp's next row in flight while it finishes the
// current one (layernorm_backward_prefetch_rows, the same bits), for phase A's table to set against
// BM_layernorm_bwd_bf16 (2026-12-02: which of the two the backward keeps).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <vector>

#include "gpu_bench_util.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/layernorm/layernorm_cuda.hpp"

namespace gpt2 {
namespace {

// Deterministic values in [-1, 1), cheap to make for 50M elements (no RNG).
void fill(DeviceBuffer<bf16>* buf, size_t n, uint32_t salt) {
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) {
    h[i] = static_cast<float>((static_cast<uint32_t>(i) * 2654435761u + salt) % 1024u) / 512.0f - 1.0f;
  }
  buf->upload(h);
}

// GB/s of a device-to-device copy of `bytes` (read + write counted), L2 flushed before each copy,
// mean over repetitions; cached per size.
double copy_gb_per_s(size_t bytes) {
  static std::map<size_t, double> cache;
  if (auto it = cache.find(bytes); it != cache.end()) return it->second;
  DeviceBuffer<char> src(bytes), dst(bytes);
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s));  // warm-up
  CudaEvent start(true), stop(true);
  constexpr int kReps = 50;
  double total_s = 0;
  for (int r = 0; r < kReps; ++r) {
    bench::flush_l2(s);
    start.record(s);
    CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s));
    stop.record(s);
    CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    total_s += ms / 1e3;
  }
  return cache[bytes] = 2.0 * static_cast<double>(bytes) * kReps / total_s / 1e9;
}

// Adds copy_GB_per_s and pct_of_copy for a copy of `copy_bytes` (after the timed loop).
void compare_with_copy(benchmark::State& state, size_t copy_bytes) {
  const double copy = copy_gb_per_s(copy_bytes);
  state.counters["copy_GB_per_s"] = copy;
  state.counters["pct_of_copy"] = 100.0 * state.counters["GB_per_s"].value / copy;
}

void BM_layernorm_fwd_bf16(benchmark::State& state) try {
  const int N = static_cast<int>(state.range(0)), C = static_cast<int>(state.range(1));
  const size_t n = static_cast<size_t>(N) * C;
  DeviceBuffer<bf16> inp, out(n), w, b;
  DeviceBuffer<float> mean(N), rstd(N);
  fill(&inp, n, 1);
  fill(&w, C, 2);
  fill(&b, C, 3);
  const double act = static_cast<double>(n) * sizeof(bf16);
  const double bytes = 2 * act + 2.0 * C * sizeof(bf16) + 2.0 * N * sizeof(float);
  bench::time_launches(
      state,
      [&](cudaStream_t s) {
        kernels::layernorm_forward_cuda<bf16>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N,
                                              C, s);
      },
      0, bytes);
  compare_with_copy(state, n * sizeof(bf16));
} catch (...) {
  gpt2::bench::error_row(state);
}

void BM_residual_layernorm_fwd_bf16(benchmark::State& state) try {
  const int N = static_cast<int>(state.range(0)), C = static_cast<int>(state.range(1));
  const size_t n = static_cast<size_t>(N) * C;
  DeviceBuffer<bf16> a, b, residual(n), out(n), w, bias;
  DeviceBuffer<float> mean(N), rstd(N);
  fill(&a, n, 1);
  fill(&b, n, 2);
  fill(&w, C, 3);
  fill(&bias, C, 4);
  const double act = static_cast<double>(n) * sizeof(bf16);
  const double bytes = 4 * act + 2.0 * C * sizeof(bf16) + 2.0 * N * sizeof(float);
  bench::time_launches(
      state,
      [&](cudaStream_t s) {
        kernels::residual_layernorm_forward_cuda<bf16>(residual.data(), out.data(), mean.data(), rstd.data(), a.data(),
                                                       b.data(), w.data(), bias.data(), N, C, s);
      },
      0, bytes);
  compare_with_copy(state, 2 * n * sizeof(bf16));
} catch (...) {
  gpt2::bench::error_row(state);
}

void layernorm_bwd_bf16(benchmark::State& state, bool prefetch_rows) try {
  const int N = static_cast<int>(state.range(0)), C = static_cast<int>(state.range(1));
  const size_t n = static_cast<size_t>(N) * C;
  DeviceBuffer<bf16> dinp, dw, db, dout, inp, w;
  DeviceBuffer<float> mean, rstd;
  DeviceBuffer<char> scratch(kernels::layernorm_backward_scratch_bytes(N, C));
  fill(&dinp, n, 1);
  fill(&dout, n, 2);
  fill(&inp, n, 3);
  fill(&dw, C, 4);
  fill(&db, C, 5);
  fill(&w, C, 6);
  mean.upload(std::vector<float>(N, 0.0f));
  rstd.upload(std::vector<float>(N, 1.0f));
  const double act = static_cast<double>(n) * sizeof(bf16);
  // reads dout, inp, dinp; writes dinp; weight read, dweight/dbias read and written; mean, rstd read
  const double bytes = 4 * act + 5.0 * C * sizeof(bf16) + 2.0 * N * sizeof(float);
  struct PrefetchRows {  // off again however the benchmark ends
    explicit PrefetchRows(bool on) { kernels::layernorm_backward_prefetch_rows(on); }
    ~PrefetchRows() { kernels::layernorm_backward_prefetch_rows(false); }
  } prefetch(prefetch_rows);
  bench::time_launches(
      state,
      [&](cudaStream_t s) {
        kernels::layernorm_backward_cuda<bf16>(dinp.data(), dw.data(), db.data(), scratch.data(), dout.data(),
                                               inp.data(), w.data(), mean.data(), rstd.data(), N, C, s);
      },
      0, bytes);
  compare_with_copy(state, 2 * n * sizeof(bf16));
} catch (...) {
  gpt2::bench::error_row(state);
}

void BM_layernorm_bwd_bf16(benchmark::State& state) {
  layernorm_bwd_bf16(state, false);
}
void BM_layernorm_bwd_prefetch_bf16(benchmark::State& state) {
  layernorm_bwd_bf16(state, true);
}

void BM_copy_d2d(benchmark::State& state) try {
  const size_t bytes = static_cast<size_t>(state.range(0)) * state.range(1) * state.range(2) * sizeof(bf16);
  DeviceBuffer<char> src(bytes), dst(bytes);
  bench::time_launches(
      state,
      [&](cudaStream_t s) { CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s)); },
      0, 2.0 * static_cast<double>(bytes));
} catch (...) {
  gpt2::bench::error_row(state);
}

// (N = B*T, C): GPT-2 124M at B=8 and B=64 (T=1024), GPT-2 1.5B at B=8.
void gpt2_shapes(benchmark::internal::Benchmark* b) {
  b->Args({8192, 768})->Args({65536, 768})->Args({8192, 1600});
}
void copy_shapes(benchmark::internal::Benchmark* b) {
  for (int k : {1, 2}) b->Args({8192, 768, k})->Args({65536, 768, k})->Args({8192, 1600, k});
}

BENCHMARK(BM_layernorm_fwd_bf16)->Apply(gpt2_shapes)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_residual_layernorm_fwd_bf16)->Apply(gpt2_shapes)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_layernorm_bwd_bf16)->Apply(gpt2_shapes)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_layernorm_bwd_prefetch_bf16)->Apply(gpt2_shapes)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_copy_d2d)->Apply(copy_shapes)->UseManualTime()->Unit(benchmark::kMicrosecond);
// The bandwidth ceiling every memory-bound kernel is judged against (issue 10: ~3.0 TB/s on the lent
// H100): a 1 GiB device-to-device copy, far beyond L2, read + write counted.
BENCHMARK(BM_copy_d2d)
    ->Name("Ceiling/copy_d2d/1GiB")
    ->Args({1 << 19, 1024, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace gpt2
