// NCCL's version, for the banner. Kept apart from the kernels so that kernel tests and benchmarks
// never load libnccl (they must run on a GPU machine that has cuBLASLt but not our NCCL, see GPU.md).
#pragma once

#include <string>

namespace gpt2 {

// "NCCL 2.28.3", or "" when the binary was built without the CUDA backend.
std::string nccl_version_string();

}  // namespace gpt2
