// Causal flash attention, GPT-2 124M shapes (T=1024, C=768, NH=12, hs=64) at B*T = 8192 and 65536.
// TFLOP/s counts causal flops as FlashAttention reports them: forward 2 matmuls over half the T x T
// scores, 2 * 2 * B * NH * T * T * hs / 2; backward 2.5x that (the recomputation of S is not counted,
// nor the second recomputation of S and dP that recompute-dq adds). GB/s counts each tensor read or
// written once. The second argument 1 forces the fp32 SIMT fallback (for comparison); the forward's third
// is its kernel: 0 mma.sync, 1 wgmma + TMA (compute capability 9.0; elsewhere it runs mma.sync, and the
// benchmark says so in its label); the backward's third is its path: 0 recompute-dq (7 products), 1
// accumulate-dq (5 products, key tiles in turns), 2 wgmma + TMA (accumulate-dq's scheme on compute
// capability 9.0; elsewhere recompute-dq runs, and the label says so), 3 store-ds (5 products: dS stored
// by the dK/dV launch and read back by a dQ launch; its 2 bytes a causal score are not in the GB/s); see
// AttentionBackwardPath.
// AttentionTileOrder/bf16/<fwd|bwd>/<one_head|all_heads>/B:<B> run the default kernels (mma.sync forward,
// recompute-dq backward) with their blocks in another order (tile_order.hpp): each head alone, its tiles
// heaviest first (the forward's order before groups; the backward then ran a head's key tiles before its
// query tiles, which the model says is within 0.3% of this), or one rank order over every head (the
// backward's default since 2026-11-27); bench_table.py gives each against the default row.
// AttentionQkvBiasGrad/bf16/<bias_kernel|attention_sums>/B:<B>: the default backward (recompute-dq) and the qkv
// projection's bias gradient after it, by the bias kernel's pass over dqkv (the default) or from the column
// sums the attention's blocks took as they stored dqkv (GPT2_ATTENTION_BIAS_SUMS=on: a row of 3C fp32 a 64-row
// tile, then column_sums_add_cuda); the kernel table sets the second against the first.
//   bench_gpu_kernels --benchmark_filter=attention
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention/attention_cuda.hpp"
#include "kernels/common/device_buffer.hpp"
#include "kernels/gemm/gemm_cuda.hpp"
#include "kernels/reduce/reduce_cuda.hpp"
#include "tools/bench/gpu/gpu_bench_util.hpp"

namespace gpt2 {
namespace {

constexpr int kT = 1024, kC = 768, kNH = 12;

// Uniform values in [-scale, scale) from a fixed LCG: random data without the cost of normals at 150M elements.
std::vector<float> lcg_values(size_t n, uint32_t seed, float scale) {
  std::vector<float> v(n);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = scale * (static_cast<float>(s >> 40) / static_cast<float>(1ull << 23) - 1.0f);
  }
  return v;
}

double forward_flops(int B) {
  return 2.0 * 2.0 * B * kNH * static_cast<double>(kT) * kT * (kC / kNH) / 2.0;
}

struct AttentionBuffers {
  explicit AttentionBuffers(int B)
      : out(static_cast<size_t>(B) * kT * kC),
        dqkv(static_cast<size_t>(B) * kT * 3 * kC),
        lse(static_cast<size_t>(B) * kNH * kT),
        scratch(kernels::attention_backward_scratch_bytes(B, kT, kC, kNH)) {
    qkv.upload(lcg_values(static_cast<size_t>(B) * kT * 3 * kC, 1, 1.7f));
    dout.upload(lcg_values(static_cast<size_t>(B) * kT * kC, 2, 1.7f));
  }
  DeviceBuffer<bf16> qkv, out, dout, dqkv;
  DeviceBuffer<float> lse;
  DeviceBuffer<char> scratch;
};

// The attention paths as they were before a benchmark chose its own: put back when it ends, in an error
// too, so that the next benchmark measures the path its name says.
struct AttentionPathsRestored {
  kernels::AttentionForwardPath forward = kernels::attention_forward_path();
  kernels::AttentionBackwardPath backward = kernels::attention_backward_path();
  ~AttentionPathsRestored() {
    kernels::attention_force_generic(false);
    kernels::attention_set_tile_group_heads(0);
    kernels::attention_set_forward_path(forward);
    kernels::attention_set_backward_path(backward);
  }
};

// B, the SIMT fallback or not, the kernel (0 mma.sync, 1 wgmma, 2 wgmma ping-pong), heads a group of the
// mma.sync kernel's block order (0: the default)
void forward_bf16(benchmark::State& state, int B, bool generic, int path, int group_heads) try {
  const AttentionPathsRestored restored;
  kernels::attention_force_generic(generic);
  kernels::attention_set_tile_group_heads(group_heads);
  const kernels::AttentionForwardPath paths[3] = {kernels::AttentionForwardPath::kMmaSync,
                                                  kernels::AttentionForwardPath::kWgmma,
                                                  kernels::AttentionForwardPath::kWgmmaPingPong};
  const bool wgmma = path != 0;
  kernels::attention_set_forward_path(paths[path]);
  if (wgmma && !kernels::attention_fwd_wgmma_available()) state.SetLabel("wgmma unavailable: mma.sync ran");
  AttentionBuffers buf(B);
  const double bytes = 2.0 * B * kT * (3 * kC + kC) + 4.0 * B * kNH * kT;
  bench::time_launches(
      state,
      [&](cudaStream_t s) {
        kernels::attention_forward_cuda<bf16>(buf.out.data(), buf.lse.data(), buf.qkv.data(), B, kT, kC, kNH, s);
      },
      forward_flops(B), bytes);
} catch (...) {
  gpt2::bench::error_row(state);
}

// B, the SIMT fallback or not, the path (0 recompute-dq, 1 accumulate-dq, 2 wgmma, 3 store-ds, 4 wgmma-store-ds),
// heads a group
// of the mma.sync kernel's block order (0: the default)
void backward_bf16(benchmark::State& state, int B, bool generic, int path, int group_heads) try {
  const AttentionPathsRestored restored;
  kernels::attention_force_generic(generic);
  kernels::attention_set_tile_group_heads(group_heads);
  const kernels::AttentionBackwardPath paths[5] = {
      kernels::AttentionBackwardPath::kRecomputeDq, kernels::AttentionBackwardPath::kAccumulateDq,
      kernels::AttentionBackwardPath::kWgmma, kernels::AttentionBackwardPath::kStoreDs,
      kernels::AttentionBackwardPath::kWgmmaStoreDs};
  kernels::attention_set_backward_path(paths[path]);
  if (path == 2 && !kernels::attention_bwd_wgmma_available())
    state.SetLabel("wgmma unavailable: recompute-dq ran");
  if (path == 4 && !kernels::attention_bwd_wgmma_available()) state.SetLabel("wgmma unavailable: store-ds ran");
  AttentionBuffers buf(B);
  kernels::attention_forward_cuda<bf16>(buf.out.data(), buf.lse.data(), buf.qkv.data(), B, kT, kC, kNH, nullptr);
  // reads dout, qkv, out, lse; writes dqkv; D written and read once
  const double bytes = 2.0 * B * kT * (kC + 3 * kC + kC + 3 * kC) + 4.0 * B * kNH * kT * 3;
  bench::time_launches(
      state,
      [&](cudaStream_t s) {
        kernels::attention_backward_cuda<bf16>(buf.dqkv.data(), buf.scratch.data(), buf.dout.data(), buf.qkv.data(),
                                               buf.out.data(), buf.lse.data(), B, kT, kC, kNH, s);
      },
      2.5 * forward_flops(B), bytes);
} catch (...) {
  gpt2::bench::error_row(state);
}

// The backward and the qkv bias gradient after it: by the bias kernel over dqkv, or from the attention's sums.
void qkv_bias_grad_bf16(benchmark::State& state, int B, bool attention_sums) try {
  const AttentionPathsRestored restored;
  kernels::attention_set_backward_path(kernels::AttentionBackwardPath::kRecomputeDq);
  AttentionBuffers buf(B);
  kernels::attention_forward_cuda<bf16>(buf.out.data(), buf.lse.data(), buf.qkv.data(), B, kT, kC, kNH, nullptr);
  const int N = B * kT;
  DeviceBuffer<bf16> dbias(3 * kC);
  dbias.zero();
  DeviceBuffer<char> sums(attention_sums ? kernels::attention_bias_chunks_bytes(B, kT, kC)
                                         : kernels::bias_backward_scratch_bytes(N, 3 * kC));
  const double bytes = 2.0 * B * kT * (kC + 3 * kC + kC + 3 * kC) + 4.0 * B * kNH * kT * 3;
  int rows = 0;
  bench::time_launches(
      state,
      [&](cudaStream_t s) {
        float* chunks = attention_sums ? reinterpret_cast<float*>(sums.data()) : nullptr;
        rows =
            kernels::attention_backward_cuda<bf16>(buf.dqkv.data(), buf.scratch.data(), buf.dout.data(), buf.qkv.data(),
                                                   buf.out.data(), buf.lse.data(), B, kT, kC, kNH, s, chunks);
        if (rows > 0)
          kernels::column_sums_add_cuda<bf16>(dbias.data(), nullptr, 3 * kC, chunks, rows, 3 * kC, s);
        else
          kernels::bias_backward_cuda<bf16>(dbias.data(), sums.data(), buf.dqkv.data(), N, 3 * kC, s);
      },
      2.5 * forward_flops(B), bytes);
  if (attention_sums && rows == 0) state.SetLabel("the path took no sums: the bias kernel ran");
} catch (...) {
  gpt2::bench::error_row(state);
}

void BM_attention_forward_bf16(benchmark::State& state) {
  forward_bf16(state, static_cast<int>(state.range(0)), state.range(1) != 0, static_cast<int>(state.range(2)), 0);
}
void BM_attention_backward_bf16(benchmark::State& state) {
  backward_bf16(state, static_cast<int>(state.range(0)), state.range(1) != 0, static_cast<int>(state.range(2)), 0);
}

// {B, force_generic, path}: B*T = 8192 and 65536 on the tensor cores (forward: mma.sync, wgmma, wgmma
// ping-pong; backward: recompute-dq, accumulate-dq, wgmma, store-ds, wgmma-store-ds); the SIMT fallback at 8192
// for reference.
BENCHMARK(BM_attention_forward_bf16)
    ->Args({8, 0, 0})
    ->Args({64, 0, 0})
    ->Args({8, 0, 1})
    ->Args({64, 0, 1})
    ->Args({8, 0, 2})
    ->Args({64, 0, 2})
    ->Args({8, 1, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_attention_backward_bf16)
    ->Args({8, 0, 0})
    ->Args({64, 0, 0})
    ->Args({8, 0, 1})
    ->Args({64, 0, 1})
    ->Args({8, 0, 2})
    ->Args({64, 0, 2})
    ->Args({8, 0, 3})
    ->Args({64, 0, 3})
    ->Args({8, 0, 4})
    ->Args({64, 0, 4})
    ->Args({8, 1, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

const bool kQkvBiasGradRegistered = [] {
  for (int B : {8, 16})
    for (bool sums : {false, true}) {
      const std::string name = std::string("AttentionQkvBiasGrad/bf16/") + (sums ? "attention_sums" : "bias_kernel") +
                               "/B:" + std::to_string(B);
      benchmark::RegisterBenchmark(name.c_str(), qkv_bias_grad_bf16, B, sums)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  return true;
}();

const bool kTileOrdersRegistered = [] {
  constexpr int kAllHeads = 1 << 20;  // more than any B * NH here: one group
  for (int B : {8, 64})
    for (bool backward : {false, true})
      for (int group_heads : {1, kAllHeads}) {
        const std::string name = std::string("AttentionTileOrder/bf16/") + (backward ? "bwd/" : "fwd/") +
                                 (group_heads == 1 ? "one_head" : "all_heads") + "/B:" + std::to_string(B);
        benchmark::RegisterBenchmark(name.c_str(), backward ? backward_bf16 : forward_bf16, B, false, 0, group_heads)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
  return true;
}();

}  // namespace
}  // namespace gpt2
