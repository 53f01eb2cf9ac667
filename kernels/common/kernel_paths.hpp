// Which kernel ran for each operation that has more than one: the opt-in Hopper kernels fall back to
// the default path where they do not apply (a shape, an alignment, a device without sm_90a code), and
// without this a run asked for one could measure the other and nobody would know. The CUDA entry
// points record what they launched; gpt2-train prints it once after its first step ("kernels: ..."),
// and tools/gpu-phase.sh checks that each opt-in step ran its opt-in.
#pragma once

#include <string>

namespace gpt2::kernels {

// Records that `op` ran on `path`; both are string literals. Cheap (a short scan under a mutex): it is
// called once per launch of a multi-path operation, a few hundred times a step.
void record_kernel_path(const char* op, const char* path);
// "attention forward: mma.sync; gemm: hand wgmma 128x128, hand mma.sync" (every path each op took, in
// the order first seen), or "" when nothing was recorded.
std::string kernel_paths_used();
void reset_kernel_paths();

}  // namespace gpt2::kernels
