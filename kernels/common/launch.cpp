#include <cuda_runtime.h>

#include <atomic>

#include "kernels/common/cuda_check.cuh"
#include "kernels/common/env_choice.hpp"
#include "kernels/common/kernel_paths.hpp"
#include "kernels/common/launch.cuh"

namespace gpt2::cuda {
namespace {

std::atomic<int> g_override{-1};

bool pdl_from_env() {
  static const bool on = kernels::choice_from_env<bool>(
      "GPT2_PDL", "kernel launch mode (programmatic dependent launch)", {{"off", false}, {"on", true}});
  return on;
}

// Compute capability >= 9.0, per device (read once each: a launch asks hundreds of times a step).
bool device_has_pdl() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) return false;
  int k = known[dev].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    k = major >= 9 ? 2 : 1;
    known[dev].store(k, std::memory_order_relaxed);
  }
  return k == 2;
}

}  // namespace

bool programmatic_launch() {
  const int o = g_override.load(std::memory_order_relaxed);
  if (!(o >= 0 ? o == 1 : pdl_from_env())) return false;  // the default: nothing recorded, the kernels line as before
  const bool on = device_has_pdl();
  kernels::record_kernel_path("launch",
                              on ? "programmatic" : "stream order (programmatic needs compute capability 9.0)");
  return on;
}

void set_programmatic_launch(int on) {
  g_override.store(on < 0 ? -1 : (on ? 1 : 0));
}

}  // namespace gpt2::cuda
