#include "kernels/common/launch.cuh"

#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "kernels/common/cuda_check.cuh"
#include "kernels/common/env_choice.hpp"
#include "kernels/common/kernel_paths.hpp"

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

// Whether the code this device runs for `kernel` was compiled from PTX of architecture 9.0 or later, the
// first where ptx.cuh's prologue is griddepcontrol and not nothing. A build for architecture 80 alone runs
// on an H100 by compiling its compute_80 PTX there: its kernels would not wait, so they are never launched
// with the attribute. Asked once per kernel (and device: the answer is the same for one build).
bool kernel_waits_for_predecessor(const void* kernel) {
  static std::mutex mu;
  static std::unordered_map<const void*, bool> known;
  std::lock_guard<std::mutex> g(mu);
  auto it = known.find(kernel);
  if (it != known.end()) return it->second;
  cudaFuncAttributes attr{};
  CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return known[kernel] = attr.ptxVersion >= 90;
}

}  // namespace

bool programmatic_launch(const void* kernel) {
  const int o = g_override.load(std::memory_order_relaxed);
  if (!(o >= 0 ? o == 1 : pdl_from_env())) return false;  // the default: nothing recorded, the kernels line as before
  if (!device_has_pdl()) {
    kernels::record_kernel_path("launch", "stream order (device before compute capability 9.0)");
    return false;
  }
  if (!kernel_waits_for_predecessor(kernel)) {
    kernels::record_kernel_path("launch", "stream order (kernel built before architecture 90)");
    return false;
  }
  kernels::record_kernel_path("launch", "programmatic");
  return true;
}

void set_programmatic_launch(int on) {
  g_override.store(on < 0 ? -1 : (on ? 1 : 0));
}

}  // namespace gpt2::cuda
