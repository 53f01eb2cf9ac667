// Shared by the GPU kernel benchmarks (tools/bench/gpu/bench_*.cpp, one binary bench_gpu_kernels):
// manual timing with CUDA events, L2 flushed before every timed launch (so each launch reads its
// inputs from HBM, as it does inside a training step), and counters in physical units.
//   build/bin/bench_gpu_kernels --benchmark_out=gpu_kernels.json --benchmark_out_format=json
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <atomic>
#include <exception>
#include <functional>
#include <string>

#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"

namespace gpt2::bench {

// What fatal() throws in bench_gpu_kernels (the abort hook its main sets) instead of ending the process:
// a CUDA call or a kernel's check that fails inside one benchmark must not take the others with it, nor
// leave the --benchmark_out file without its end.
struct Failed {
  std::string what;
};

// How many benchmarks failed (main's exit status): an error row from error_row, not an expected skip.
inline std::atomic<int> failed_count{0};

// The handler of every benchmark function's try block: the failure becomes this benchmark's error row in
// the output and the JSON, and the benchmarks after it run. A failed runtime call (a cudaMalloc the device
// has no room for) is also the thread's last error, which the next launch check would report as its own:
// it is cleared here. A sticky error (an illegal address, a trap) cannot be, and fails every later one.
// (Single-threaded benchmarks only: a benchmark with ->Threads(n > 1) that leaves its timing loop by an
// exception skips the loop's closing barrier, which the other threads would wait at.)
inline void error_row(benchmark::State& state) {
  (void)cudaGetLastError();
  std::string why = "failed: an exception of unknown type";
  try {
    throw;
  } catch (const Failed& e) {
    why = "failed: " + e.what;
  } catch (const std::exception& e) {
    why = std::string("failed: ") + e.what();
  } catch (...) {
  }
  ++failed_count;
  state.SkipWithError(why.c_str());
}

// Overwrites a buffer larger than L2 (H100: 50 MB) so the next launch finds nothing cached.
inline void flush_l2(cudaStream_t s) {
  static DeviceBuffer<char> scratch(256ull << 20);
  CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0, scratch.bytes(), s));
}

// Times `launch` once per benchmark iteration (after an untimed warm-up), L2 flushed before each,
// reports manual time, and sets counters: TFLOP/s from `flops` per launch, GB/s from `bytes` per launch
// (either may be 0 to omit it). On stream `s`: by default the legacy default stream, simple and
// serialising. Returns the seconds timed, summed over the iterations.
inline double time_launches(benchmark::State& state, const std::function<void(cudaStream_t)>& launch, double flops,
                            double bytes, cudaStream_t s = nullptr) {
  launch(s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  CudaEvent start(true), stop(true);
  double total_s = 0;
  for (auto _ : state) {
    flush_l2(s);
    start.record(s);
    launch(s);
    stop.record(s);
    CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    state.SetIterationTime(ms / 1e3);
    total_s += ms / 1e3;
  }
  const double n = static_cast<double>(state.iterations());
  if (flops > 0) state.counters["TFLOP_per_s"] = flops * n / total_s / 1e12;
  if (bytes > 0) state.counters["GB_per_s"] = bytes * n / total_s / 1e9;
  return total_s;
}

}  // namespace gpt2::bench
