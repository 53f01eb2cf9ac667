// Device discovery and a smoke kernel: proves the CUDA toolchain, the architectures and the runtime
// link work, and lets tests skip cleanly ("no GPU") on machines without a driver.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/common/cuda_check.cuh"
#include "kernels/common/cuda_device.cuh"
#include "kernels/common/device.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"

namespace gpt2 {

int gpu_count(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = std::string("no GPU (cudaGetDeviceCount: ") + cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear the sticky error so later CPU work is not affected
    return 0;
  }
  if (n == 0 && why) *why = "no GPU (cudaGetDeviceCount returned 0 devices)";
  return n;
}

std::string cuda_library_versions() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  const size_t lt = cublasLtGetVersion();
  return "CUDA runtime " + std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) +
         ", driver " + (driver ? std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10) : "none") +
         ", cuBLASLt " + std::to_string(lt);
}

namespace {
__global__ void axpy_kernel(float* y, const float* x, float a, int n) {
  cuda::griddep_launch_dependents_then_wait();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
}  // namespace

// y += a * x on the device; used by the GPU smoke test against a CPU loop.
void axpy_device(float* y, const float* x, float a, int n, cudaStream_t stream) {
  constexpr int kBlock = 256;
  cuda::launch_kernel(axpy_kernel, (n + kBlock - 1) / kBlock, kBlock, 0, stream, y, x, a, n);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace gpt2
