// GPU benchmarks of the memory-bound kernels (GELU, fused softmax + cross-entropy, AdamW, sum of
// squares, scale) at GPT-2 124M shapes (C = 768, V = 50257 padded to 50304) for B*T = 8192 and 65536
// rows. GB/s counts each tensor read and each tensor written once (what HBM must move at least);
// compare it with the device's peak (H100 SXM: 3.35 TB/s).
//   build/bin/bench_gpu_kernels --benchmark_filter='Gelu|Softmax|AdamW|SumSquares|Scale'
// BM_AdamWModel: the 124M step's 148 per-tensor launches against one multi-tensor launch.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/adamw/adamw_cuda.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/gelu/gelu_cuda.hpp"
#include "kernels/reduce/reduce_cuda.hpp"
#include "kernels/softmax_xent/softmax_xent_cuda.hpp"
#include "tools/bench/gpu/gpu_bench_util.hpp"

namespace {

using gpt2::bf16;
using gpt2::DeviceBuffer;
namespace k = gpt2::kernels;

constexpr long kC = 768, kL = 12, kV = 50257, kVp = 50304, kMaxT = 1024;
// GPT-2 124M parameters with the padded vocabulary: wte, wpe, 12 blocks, ln_f.
constexpr long kParams = kVp * kC + kMaxT * kC +
                         kL * (4 * kC + 3 * kC * kC + 3 * kC + kC * kC + kC + 4 * kC * kC + 4 * kC + 4 * kC * kC + kC) +
                         2 * kC;
static_assert(kParams == 124475904, "GPT-2 124M with V padded to 50304");

// Device buffer of n elements, zero-filled (no NaN or denormal garbage in the timed inputs).
template <class T>
DeviceBuffer<T> zeros(size_t n) {
  DeviceBuffer<T> b(n);
  b.zero();
  CUDA_CHECK(cudaDeviceSynchronize());
  return b;
}

// GELU over the MLP activation (B*T, 4C).
template <class T>
void BM_GeluForward(benchmark::State& state) try {
  const long n = state.range(0) * 4 * kC;
  auto inp = zeros<T>(n), out = zeros<T>(n);
  gpt2::bench::time_launches(
      state, [&](cudaStream_t s) { k::gelu_forward_cuda<T>(out.data(), inp.data(), n, s); }, 0, 2.0 * n * sizeof(T));
} catch (...) {
  gpt2::bench::error_row(state);
}

// In place, as the model calls it: dinp aliases dout.
template <class T>
void BM_GeluBackward(benchmark::State& state) try {
  const long n = state.range(0) * 4 * kC;
  auto inp = zeros<T>(n), d = zeros<T>(n);
  gpt2::bench::time_launches(
      state, [&](cudaStream_t s) { k::gelu_backward_cuda<T>(d.data(), inp.data(), d.data(), n, s); }, 0,
      3.0 * n * sizeof(T));
} catch (...) {
  gpt2::bench::error_row(state);
}

// Logits (B*T, Vp); range(1) = write_grad.
template <class T>
void BM_SoftmaxXent(benchmark::State& state) try {
  const int N = static_cast<int>(state.range(0));
  const bool write_grad = state.range(1) != 0;
  auto logits = zeros<T>(static_cast<size_t>(N) * kVp);
  auto losses = zeros<float>(N);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 7919L) % kV);
  DeviceBuffer<int32_t> d_targets(N);
  CUDA_CHECK(cudaMemcpy(d_targets.data(), targets.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
  const double logit_bytes = static_cast<double>(N) * kVp * sizeof(T);
  gpt2::bench::time_launches(
      state,
      [&](cudaStream_t s) {
        k::softmax_xent_cuda<T>(losses.data(), logits.data(), d_targets.data(), N, kV, kVp, 1.0f / N, write_grad, s);
      },
      0, logit_bytes * (write_grad ? 2 : 1) + N * (sizeof(float) + sizeof(int32_t)));
} catch (...) {
  gpt2::bench::error_row(state);
}

// One optimizer step over all of GPT-2 124M. bf16: separate bf16 params; fp32: params are the master.
template <class T>
void BM_AdamW(benchmark::State& state) try {
  const long n = kParams;
  auto master = zeros<float>(n), m = zeros<float>(n), v = zeros<float>(n);
  auto grads = zeros<T>(n);
  DeviceBuffer<T> params_buf;
  T* params = reinterpret_cast<T*>(master.data());
  if constexpr (!std::is_same_v<T, float>) {
    params_buf = zeros<T>(n);
    params = params_buf.data();
  }
  const k::AdamWStep step{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10};
  // master, m, v read and written; grads read; params written unless they are the master.
  const double bytes = n * (6.0 * sizeof(float) + sizeof(T) + (std::is_same_v<T, float> ? 0 : sizeof(T)));
  gpt2::bench::time_launches(
      state,
      [&](cudaStream_t s) {
        k::adamw_update_cuda<T>(master.data(), params, grads.data(), m.data(), v.data(), n, step, s);
      },
      0, bytes);
} catch (...) {
  gpt2::bench::error_row(state);
}

// The model's optimizer step as the trainer issues it: 124M's 148 tensors with their own weight
// decay, either one launch per tensor (Arg 0) or one multi-tensor launch over the chunk table (Arg 1).
// Same bytes as BM_AdamW; the difference is the launches and the small tensors' tails.
template <class T>
void BM_AdamWModel(benchmark::State& state) try {
  const bool multi = state.range(0) == 1;
  std::vector<gpt2::OwnedPiece> pieces;
  size_t off = 0;
  auto add = [&](size_t n, bool decay) {
    pieces.push_back({off, off, n, decay});
    off += n;
  };
  add(kVp * kC, true);    // wte
  add(kMaxT * kC, true);  // wpe
  for (long l = 0; l < kL; ++l) {
    for (const auto& [n, decay] : std::vector<std::pair<long, bool>>{{kC, false},          {kC, false},
                                                                     {kC * 3 * kC, true},  {3 * kC, false},
                                                                     {kC * kC, true},      {kC, false},
                                                                     {kC, false},          {kC, false},
                                                                     {kC * 4 * kC, true},  {4 * kC, false},
                                                                     {4 * kC * kC, true},  {kC, false}})
      add(static_cast<size_t>(n), decay);
  }
  add(kC, false);  // ln_f
  add(kC, false);
  const long n = kParams;
  if (static_cast<long>(off) != n) state.SkipWithError("the 124M tensor list does not add up");
  auto master = zeros<float>(n), m = zeros<float>(n), v = zeros<float>(n);
  auto grads = zeros<T>(n), params = zeros<T>(n);
  const std::vector<k::AdamWChunk> chunks = k::adamw_chunks(pieces);
  DeviceBuffer<k::AdamWChunk> d_chunks(chunks.size());
  CUDA_CHECK(cudaMemcpy(d_chunks.data(), chunks.data(), chunks.size() * sizeof(chunks[0]), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
  const k::AdamWStep step{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10};
  const double bytes = n * (6.0 * sizeof(float) + 2.0 * sizeof(T));
  gpt2::bench::time_launches(
      state,
      [&](cudaStream_t s) {
        if (multi) {
          k::adamw_update_multi_cuda<T>(master.data(), params.data(), grads.data(), m.data(), v.data(),
                                        d_chunks.data(), static_cast<int>(chunks.size()), step, s);
          return;
        }
        for (const gpt2::OwnedPiece& p : pieces) {
          k::AdamWStep ps = step;
          if (!p.decay) ps.weight_decay = 0.0f;
          k::adamw_update_cuda<T>(master.data() + p.flat, params.data() + p.flat, grads.data() + p.flat,
                                  m.data() + p.local, v.data() + p.local, static_cast<long>(p.size), ps, s);
        }
      },
      0, bytes);
} catch (...) {
  gpt2::bench::error_row(state);
}

// Global gradient norm: sum of squares over all gradients.
template <class T>
void BM_SumSquares(benchmark::State& state) try {
  const long n = kParams;
  auto x = zeros<T>(n);
  auto scratch = zeros<char>(k::sum_squares_scratch_bytes(n));
  auto result = zeros<double>(1);
  gpt2::bench::time_launches(
      state, [&](cudaStream_t s) { k::sum_squares_cuda<T>(result.data(), scratch.data(), x.data(), n, s); }, 0,
      1.0 * n * sizeof(T));
} catch (...) {
  gpt2::bench::error_row(state);
}

// Gradient clipping: scale all gradients in place.
template <class T>
void BM_Scale(benchmark::State& state) try {
  const long n = kParams;
  auto x = zeros<T>(n);
  gpt2::bench::time_launches(
      state, [&](cudaStream_t s) { k::scale_cuda<T>(x.data(), 0.5f, n, s); }, 0, 2.0 * n * sizeof(T));
} catch (...) {
  gpt2::bench::error_row(state);
}

BENCHMARK_TEMPLATE(BM_GeluForward, bf16)->Arg(8192)->Arg(65536)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_GeluBackward, bf16)->Arg(8192)->Arg(65536)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_SoftmaxXent, bf16)
    ->ArgsProduct({{8192, 65536}, {0, 1}})
    ->ArgNames({"BT", "write_grad"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_AdamW, bf16)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_AdamW, float)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_AdamWModel, bf16)->ArgName("multi")->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_SumSquares, bf16)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_SumSquares, float)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_Scale, bf16)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
