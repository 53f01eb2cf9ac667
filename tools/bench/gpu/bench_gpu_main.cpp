// main() of bench_gpu_kernels: without a GPU it says so and exits 0 (a benchmark, not a test); listing
// (--benchmark_list_tests) works everywhere.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "kernels/common/device.hpp"

int main(int argc, char** argv) {
  // Listing runs no benchmark, so it needs no GPU (and prints only the names): tools/gpu-phase.sh checks
  // here that its filters select benchmarks.
  bool list_only = false;
  for (int i = 1; i < argc; ++i)
    list_only |= std::strcmp(argv[i], "--benchmark_list_tests") == 0 ||
                 std::strcmp(argv[i], "--benchmark_list_tests=true") == 0;
  std::string why;
  if (!list_only && gpt2::gpu_count(&why) == 0) {
    std::printf("bench_gpu_kernels: skipped: %s\n", why.c_str());
    return 0;
  }
  if (!list_only) std::printf("%s\n", gpt2::cuda_library_versions().c_str());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
