// What compute devices this process can see. Kept free of CUDA headers so CPU-only code can ask.
#pragma once

#include <string>

namespace gpt2 {

// True when the binary was built with the CUDA backend.
bool built_with_cuda();
// Number of usable GPUs; 0 when the build has no CUDA or no driver/GPU is present.
// `why` (optional) receives the reason when 0, e.g. "no GPU (cudaGetDeviceCount: ...)".
int gpu_count(std::string* why = nullptr);
// "CUDA runtime 13.0, driver none, cuBLASLt 130000", or "" without the CUDA backend (NCCL's version is
// comm's: nccl_version_string() in comm/nccl_version.hpp, so kernels never load NCCL).
std::string cuda_library_versions();

}  // namespace gpt2
