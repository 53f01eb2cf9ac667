// GPU benchmarks of GPT-2 124M's matrix products (C = 768, Vp = 50304) at B*T = 8192 and 65536 rows,
// bf16, for both GEMM backends: every layer's forward product and both backward products
//   qkv C->3C, attn_proj C->C, mlp_up C->4C (forward with bias+GELU), mlp_down 4C->C (dinp with the GELU
//   gradient), lm_head C->Vp (tied wte: logits = lnf wte^T, dinp = dlogits wte, dwte += dlogits^T lnf).
// TFLOP/s counts 2*M*N*K per product. Target: hand >= 80% of cuBLASLt on each (H100 SXM dense bf16 peak
// is ~989 TFLOP/s; cuBLASLt reaches ~600-750 on these shapes).
//   build/bin/bench_gpu_kernels --benchmark_filter='Gemm'
// Names: Gemm/bf16/<hand|hand_wgmma|hand_wgmma256|hand_wgmma_pingpong|cublaslt>/<layer>/<fwd|dinp|dw>/BT:<rows>;
// hand is mma.sync (the hand backend's kernel on every GPU but compute capability 9.0), hand_wgmma the
// Hopper kernel with 128x128 tiles (GPT2_GEMM_SM90=1), hand_wgmma256 with 128x256 tiles (the hand backend's
// default on 9.0), hand_wgmma_pingpong with 128x128 tiles on the ping-pong schedule (=128x128-pingpong); an
// error row where the device is not compute capability 9.0 or the operands are not TMA-describable.
// The weight and bias gradients together (weight_bias_grad_cuda), as the model runs them: the hand
// backend fused (the bias sums ride on the dW GEMM), hand_unfused (dW GEMM + bias kernel, the test hook)
// and cuBLASLt (dW GEMM + bias kernel where it has no BGRADA for fp32 sums); cublaslt_bgrad_bf16 with bf16 sums
// (GPT2_CUBLASLT_BIAS_GRAD=bf16: BGRADA, else BGRADB on row-ordered layouts), _row_major with BGRADB alone.
// GB/s counts dout read once.
//   WeightBiasGrad/bf16/<hand|hand_wgmma|hand_wgmma256|cublaslt>[_unfused]/<layer>/BT:<rows>
//   WeightBiasGrad/bf16/cublaslt_bgrad_bf16[_row_major]/<layer>/BT:<rows>
// What the epilogue costs: the products that have one (forward: bias, bias+GELU; mlp_down dinp: the GELU
// gradient) again without it, at 8192 rows, for every kernel; phase A's table prints the time ratio.
//   GemmNoEpilogue/bf16/<kernel>/<layer>/<fwd|dinp>/BT:8192
// The 128x128 wgmma kernel's GELU-gradient epilogue with the pre-activations read in the epilogue instead of
// loaded by TMA during the products (the test hook wgmma_aux_from_global): the A/B of that tile.
//   GemmAuxFromGlobal/bf16/hand_wgmma/mlp_down/dinp/BT:<rows>
// The 128x256 wgmma kernel (the hand default on 9.0), whose shared memory has no room for them, without its
// TMA prefetch of them into L2 during the products (the test hook wgmma_no_aux_prefetch): the A/B of that.
//   GemmNoAuxPrefetch/bf16/hand_wgmma256/mlp_down/dinp/BT:<rows>
// The 128x256 wgmma kernel's epilogue with bulk stores (the test hook wgmma_bulk_store, GPT2_GEMM_STORE=bulk):
// every product where they apply (the forwards, the input gradients but mlp_down's GELU gradient), the A/B of it.
//   GemmBulkStore/bf16/hand_wgmma256/<layer>/<fwd|dinp>/BT:<rows>
// MLP down's input gradient with MLP up's bias gradient (gemm_dgelu_bias_grad_cuda) on cuBLASLt: cublaslt is the
// default's GELU gradient's product and then the bias kernel over its result (which the default runs in MLP up's
// weight gradient), cublaslt_bgrad_bf16 the DGELU_BGRAD epilogue with bf16 sums (GPT2_CUBLASLT_BIAS_GRAD=bf16;
// its counter "fused" 0 where cuBLASLt has no algorithm for it). TFLOP/s counts the product.
//   DGeluBiasGrad/bf16/<cublaslt|cublaslt_bgrad_bf16>/mlp_down/dinp/BT:<rows>
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/gemm/gemm_cuda.hpp"
#include "tools/bench/gpu/gpu_bench_util.hpp"

namespace {

using gpt2::bf16;
using gpt2::DeviceBuffer;
namespace k = gpt2::kernels;

constexpr int kC = 768, kVp = 50304;

// Random bf16 (never zeros: zeros run faster than real data). A 1M-element random block is uploaded and
// then copied over the rest on the device, so multi-GB buffers fill quickly.
DeviceBuffer<bf16> random_device(size_t n, uint32_t seed) {
  DeviceBuffer<bf16> d(n);
  if (n == 0) return d;
  const size_t block = std::min(n, size_t{1} << 20);
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<bf16> host(block);
  for (auto& x : host) x = gpt2::from_float_host<bf16>(dist(gen));
  CUDA_CHECK(cudaMemcpy(d.data(), host.data(), block * sizeof(bf16), cudaMemcpyHostToDevice));
  for (size_t done = block; done < n;) {
    const size_t c = std::min(done, n - done);
    CUDA_CHECK(cudaMemcpy(d.data() + done, d.data(), c * sizeof(bf16), cudaMemcpyDeviceToDevice));
    done += c;
  }
  return d;
}

// One context per backend, made on first use (registration runs before main checks for a GPU).
k::GemmContext& context(k::GemmBackend be) {
  static std::unique_ptr<k::GemmContext> ctx[2];
  auto& c = ctx[be == k::GemmBackend::kHand ? 0 : 1];
  if (!c) c = std::make_unique<k::GemmContext>(be);
  return *c;
}

// A benchmark's context with no test hook set: the hooks it sets are cleared when it ends, in an error
// too, so that the next benchmark runs the kernel its name says.
struct HooksCleared {
  explicit HooksCleared(k::GemmContext& c) : ctx(c) { ctx.test_hooks() = k::GemmTestHooks{}; }
  ~HooksCleared() { ctx.test_hooks() = k::GemmTestHooks{}; }
  HooksCleared(const HooksCleared&) = delete;
  HooksCleared& operator=(const HooksCleared&) = delete;
  k::GemmContext& ctx;
};

struct Layer {
  const char* name;
  int in, out;  // linear: IC -> OC; lm_head: C -> Vp
  bool lm_head;
};
const Layer kLayers[] = {{"qkv", kC, 3 * kC, false},
                         {"attn_proj", kC, kC, false},
                         {"mlp_up", kC, 4 * kC, false},
                         {"mlp_down", 4 * kC, kC, false},
                         {"lm_head", kC, kVp, true}};
enum class Pass { kFwd, kDinp, kDw };
const char* pass_name(Pass p) {
  return p == Pass::kFwd ? "fwd" : (p == Pass::kDinp ? "dinp" : "dw");
}

// The product GPT-2 runs for (layer, pass) at `rows` = B*T, with the shapes of A and B as stored.
struct Product {
  int M, N, K;
  bool trans_a, trans_b, accumulate;
  k::GemmEpilogue ep;
};
Product product_for(const Layer& l, Pass p, int rows) {
  if (l.lm_head) {
    switch (p) {
      case Pass::kFwd:
        return {rows, l.out, l.in, false, true, false, k::GemmEpilogue::kNone};  // lnf wte^T
      case Pass::kDinp:
        return {rows, l.in, l.out, false, false, false, k::GemmEpilogue::kNone};  // dlogits wte
      case Pass::kDw:
        return {l.out, l.in, rows, true, false, true, k::GemmEpilogue::kNone};  // dlogits^T lnf
    }
  }
  const bool up = std::string(l.name) == "mlp_up", down = std::string(l.name) == "mlp_down";
  switch (p) {
    case Pass::kFwd:  // inp (rows,IC) @ w (IC,OC) + bias [-> GELU]
      return {rows, l.out, l.in, false, false, false, up ? k::GemmEpilogue::kBiasGelu : k::GemmEpilogue::kBias};
    case Pass::kDinp:  // dout (rows,OC) @ w^T [* gelu'(pre) into the MLP's pre-activation]
      return {rows, l.in, l.out, false, true, false, down ? k::GemmEpilogue::kDGelu : k::GemmEpilogue::kNone};
    case Pass::kDw:  // inp^T (IC,rows) @ dout (rows,OC), accumulated
      return {l.in, l.out, rows, true, false, true, k::GemmEpilogue::kNone};
  }
  return {};
}

// wgmma_kernel: kDefault for the backend's default kernel (the hand backend: mma.sync, so that `hand` names one
// kernel on every device), else the hand wgmma kernel to run.
// strip_epilogue: the same product with GemmEpilogue::kNone (GemmNoEpilogue rows); aux_from_global: the
// test hook wgmma_aux_from_global (GemmAuxFromGlobal rows); no_aux_prefetch: wgmma_no_aux_prefetch
// (GemmNoAuxPrefetch rows); bulk_store: wgmma_bulk_store (GemmBulkStore rows).
void BM_Gemm(benchmark::State& state, k::GemmBackend be, k::GemmWgmmaKernel wgmma_kernel, Layer layer, Pass pass,
             int rows, bool strip_epilogue, bool aux_from_global, bool no_aux_prefetch, bool bulk_store) try {
  const bool wgmma = wgmma_kernel != k::GemmWgmmaKernel::kDefault;
  if (wgmma && !k::gemm_hand_wgmma_available()) {
    state.SkipWithError("the wgmma GEMM needs a compute capability 9.0 device and a build for architecture 90");
    return;
  }
  Product p = product_for(layer, pass, rows);
  if (strip_epilogue) p.ep = k::GemmEpilogue::kNone;
  const size_t mn = static_cast<size_t>(p.M) * p.N;
  auto a = random_device(static_cast<size_t>(p.M) * p.K, 1), b = random_device(static_cast<size_t>(p.K) * p.N, 2);
  auto c = random_device(mn, 3);
  const bool has_bias = p.ep == k::GemmEpilogue::kBias || p.ep == k::GemmEpilogue::kBiasGelu;
  const bool has_aux = p.ep == k::GemmEpilogue::kBiasGelu || p.ep == k::GemmEpilogue::kDGelu;
  auto bias = random_device(has_bias ? p.N : 0, 4), aux = random_device(has_aux ? mn : 0, 5);
  k::GemmContext& ctx = context(be);
  const HooksCleared cleared(ctx);
  if (wgmma) {
    ctx.test_hooks().hand_path = k::GemmHandPath::kWgmma;
    ctx.test_hooks().wgmma_kernel = wgmma_kernel;
    ctx.test_hooks().wgmma_aux_from_global = aux_from_global;
    ctx.test_hooks().wgmma_no_aux_prefetch = no_aux_prefetch;
    ctx.test_hooks().wgmma_bulk_store = bulk_store;
    if (k::gemm_hand_path(ctx, a.data(), b.data(), p.M, p.N, p.K, p.trans_a, p.trans_b) != k::GemmHandPath::kWgmma) {
      state.SkipWithError("the wgmma GEMM does not take these operands (TMA cannot describe them)");
      return;
    }
  } else {
    ctx.test_hooks().hand_path = k::GemmHandPath::kMmaSync;
  }
  if (be == k::GemmBackend::kHand) {
    // the split of K, and where a wgmma product's split tail starts (0: none; gemm_cuda.hpp GemmSplitPlan)
    const k::GemmSplitPlan plan = k::gemm_hand_split_plan<bf16>(
        ctx, p.M, p.N, p.K, wgmma ? k::GemmHandPath::kWgmma : k::GemmHandPath::kMmaSync, p.trans_a, p.ep);
    state.counters["splits"] = plan.splits;
    state.counters["tail_from"] = plan.tail_from;
  }
  gpt2::bench::time_launches(
      state,
      [&](cudaStream_t s) {
        k::gemm_cuda<bf16>(ctx, c.data(), a.data(), b.data(), has_bias ? bias.data() : nullptr,
                           has_aux ? aux.data() : nullptr, p.M, p.N, p.K, p.trans_a, p.trans_b, p.accumulate, p.ep, s);
      },
      2.0 * p.M * p.N * p.K, 0);
} catch (...) {
  gpt2::bench::error_row(state);
}

// wgmma_kernel: kDefault for the backend's default kernel (the hand backend: mma.sync), else the hand wgmma
// kernel to run. bgrad_bf16: cuBLASLt's bias-gradient epilogue with bf16 sums (GPT2_CUBLASLT_BIAS_GRAD=bf16).
void BM_WeightBiasGrad(benchmark::State& state, k::GemmBackend be, k::GemmWgmmaKernel wgmma_kernel, bool unfused,
                       bool bgrad_bf16, bool row_major, Layer layer, int rows) try {
  const bool wgmma = wgmma_kernel != k::GemmWgmmaKernel::kDefault;
  if (wgmma && !k::gemm_hand_wgmma_available()) {
    state.SkipWithError("the wgmma GEMM needs a compute capability 9.0 device and a build for architecture 90");
    return;
  }
  const int IC = layer.in, OC = layer.out;
  auto inp = random_device(static_cast<size_t>(rows) * IC, 1), dout = random_device(static_cast<size_t>(rows) * OC, 2);
  auto dw = random_device(static_cast<size_t>(IC) * OC, 3), dbias = random_device(OC, 4);
  DeviceBuffer<char> scratch(k::weight_bias_grad_scratch_bytes(rows, OC));
  k::GemmContext& ctx = context(be);
  const HooksCleared cleared(ctx);
  ctx.test_hooks().hand_path = wgmma ? k::GemmHandPath::kWgmma : k::GemmHandPath::kMmaSync;
  ctx.test_hooks().wgmma_kernel = wgmma_kernel;
  ctx.test_hooks().unfused_bias_grad = unfused;
  ctx.test_hooks().lt_bias_grad_bf16 = bgrad_bf16;
  ctx.test_hooks().lt_bias_grad_row_major = row_major;
  // 1 when the bias gradient rode along the product (cuBLASLt: an algorithm for the BGRADA epilogue)
  state.counters["fused"] = k::weight_bias_grad_cuda<bf16>(ctx, dw.data(), dbias.data(), scratch.data(), inp.data(),
                                                           dout.data(), rows, IC, OC, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  gpt2::bench::time_launches(
      state,
      [&](cudaStream_t s) {
        k::weight_bias_grad_cuda<bf16>(ctx, dw.data(), dbias.data(), scratch.data(), inp.data(), dout.data(), rows, IC,
                                       OC, s);
      },
      2.0 * IC * OC * rows, 2.0 * (static_cast<double>(rows) * (IC + OC) + 2.0 * IC * OC));
} catch (...) {
  gpt2::bench::error_row(state);
}

// bgrad_bf16: the hook lt_bias_grad_bf16 (DGELU_BGRAD where cuBLASLt has it); without it, the product and then
// bias_backward_cuda over it, the default's two reads.
void BM_DGeluBiasGrad(benchmark::State& state, bool bgrad_bf16, int rows) try {
  const Product p = product_for(kLayers[3] /* mlp_down */, Pass::kDinp, rows);
  const size_t mn = static_cast<size_t>(p.M) * p.N;
  auto a = random_device(static_cast<size_t>(p.M) * p.K, 1), b = random_device(static_cast<size_t>(p.K) * p.N, 2);
  auto c = random_device(mn, 3), pre = random_device(mn, 5), dbias = random_device(p.N, 4);
  DeviceBuffer<char> scratch(std::max(k::weight_bias_grad_scratch_bytes(p.M, p.N), k::bias_backward_scratch_bytes(p.M, p.N)));
  k::GemmContext& ctx = context(k::GemmBackend::kCublasLt);
  const HooksCleared cleared(ctx);
  ctx.test_hooks().lt_bias_grad_bf16 = bgrad_bf16;
  const auto run = [&](cudaStream_t s) {
    const bool fused = k::gemm_dgelu_bias_grad_cuda<bf16>(ctx, c.data(), dbias.data(), scratch.data(), a.data(),
                                                          b.data(), pre.data(), p.M, p.N, p.K, p.trans_a, p.trans_b, s);
    if (!fused) k::bias_backward_cuda<bf16>(dbias.data(), scratch.data(), c.data(), p.M, p.N, s);
    return fused;
  };
  state.counters["fused"] = run(nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  gpt2::bench::time_launches(state, [&](cudaStream_t s) { run(s); }, 2.0 * p.M * p.N * p.K, 0);
} catch (...) {
  gpt2::bench::error_row(state);
}

// The ceiling the hand GEMM is judged against (issue 10: ~800 TFLOP/s on the lent H100): cuBLASLt on
// a square 8192^3 bf16 product, no epilogue. Named Ceiling/... so phase A's kernel table finds it.
void BM_CeilingGemm(benchmark::State& state) try {
  constexpr int n = 8192;
  const size_t nn = static_cast<size_t>(n) * n;
  auto a = random_device(nn, 1), b = random_device(nn, 2), c = random_device(nn, 3);
  k::GemmContext& ctx = context(k::GemmBackend::kCublasLt);
  gpt2::bench::time_launches(
      state,
      [&](cudaStream_t s) {
        k::gemm_cuda<bf16>(ctx, c.data(), a.data(), b.data(), nullptr, nullptr, n, n, n, false, false, false,
                           k::GemmEpilogue::kNone, s);
      },
      2.0 * n * n * n, 0);
} catch (...) {
  gpt2::bench::error_row(state);
}

const bool kRegistered = [] {
  benchmark::RegisterBenchmark("Ceiling/gemm_bf16_cublaslt/8192", BM_CeilingGemm)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  for (int rows : {8192, 65536})
    for (const Layer& l : kLayers)
      for (Pass pass : {Pass::kFwd, Pass::kDinp, Pass::kDw})
        for (int v = 0; v < 5; ++v)
          for (bool strip : {false, true}) {
            if (strip && (rows != 8192 || product_for(l, pass, rows).ep == k::GemmEpilogue::kNone)) continue;
            using W = k::GemmWgmmaKernel;
            const k::GemmBackend be = v == 4 ? k::GemmBackend::kCublasLt : k::GemmBackend::kHand;
            const W wk = v == 1 ? W::k128x128 : v == 2 ? W::k128x256 : v == 3 ? W::k128x128PingPong : W::kDefault;
            const std::string kernel = v == 1   ? "hand_wgmma"
                                       : v == 2 ? "hand_wgmma256"
                                       : v == 3 ? "hand_wgmma_pingpong"
                                                : name_of(be);
            const std::string name = std::string(strip ? "GemmNoEpilogue" : "Gemm") + "/bf16/" + kernel + "/" +
                                     l.name + "/" + pass_name(pass) + "/BT:" + std::to_string(rows);
            benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, be, wk, l, pass, rows, strip, false, false, false)
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
          }
  for (int rows : {8192, 65536}) {
    const std::string name = "GemmAuxFromGlobal/bf16/hand_wgmma/mlp_down/dinp/BT:" + std::to_string(rows);
    benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, k::GemmBackend::kHand, k::GemmWgmmaKernel::k128x128,
                                 kLayers[3] /* mlp_down */, Pass::kDinp, rows, false, true, false, false)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    const std::string np = "GemmNoAuxPrefetch/bf16/hand_wgmma256/mlp_down/dinp/BT:" + std::to_string(rows);
    benchmark::RegisterBenchmark(np.c_str(), BM_Gemm, k::GemmBackend::kHand, k::GemmWgmmaKernel::k128x256,
                                 kLayers[3] /* mlp_down */, Pass::kDinp, rows, false, false, true, false)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (int rows : {8192, 65536})
    for (const Layer& l : kLayers)
      for (Pass pass : {Pass::kFwd, Pass::kDinp}) {
        const Product p = product_for(l, pass, rows);
        if (p.ep == k::GemmEpilogue::kDGelu || p.accumulate) continue;  // stored by the threads either way
        const std::string name = std::string("GemmBulkStore/bf16/hand_wgmma256/") + l.name + "/" + pass_name(pass) +
                                 "/BT:" + std::to_string(rows);
        benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, k::GemmBackend::kHand, k::GemmWgmmaKernel::k128x256, l,
                                     pass, rows, false, false, false, true)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
  for (int rows : {8192, 65536})
    for (bool bgrad_bf16 : {false, true}) {
      const std::string name = std::string("DGeluBiasGrad/bf16/") + (bgrad_bf16 ? "cublaslt_bgrad_bf16" : "cublaslt") +
                               "/mlp_down/dinp/BT:" + std::to_string(rows);
      benchmark::RegisterBenchmark(name.c_str(), BM_DGeluBiasGrad, bgrad_bf16, rows)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  struct WbVariant {
    const char* name;
    k::GemmBackend be;
    bool unfused;
    k::GemmWgmmaKernel wgmma_kernel;
    bool bgrad_bf16 = false;
    bool row_major = false;
  };
  using W = k::GemmWgmmaKernel;
  const WbVariant variants[] = {{"hand", k::GemmBackend::kHand, false, W::kDefault},
                                {"hand_unfused", k::GemmBackend::kHand, true, W::kDefault},
                                {"hand_wgmma", k::GemmBackend::kHand, false, W::k128x128},
                                {"hand_wgmma_unfused", k::GemmBackend::kHand, true, W::k128x128},
                                {"hand_wgmma256", k::GemmBackend::kHand, false, W::k128x256},
                                {"hand_wgmma256_unfused", k::GemmBackend::kHand, true, W::k128x256},
                                {"cublaslt", k::GemmBackend::kCublasLt, false, W::kDefault},
                                {"cublaslt_unfused", k::GemmBackend::kCublasLt, true, W::kDefault},
                                {"cublaslt_bgrad_bf16", k::GemmBackend::kCublasLt, false, W::kDefault, true},
                                {"cublaslt_bgrad_bf16_row_major", k::GemmBackend::kCublasLt, false, W::kDefault, true,
                                 true}};
  for (int rows : {8192, 65536})
    for (const Layer& l : kLayers) {
      if (l.lm_head) continue;  // the tied LM head has no bias
      for (const WbVariant& v : variants) {
        const std::string name =
            std::string("WeightBiasGrad/bf16/") + v.name + "/" + l.name + "/BT:" + std::to_string(rows);
        benchmark::RegisterBenchmark(name.c_str(), BM_WeightBiasGrad, v.be, v.wgmma_kernel, v.unfused, v.bgrad_bf16,
                                     v.row_major, l, rows)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  return true;
}();

}  // namespace
