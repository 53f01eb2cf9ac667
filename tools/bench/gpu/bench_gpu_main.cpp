// main() of bench_gpu_kernels: without a GPU it says so and exits 0 (a benchmark, not a test).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#include "kernels/common/device.hpp"

int main(int argc, char** argv) {
  std::string why;
  if (gpt2::gpu_count(&why) == 0) {
    std::printf("bench_gpu_kernels: skipped: %s\n", why.c_str());
    return 0;
  }
  std::printf("%s\n", gpt2::cuda_library_versions().c_str());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
