// What the boundary between two kernels costs, with and without programmatic dependent launch
// (GPT2_PDL; kernels/common/launch.cuh): a chain of back-to-back launches of one kernel on one stream, timed
// as a whole (L2 flushed before the chain, not inside it), so the time per launch is the kernel plus the gap
// before the next. pdl:1 launches each with the programmatic attribute (compute capability 9.0 and later;
// an error row elsewhere), pdl:0 in plain stream order; phase A's table sets each pdl:1 row against its pdl:0.
//   LaunchChain/layernorm_fwd/rows:64/pdl:<0|1>     100 launches of a kernel that takes ~2 us: mostly boundary
//   LaunchChain/layernorm_fwd/rows:8192/pdl:<0|1>   100 launches at a 124M step's size (8192 x 768, bf16)
//   LaunchChain/gemm_hand/attn_proj_fwd/rows:8192/pdl:<0|1>   20 hand GEMMs (the hand default's kernel) with bias
// Counter us_per_launch: the chain's time over its launches. The difference pdl:0 - pdl:1 is what each
// boundary of a training step would save (a 124M step has ~300: docs/performance.md).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

#include "gpu_bench_util.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/gemm/gemm_cuda.hpp"
#include "kernels/layernorm/layernorm_cuda.hpp"

namespace gpt2 {
namespace {

constexpr int kC = 768;

// Deterministic bf16 values in [-1, 1) (no zeros: they run faster than real data).
DeviceBuffer<bf16> filled(size_t n, uint32_t salt) {
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) {
    h[i] = static_cast<float>((static_cast<uint32_t>(i) * 2654435761u + salt) % 1023u + 1u) / 512.0f - 1.0f;
  }
  DeviceBuffer<bf16> d;
  d.upload(h);
  return d;
}

// The programmatic attribute on or off for one benchmark, back to GPT2_PDL however it ends.
struct ProgrammaticLaunch {
  explicit ProgrammaticLaunch(bool on) { cuda::set_programmatic_launch(on ? 1 : 0); }
  ~ProgrammaticLaunch() { cuda::set_programmatic_launch(-1); }
  ProgrammaticLaunch(const ProgrammaticLaunch&) = delete;
  ProgrammaticLaunch& operator=(const ProgrammaticLaunch&) = delete;
};

bool device_has_pdl() {
  int dev = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 9;
}

// Times `launches` calls of `one` back to back on a stream of its own (not the legacy default stream, whose
// implicit synchronisation a training step never has), L2 flushed before each chain; us_per_launch counter.
void time_chain(benchmark::State& state, bool pdl, int launches, const std::function<void(cudaStream_t)>& one) {
  if (pdl && !device_has_pdl()) {
    state.SkipWithError("programmatic dependent launch needs compute capability 9.0 or later");
    return;
  }
  const ProgrammaticLaunch mode(pdl);
  CudaStream stream;
  const double total_s = bench::time_launches(
      state,
      [&](cudaStream_t s) {
        for (int i = 0; i < launches; ++i) one(s);
      },
      0, 0, stream.get());
  state.counters["launches"] = launches;
  state.counters["us_per_launch"] = total_s * 1e6 / (static_cast<double>(state.iterations()) * launches);
}

void BM_LaunchChainLayernorm(benchmark::State& state, int rows, bool pdl) try {
  const size_t n = static_cast<size_t>(rows) * kC;
  DeviceBuffer<bf16> inp = filled(n, 1), out(n), w = filled(kC, 2), b = filled(kC, 3);
  DeviceBuffer<float> mean(rows), rstd(rows);
  time_chain(state, pdl, 100, [&](cudaStream_t s) {
    kernels::layernorm_forward_cuda<bf16>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), rows,
                                          kC, s);
  });
} catch (...) {
  bench::error_row(state);
}

void BM_LaunchChainGemm(benchmark::State& state, int rows, bool pdl) try {
  DeviceBuffer<bf16> a = filled(static_cast<size_t>(rows) * kC, 1), w = filled(static_cast<size_t>(kC) * kC, 2);
  DeviceBuffer<bf16> bias = filled(kC, 3), c(static_cast<size_t>(rows) * kC);
  kernels::GemmContext ctx(kernels::GemmBackend::kHand);
  time_chain(state, pdl, 20, [&](cudaStream_t s) {
    kernels::gemm_cuda<bf16>(ctx, c.data(), a.data(), w.data(), bias.data(), nullptr, rows, kC, kC, false, false, false,
                             kernels::GemmEpilogue::kBias, s);
  });
} catch (...) {
  bench::error_row(state);
}

const bool kRegistered = [] {
  for (int pdl = 0; pdl < 2; ++pdl) {
    for (int rows : {64, 8192}) {
      const std::string name = "LaunchChain/layernorm_fwd/rows:" + std::to_string(rows) + "/pdl:" + std::to_string(pdl);
      benchmark::RegisterBenchmark(name.c_str(), BM_LaunchChainLayernorm, rows, pdl == 1)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
    const std::string name = "LaunchChain/gemm_hand/attn_proj_fwd/rows:8192/pdl:" + std::to_string(pdl);
    benchmark::RegisterBenchmark(name.c_str(), BM_LaunchChainGemm, 8192, pdl == 1)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
}  // namespace gpt2
