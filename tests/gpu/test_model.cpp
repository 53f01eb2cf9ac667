// A full training step on the GPU against the CPU backend (the executable specification):
//   fp32: loss to 1e-5 relative, every gradient tensor to 1e-4 (norm-wise relative), AdamW update to 1e-5;
//   bf16: loss to 1e-2 relative, gradients correlated with the CPU's (cosine > 0.99);
//   the GPU step repeats bit for bit; += gradient accumulation over micro-steps; both GEMM backends;
//   --recompute selective|full gives the gradients of --recompute none.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/rng.hpp"
#include "kernels/attention/attention_cuda.hpp"
#include "kernels/common/device_buffer.hpp"
#include "kernels/common/kernel_paths.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/gemm/gemm.hpp"
#include "model/gpt2.hpp"
#include "model/gpt2_cuda.hpp"
#include "optim/adamw.hpp"

namespace gpt2 {
namespace {

struct Case {
  const char* name;
  int L, NH, C, V, maxT, B, T;
};
// Awkward first (C=72, 3 heads of 24, T=37, B=3, a vocabulary that is not a multiple of 128), then
// head size 64 as in every GPT-2 preset, then the paths the first two never reach: B*T = 2048 rows
// (split-K weight gradients), C=66 (scalar kernel paths, rows not a multiple of a 128-bit vector) and
// V=301 (the softmax chunk that straddles the vocabulary's end).
const Case kCases[] = {{"awkward", 2, 3, 72, 300, 64, 3, 37},
                       {"hs64", 2, 2, 128, 256, 128, 2, 64},
                       {"splitk_scalar", 1, 2, 66, 301, 64, 32, 64}};

struct Param {
  Precision precision;
  kernels::GemmBackend gemm;
};

std::string param_name(const testing::TestParamInfo<Param>& p) {
  return std::string(name_of(p.param.precision)) +
         (p.param.gemm == kernels::GemmBackend::kHand ? "_hand" : "_cublaslt");
}

GPT2Config make_config(const Case& c) {
  GPT2Config cfg;
  cfg.n_layer = c.L;
  cfg.n_head = c.NH;
  cfg.n_embd = c.C;
  cfg.vocab_size = c.V;
  cfg.max_seq_len = c.maxT;
  return cfg;
}

void make_batch(const Case& c, uint64_t seed, std::vector<int32_t>* in, std::vector<int32_t>* tg) {
  Rng rng(seed, 7);
  in->resize(static_cast<size_t>(c.B) * c.T);
  tg->resize(in->size());
  for (auto& x : *in) x = static_cast<int32_t>(rng.below(c.V));
  for (auto& x : *tg) x = static_cast<int32_t>(rng.below(c.V));
}

double tensor_rel_err(const std::vector<float>& a, const std::vector<float>& b, size_t off, size_t n) {
  double err = 0, scale = 1e-30;
  for (size_t i = off; i < off + n; ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / scale;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b, size_t off, size_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = off; i < off + n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return (aa == 0 && bb == 0) ? 1.0 : ab / std::sqrt(aa * bb + 1e-300);
}

// Elements whose bits differ (a size mismatch counts every element of the longer one).
size_t elements_that_differ(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

class ModelStep : public testing::TestWithParam<Param> {};

TEST_P(ModelStep, MatchesCpuStep) {
  const Param prm = GetParam();
  const bool fp32 = prm.precision == Precision::kFp32;
  kernels::set_cpu_threads(2);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const GPT2Config cfg = make_config(c);
    GPT2 cpu(cfg);
    cpu.init(1234);
    CudaStream stream;
    GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
    gpu.set_params(cpu.params().data());

    // Two micro-steps: the second accumulates (+=) into the gradients of the first.
    const float dloss = 1.0f / (2.0f * c.B * c.T);
    cpu.zero_grad();
    gpu.zero_grad();
    double cpu_loss = 0;
    for (int m = 0; m < 2; ++m) {
      std::vector<int32_t> in, tg;
      make_batch(c, 100 + m, &in, &tg);
      cpu_loss += cpu.forward_train(in.data(), tg.data(), c.B, c.T, dloss);
      cpu.backward();
      gpu.forward_train(in.data(), tg.data(), c.B, c.T, dloss);
      gpu.backward();
    }
    const double gpu_loss = gpu.take_loss_sum();
    EXPECT_NEAR(gpu_loss, cpu_loss, (fp32 ? 1e-5 : 1e-2) * std::fabs(cpu_loss)) << "loss sum of 2 micro-steps";

    const std::vector<float> g_gpu = gpu.get_grads();
    const std::vector<float>& g_cpu = cpu.grads();
    ASSERT_EQ(g_gpu.size(), g_cpu.size());
    for (const ParamInfo& p : cpu.table().params()) {
      if (fp32) {
        EXPECT_LE(tensor_rel_err(g_gpu, g_cpu, p.offset, p.numel), 1e-4) << "gradient of " << p.name;
      } else {
        EXPECT_GE(cosine(g_gpu, g_cpu, p.offset, p.numel), 0.99) << "gradient of " << p.name;
      }
    }

    // The global norm and one AdamW step, from the same gradients on both sides.
    const double n_cpu = std::sqrt([&] {
      double s = 0;
      for (float x : g_cpu) s += static_cast<double>(x) * x;
      return s;
    }());
    const double n_gpu = std::sqrt(gpu.grad_sum_squares());
    EXPECT_NEAR(n_gpu, n_cpu, (fp32 ? 1e-4 : 2e-2) * n_cpu) << "gradient norm";
    if (fp32) {
      // AdamW on the GPU's own gradients: the k part of the QKV bias has a true gradient of 0 (softmax
      // ignores a constant per row), so both sides hold only rounding noise there, and Adam's first
      // step (lr * g / (|g| + eps)) would amplify that noise into a disagreement of order lr.
      std::copy(g_gpu.begin(), g_gpu.end(), cpu.grads().begin());
      AdamWConfig oc;
      AdamW opt(cpu.table().segments(), {{0, cpu.table().total()}}, oc);
      opt.step(cpu.params().data(), cpu.grads().data(), 1e-3f, 0.5f);
      gpu.adamw_step({1e-3f, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, 0.5f, 1});
      std::vector<float> p_gpu(cpu.params().size());
      gpu.get_params(p_gpu.data());
      for (const ParamInfo& p : cpu.table().params())
        EXPECT_LE(tensor_rel_err(p_gpu, cpu.params(), p.offset, p.numel), 1e-5) << "parameter after AdamW: " << p.name;
    }
  }
}

// ZeRO-1 on the device: with set_optimizer_shard the model keeps moments for its runs only and
// adamw_step updates exactly those parameters, as the CPU AdamW given the same runs does; the sums of
// squares over a run agree with the host's. (The all-gather across ranks needs one GPU per rank; the
// CPU suite covers the collectives: mpi.zero.)
TEST_P(ModelStep, ShardedAdamWMatchesCpuShard) {
  const Param prm = GetParam();
  if (prm.precision != Precision::kFp32) GTEST_SKIP() << "compared in fp32";
  kernels::set_cpu_threads(2);
  const Case& c = kCases[0];
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  cpu.init(77);
  CudaStream stream;
  GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
  gpu.set_params(cpu.params().data());
  std::vector<int32_t> in, tg;
  make_batch(c, 7, &in, &tg);
  gpu.zero_grad();
  gpu.forward_train(in.data(), tg.data(), c.B, c.T, 1.0f / (c.B * c.T));
  gpu.backward();
  (void)gpu.take_loss_sum();
  const std::vector<float> g = gpu.get_grads();
  std::copy(g.begin(), g.end(), cpu.grads().begin());
  const size_t total = cpu.table().total();
  // Runs that cut through tensors (as bucket pieces do), one of them the buffer's last elements.
  const std::vector<FlatRange> owned = {{3, 517}, {total / 3, total / 3 + 4099}, {total - 777, total}};
  for (const FlatRange& r : owned) {
    double want = 0;
    for (size_t i = r.begin; i < r.end; ++i) want += static_cast<double>(g[i]) * g[i];
    EXPECT_NEAR(gpu.grad_sum_squares(r.begin, r.end), want, 1e-9 + 1e-6 * want) << "run " << r.begin;
  }
  const std::vector<float> before = cpu.params();
  AdamWConfig oc;
  AdamW opt(cpu.table().segments(), owned, oc);
  opt.step(cpu.params().data(), cpu.grads().data(), 1e-3f, 0.5f);
  gpu.set_optimizer_shard(owned);
  gpu.adamw_step({1e-3f, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, 0.5f, 1});
  std::vector<float> p_gpu(total);
  gpu.get_params(p_gpu.data());
  size_t changed_outside = 0, far_inside = 0;
  std::vector<bool> in_run(total, false);
  for (const FlatRange& r : owned)
    for (size_t i = r.begin; i < r.end; ++i) in_run[i] = true;
  for (size_t i = 0; i < total; ++i) {
    if (!in_run[i]) changed_outside += p_gpu[i] != before[i];
    else far_inside += std::fabs(p_gpu[i] - cpu.params()[i]) > 1e-6f + 1e-5f * std::fabs(cpu.params()[i]);
  }
  EXPECT_EQ(changed_outside, 0u) << "parameters outside the shard must not move";
  EXPECT_EQ(far_inside, 0u) << "parameters of the shard must match the CPU AdamW";
  std::vector<float> m(total_size(owned)), v(total_size(owned));
  gpu.get_moments(m.data(), v.data());
  EXPECT_LE(tensor_rel_err(m, opt.m(), 0, m.size()), 1e-5) << "first moments of the shard";
  EXPECT_LE(tensor_rel_err(v, opt.v(), 0, v.size()), 1e-5) << "second moments of the shard";
}

TEST_P(ModelStep, RepeatsBitForBit) {
  const Param prm = GetParam();
  const Case& c = kCases[0];
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  cpu.init(99);
  std::vector<int32_t> in, tg;
  make_batch(c, 5, &in, &tg);
  std::vector<float> first;
  double first_loss = 0;
  for (int run = 0; run < 2; ++run) {
    CudaStream stream;
    GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
    gpu.set_params(cpu.params().data());
    gpu.zero_grad();
    gpu.forward_train(in.data(), tg.data(), c.B, c.T, 1.0f / (c.B * c.T));
    gpu.backward();
    const double loss = gpu.take_loss_sum();
    const std::vector<float> g = gpu.get_grads();
    if (run == 0) {
      first = g;
      first_loss = loss;
    } else {
      EXPECT_EQ(loss, first_loss);
      EXPECT_EQ(elements_that_differ(g, first), 0u) << "gradient elements that differ between two identical runs";
    }
  }
}

// --recompute selective|full on the device: the activations the forward drops are recomputed in
// backward by the forward's own kernels, so two micro-steps (the second accumulating, an eval between
// them reusing the one-layer slots) give the same loss and the same gradient bits as --recompute none.
// One exception, stated in GPT2Cuda::set_recompute: selective under cuBLASLt in bf16 recomputes the
// GELU with the GELU kernel, which rounds differently from cuBLASLt's fused epilogue: close, not equal.
TEST_P(ModelStep, RecomputeGivesSameGradients) {
  const Param prm = GetParam();
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const GPT2Config cfg = make_config(c);
    GPT2 cpu(cfg);
    cpu.init(4321);
    std::vector<float> ref;
    double ref_loss = 0;
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      SCOPED_TRACE(recompute_name(r));
      CudaStream stream;
      GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
      gpu.set_recompute(r);
      gpu.set_params(cpu.params().data());
      gpu.zero_grad();
      const float dloss = 1.0f / (2.0f * c.B * c.T);
      for (int m = 0; m < 2; ++m) {
        std::vector<int32_t> in, tg;
        make_batch(c, 300 + m, &in, &tg);
        gpu.forward_train(in.data(), tg.data(), c.B, c.T, dloss);
        gpu.backward();
        if (m == 0) gpu.forward_eval(in.data(), tg.data(), c.B, c.T);
      }
      const double loss = gpu.take_loss_sum();
      const std::vector<float> g = gpu.get_grads();
      if (r == Recompute::kNone) {
        ref = g;
        ref_loss = loss;
        continue;
      }
      EXPECT_EQ(loss, ref_loss) << "the forward does not depend on what it keeps";
      ASSERT_EQ(g.size(), ref.size());
      const bool exact = !(r == Recompute::kSelective && prm.precision == Precision::kBf16 &&
                           prm.gemm == kernels::GemmBackend::kCublasLt);
      if (exact) {
        EXPECT_EQ(elements_that_differ(g, ref), 0u) << "gradient elements that differ from --recompute none";
      } else {
        for (const ParamInfo& p : cpu.table().params())
          EXPECT_GE(cosine(g, ref, p.offset, p.numel), 0.999) << "gradient of " << p.name;
      }
    }
  }
}

// ZeRO-1's overlapped all-gather, on one GPU: the parameters are wiped on the device and arrive on a
// side stream, three runs of the buffer in the forward's order, each after a host delay and with an
// event. The forward must wait for each run just before it reads it: the loss and every gradient bit
// equal a run whose parameters were there all along. (A forward that did not wait would read zeros.)
TEST_P(ModelStep, WaitsForParamsStillArriving) {
  const Param prm = GetParam();
  const Case& c = kCases[1];
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  cpu.init(17);
  std::vector<int32_t> in, tg;
  make_batch(c, 23, &in, &tg);
  const size_t elem = prm.precision == Precision::kBf16 ? 2 : 4;
  std::vector<float> ref;
  double ref_loss = 0;
  for (int late = 0; late < 2; ++late) {
    CudaStream stream, side;
    GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
    gpu.set_params(cpu.params().data());
    const size_t total = gpu.table().total();
    DeviceBuffer<char> good(total * elem);
    std::vector<CudaEvent> events(3);
    if (late) {
      char* params = static_cast<char*>(gpu.params_device());
      CUDA_CHECK(cudaMemcpy(good.data(), params, total * elem, cudaMemcpyDeviceToDevice));
      CUDA_CHECK(cudaMemset(params, 0, total * elem));
      CUDA_CHECK(cudaDeviceSynchronize());
      const size_t cut[4] = {0, gpu.table().block_begin(1), gpu.table().block_begin(2), total};
      std::vector<GPT2Cuda::ParamArrival> arrivals;
      for (int k = 0; k < 3; ++k) {
        CUDA_CHECK(cudaLaunchHostFunc(
            side.get(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, nullptr));
        CUDA_CHECK(cudaMemcpyAsync(params + cut[k] * elem, good.data() + cut[k] * elem, (cut[k + 1] - cut[k]) * elem,
                                   cudaMemcpyDeviceToDevice, side.get()));
        events[k].record(side.get());
        arrivals.push_back({{cut[k], cut[k + 1]}, events[k].get()});
      }
      gpu.set_param_arrivals(std::move(arrivals));
    }
    gpu.zero_grad();
    gpu.forward_train(in.data(), tg.data(), c.B, c.T, 1.0f / (c.B * c.T));
    gpu.backward();
    const double loss = gpu.take_loss_sum();
    const std::vector<float> g = gpu.get_grads();
    CUDA_CHECK(cudaDeviceSynchronize());
    if (!late) {
      ref = g;
      ref_loss = loss;
      continue;
    }
    EXPECT_EQ(loss, ref_loss);
    EXPECT_EQ(elements_that_differ(g, ref), 0u) << "gradient elements that differ when parameters arrive late";
  }
}

// Three optimizer steps of three micro-steps each (the last one scaled, an eval after each step) from
// the given weights: the losses (train, eval per step) and the parameters after them.
struct ThreeSteps {
  std::vector<double> losses;
  std::vector<float> params;
};
ThreeSteps run_three_steps(const Case& c, const GPT2Config& cfg, const float* weights, const Param& prm, Recompute r,
                           bool cuda_graph) {
  ThreeSteps out;
  CudaStream stream;
  CudaModelOptions mo{prm.precision, prm.gemm};
  mo.cuda_graph = cuda_graph;
  GPT2Cuda gpu(cfg, mo, stream.get());
  gpu.set_recompute(r);
  gpu.set_params(weights);
  const float dloss = 1.0f / (3.0f * c.B * c.T);
  for (int step = 1; step <= 3; ++step) {
    gpu.zero_grad();
    for (int m = 0; m < 3; ++m) {
      std::vector<int32_t> in, tg;
      make_batch(c, 500 + 10 * step + m, &in, &tg);
      gpu.forward_train(in.data(), tg.data(), c.B, c.T, m == 2 ? 0.5f * dloss : dloss);
      gpu.backward();
    }
    out.losses.push_back(gpu.take_loss_sum());
    std::vector<int32_t> in, tg;
    make_batch(c, 900 + step, &in, &tg);
    out.losses.push_back(gpu.forward_eval(in.data(), tg.data(), c.B, c.T));
    gpu.adamw_step({1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
  }
  out.params.resize(gpu.table().total());
  gpu.get_params(out.params.data());
  return out;
}

// --cuda-graph: each micro-step's forward and backward replayed as a captured graph gives the loss and
// every parameter bit of eager launches, over 3 optimizer steps of 3 accumulated micro-steps, with and
// without full recompute, and with an eval in between (eager, on the same activations). The third
// micro-step has another loss weight, so two graph keys alternate: A warms up, A is captured, B warms up
// (step 1); A, A replay and B is captured (step 2); everything replays (step 3), A's graph kept
// across B's.
TEST_P(ModelStep, CudaGraphMatchesEager) {
  const Param prm = GetParam();
  const Case& c = kCases[0];
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  cpu.init(29);
  for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
    SCOPED_TRACE(recompute_name(r));
    const ThreeSteps eager = run_three_steps(c, cfg, cpu.params().data(), prm, r, false);
    const ThreeSteps graph = run_three_steps(c, cfg, cpu.params().data(), prm, r, true);
    EXPECT_EQ(graph.losses, eager.losses) << "losses (train, eval per step) with and without the graph";
    EXPECT_EQ(elements_that_differ(graph.params, eager.params), 0u)
        << "parameters that differ after 3 steps with and without the graph";
  }
}

// Programmatic dependent launch (GPT2_PDL=on; kernels/common/launch.cuh) overlaps only the launch of each
// kernel with the end of the one before; every kernel still waits for it before touching memory. So three
// steps with it, eagerly and captured in a CUDA graph (where launches become programmatic edges), must
// give every bit of three steps without it. On a device before compute capability 9.0 the attribute is not
// set, and the kernels line says so.
TEST_P(ModelStep, ProgrammaticLaunchChangesNoBit) {
  const Param prm = GetParam();
  const Case& c = kCases[1];
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  cpu.init(41);
  struct Override {  // back to GPT2_PDL however the test ends
    explicit Override(int on) { cuda::set_programmatic_launch(on); }
    ~Override() { cuda::set_programmatic_launch(-1); }
  };
  ThreeSteps plain;
  {
    Override off(0);
    kernels::reset_kernel_paths();
    plain = run_three_steps(c, cfg, cpu.params().data(), prm, Recompute::kNone, false);
    EXPECT_EQ(kernels::kernel_paths_used().find("launch:"), std::string::npos)
        << "off, the kernels line names no launch mode";
  }
  int major = 0, dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  for (bool graph : {false, true}) {
    SCOPED_TRACE(graph ? "CUDA graph" : "eager");
    Override on(1);
    kernels::reset_kernel_paths();
    const ThreeSteps pdl = run_three_steps(c, cfg, cpu.params().data(), prm, Recompute::kNone, graph);
    const std::string paths = kernels::kernel_paths_used();
    // every launch programmatic on 9.0 and later (this build's kernels have code for 90), none before it
    EXPECT_NE(paths.find(major >= 9 ? "launch: programmatic" : "launch: stream order"), std::string::npos) << paths;
    EXPECT_EQ(paths.find(major >= 9 ? "stream order" : "launch: programmatic"), std::string::npos) << paths;
    EXPECT_EQ(pdl.losses, plain.losses) << "losses (train, eval per step) with and without programmatic launch";
    EXPECT_EQ(elements_that_differ(pdl.params, plain.params), 0u)
        << "parameters that differ after 3 steps with and without programmatic launch";
  }
}

// The opt-in attention kernels under programmatic launch: the backwards whose blocks take turns across the
// grid (accumulate-dq, wgmma: a key tile waits for the tiles above it), the two-launch store-ds backwards, and
// the wgmma forwards. Each still waits for the kernel before it, and a kernel's blocks are launched early only
// once every block of that kernel is resident, so no turn can wait on a block that has no slot: the argument
// says no bit changes and nothing hangs (a hang traps after 10 s), and a GPU is where a flaw in it would show.
// T = 256: 4 key tiles a head, so the turns pass between blocks. The kernels line must name the path that ran.
TEST_P(ModelStep, ProgrammaticLaunchChangesNoBitOnOptInAttention) {
  const Param prm = GetParam();
  if (prm.precision != Precision::kBf16) GTEST_SKIP() << "the opt-in attention kernels are bf16's";
  const Case c{"hs64_t256", 2, 2, 128, 256, 256, 2, 256};
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  cpu.init(43);
  struct Restore {  // the process's attention paths and GPT2_PDL, however the test ends
    kernels::AttentionForwardPath fwd = kernels::attention_forward_path();
    kernels::AttentionBackwardPath bwd = kernels::attention_backward_path();
    ~Restore() {
      kernels::attention_set_forward_path(fwd);
      kernels::attention_set_backward_path(bwd);
      cuda::set_programmatic_launch(-1);
    }
  } restore;
  using F = kernels::AttentionForwardPath;
  using B = kernels::AttentionBackwardPath;
  struct Paths {
    F fwd;
    B bwd;
    bool wgmma;
    const char* fwd_name;  // as the kernels line names them
    const char* bwd_name;
  };
  const Paths kPaths[] = {
      {F::kMmaSync, B::kAccumulateDq, false, "mma.sync", "accumulate-dq"},
      {F::kMmaSync, B::kStoreDs, false, "mma.sync", "store-ds"},
      {F::kWgmma, B::kWgmma, true, "wgmma", "wgmma"},
      {F::kWgmmaPingPong, B::kWgmmaStoreDs, true, "wgmma-pingpong", "wgmma-store-ds"},
  };
  // "op: path" as the whole entry of its op (followed by "; " or the end): "wgmma" is not "wgmma-store-ds"
  auto names = [](const std::string& line, const std::string& op, const std::string& path) {
    const std::string entry = op + ": " + path;
    for (size_t at = line.find(entry); at != std::string::npos; at = line.find(entry, at + 1)) {
      const size_t end = at + entry.size();
      if ((at == 0 || line.compare(at - 2, 2, "; ") == 0) && (end == line.size() || line.compare(end, 2, "; ") == 0))
        return true;
    }
    return false;
  };
  const bool wgmma = kernels::attention_fwd_wgmma_available() && kernels::attention_bwd_wgmma_available();
  int ran = 0;
  for (const Paths& p : kPaths) {
    SCOPED_TRACE(std::string(p.fwd_name) + " forward, " + p.bwd_name + " backward");
    if (p.wgmma && !wgmma) continue;  // not a 9.0 device with the sm_90a kernels: nothing new to run
    kernels::attention_set_forward_path(p.fwd);
    kernels::attention_set_backward_path(p.bwd);
    cuda::set_programmatic_launch(0);
    kernels::reset_kernel_paths();
    const ThreeSteps plain = run_three_steps(c, cfg, cpu.params().data(), prm, Recompute::kNone, false);
    const std::string line = kernels::kernel_paths_used();
    EXPECT_TRUE(names(line, "attention forward", p.fwd_name)) << line;
    EXPECT_TRUE(names(line, "attention backward", p.bwd_name)) << line;
    for (bool graph : {false, true}) {
      SCOPED_TRACE(graph ? "CUDA graph" : "eager");
      cuda::set_programmatic_launch(1);
      const ThreeSteps pdl = run_three_steps(c, cfg, cpu.params().data(), prm, Recompute::kNone, graph);
      EXPECT_EQ(pdl.losses, plain.losses) << "losses (train, eval per step) with and without programmatic launch";
      EXPECT_EQ(elements_that_differ(pdl.params, plain.params), 0u)
          << "parameters that differ after 3 steps with and without programmatic launch";
    }
    ++ran;
  }
  std::printf("[ programmatic launch ] %d attention path pair(s) ran%s\n", ran,
              wgmma ? "" : " (the wgmma ones need a 9.0 device and the sm_90a kernels)");
}

// GPT2_ATTENTION_BIAS_SUMS=on: the attention backward sums dqkv's columns as it stores them, and the qkv
// weight gradient runs as a plain product. Two accumulated micro-steps with it on and off: every gradient but
// the qkv bias gradient the same bits (the hand GEMM's bias-fused weight gradient has its plain product's bits;
// on cuBLASLt the weight gradient is held to bf16's rounding, since a cuBLASLt with a bias-gradient epilogue
// for fp32 sums would fuse it in another kernel), the bias gradient within bf16's rounding of the same fp32 sums
// in another order. hs = 64 (the tensor-core kernels, where the sums are taken) and the awkward case's hs = 24
// (SIMT: no sums, the bias kernel as before, every bit the same), each named by the kernels line.
TEST_P(ModelStep, AttentionBiasSumsMatchTheBiasKernel) {
  const Param prm = GetParam();
  if (prm.precision != Precision::kBf16) GTEST_SKIP() << "the sums are taken by the bf16 tensor-core kernels";
  struct Restore {
    ~Restore() { kernels::attention_set_bias_sums(-1); }
  } restore;
  for (const Case& c : {kCases[1], kCases[0]}) {
    SCOPED_TRACE(c.name);
    const bool tensor_cores = c.C / c.NH == 64;
    const GPT2Config cfg = make_config(c);
    GPT2 cpu(cfg);
    cpu.init(77);
    std::vector<float> grads[2];
    for (int on = 0; on < 2; ++on) {
      kernels::attention_set_bias_sums(on);
      kernels::reset_kernel_paths();
      CudaStream stream;
      GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
      gpu.set_params(cpu.params().data());
      gpu.zero_grad();
      for (int m = 0; m < 2; ++m) {
        std::vector<int32_t> in, tg;
        make_batch(c, 300 + m, &in, &tg);
        gpu.forward_train(in.data(), tg.data(), c.B, c.T, 1.0f / (2.0f * c.B * c.T));
        gpu.backward();
      }
      grads[on] = gpu.get_grads();
      const bool summed = kernels::kernel_paths_used().find("attention column sums") != std::string::npos;
      EXPECT_EQ(summed, on == 1 && tensor_cores) << kernels::kernel_paths_used();
    }
    for (const ParamInfo& p : cpu.table().params()) {
      const bool qkvw = p.name.find("attn.c_attn.weight") != std::string::npos;
      const bool qkvb = p.name.find("attn.c_attn.bias") != std::string::npos;
      const std::vector<float> a(grads[0].begin() + p.offset, grads[0].begin() + p.offset + p.numel);
      const std::vector<float> b(grads[1].begin() + p.offset, grads[1].begin() + p.offset + p.numel);
      double peak = 0, diff = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        peak = std::max(peak, std::fabs(static_cast<double>(a[i])));
        diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      }
      if (tensor_cores && (qkvb || (qkvw && prm.gemm == kernels::GemmBackend::kCublasLt))) {
        EXPECT_LE(diff, peak / 64) << "gradient of " << p.name << " with and without the attention's sums";
      } else {
        EXPECT_EQ(diff, 0.0) << "gradient of " << p.name << " changed with the attention's sums";
      }
    }
  }
}

// --cuda-graph defers forward_train's device work to backward(). Weights set before that (set_params)
// must not leak into the deferred forward: its loss is the one of the weights it was given, as eagerly.
TEST_P(ModelStep, CudaGraphDeferredForwardUsesItsWeights) {
  const Param prm = GetParam();
  const Case& c = kCases[0];
  const GPT2Config cfg = make_config(c);
  GPT2 before(cfg), after(cfg);
  before.init(31);
  after.init(32);
  std::vector<int32_t> in, tg;
  make_batch(c, 77, &in, &tg);
  double loss[2];
  for (int graph = 0; graph < 2; ++graph) {
    CudaStream stream;
    CudaModelOptions mo{prm.precision, prm.gemm};
    mo.cuda_graph = graph == 1;
    GPT2Cuda gpu(cfg, mo, stream.get());
    gpu.set_params(before.params().data());
    gpu.forward_train(in.data(), tg.data(), c.B, c.T, 1.0f);
    gpu.set_params(after.params().data());
    loss[graph] = gpu.take_loss_sum();
  }
  EXPECT_EQ(loss[1], loss[0]) << "the deferred forward ran on the weights set after it";
}

TEST_P(ModelStep, EvalMatchesTrainLoss) {
  const Param prm = GetParam();
  const Case& c = kCases[1];
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  cpu.init(7);
  CudaStream stream;
  GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
  gpu.set_params(cpu.params().data());
  std::vector<int32_t> in, tg;
  make_batch(c, 11, &in, &tg);
  const float eval = gpu.forward_eval(in.data(), tg.data(), c.B, c.T);
  gpu.forward_train(in.data(), tg.data(), c.B, c.T, 1.0f);
  EXPECT_EQ(static_cast<double>(eval), static_cast<double>(static_cast<float>(gpu.take_loss_sum())));
  EXPECT_NEAR(eval, cpu.forward_eval(in.data(), tg.data(), c.B, c.T), prm.precision == Precision::kFp32 ? 1e-4 : 2e-2);
}

// GPT2_PDL takes off or on: a typo is an error that names the variable (at the first launch, on every rank),
// not a run in stream order that looks like the A/B.
TEST(ModelLaunchEnvironment, UnknownPdlValueIsAnError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the binary: no fork of a CUDA process
  const char* was = std::getenv("GPT2_PDL");
  const std::string saved = was != nullptr ? was : "";
  ASSERT_EQ(setenv("GPT2_PDL", "yes", 1), 0);
  EXPECT_DEATH(cuda::programmatic_launch(nullptr), "GPT2_PDL='yes' is not a kernel launch mode");
  was != nullptr ? setenv("GPT2_PDL", saved.c_str(), 1) : unsetenv("GPT2_PDL");
}

INSTANTIATE_TEST_SUITE_P(Backends, ModelStep,
                         testing::Values(Param{Precision::kFp32, kernels::GemmBackend::kCublasLt},
                                         Param{Precision::kFp32, kernels::GemmBackend::kHand},
                                         Param{Precision::kBf16, kernels::GemmBackend::kCublasLt},
                                         Param{Precision::kBf16, kernels::GemmBackend::kHand}),
                         param_name);

}  // namespace
}  // namespace gpt2
