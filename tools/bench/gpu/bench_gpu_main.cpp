// main() of bench_gpu_kernels: without a GPU it says so and exits 0 (a benchmark, not a test); listing
// (--benchmark_list_tests) works everywhere. A benchmark that fails (a CUDA call, a kernel's check) is an
// error row, the others still run, and the exit status is 1.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "kernels/common/device.hpp"
#include "tools/bench/gpu/gpu_bench_util.hpp"

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
  // fatal() has printed its message when the hook runs; the benchmark's try block makes it an error row.
  gpt2::set_abort_hook([](int, const std::string& what) { throw gpt2::bench::Failed{what}; });
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (const int n = gpt2::bench::failed_count.load()) {
    std::fprintf(stderr, "bench_gpu_kernels: %d benchmark(s) failed: their error rows say why\n", n);
    return 1;
  }
  return 0;
}
