#include "kernels/common/device.hpp"

namespace gpt2 {

#ifndef GPT2_HAVE_CUDA
bool built_with_cuda() { return false; }
int gpu_count(std::string* why) {
  if (why) *why = "this binary was built without the CUDA backend (GPT2_ENABLE_CUDA=OFF or no nvcc)";
  return 0;
}
std::string cuda_library_versions() { return ""; }
#else
bool built_with_cuda() { return true; }
// gpu_count() lives in kernels/common/cuda_device.cu.
#endif

}  // namespace gpt2
