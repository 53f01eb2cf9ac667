// GPU smoke test: the CUDA toolchain, architectures and runtime work, and a kernel agrees with the CPU.
// Without a GPU it prints "skipped: no GPU" and exits 77, which ctest reports as skipped.
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/common/device.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/cuda_device.cuh"

int main() {
  std::printf("%s\n", gpt2::cuda_library_versions().c_str());
  std::string why;
  if (gpt2::gpu_count(&why) == 0) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;
  }
  const int n = 1000003;  // not a multiple of the block size
  std::vector<float> x(n), y(n), ref(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 97) - 48.0f;
    y[i] = static_cast<float>(i % 13);
    ref[i] = y[i] + 0.5f * x[i];
  }
  float *dx = nullptr, *dy = nullptr;
  CUDA_CHECK(cudaMalloc(&dx, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&dy, n * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  gpt2::axpy_device(dy, dx, 0.5f, n, nullptr);
  CUDA_CHECK(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(dx));
  CUDA_CHECK(cudaFree(dy));
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += y[i] != ref[i];  // exact: small integers and halves
  std::printf("%s: %d mismatches of %d\n", bad ? "FAIL" : "ok", bad, n);
  return bad ? 1 : 0;
}
