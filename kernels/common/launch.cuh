// The one way kernels/ launches a kernel (tools/check_launches.py: no `<<<` elsewhere in kernels/ or src/).
//
// With GPT2_PDL=on, on a device of compute capability 9.0 or later, every launch carries the programmatic
// dependent launch attribute (cudaLaunchAttributeProgrammaticStreamSerialization): the runtime may launch
// the kernel, and dispatch its blocks, while the kernel before it in the stream is still finishing, once
// that kernel has asked for it. Every kernel of kernels/ asks for it and then waits for its predecessor in
// its first statement (ptx.cuh, griddep_launch_dependents_then_wait), so what a kernel reads and writes is
// ordered exactly as in plain stream order; what is saved is the launch and the block dispatch between
// two kernels, on the device (a CUDA graph saves the host's launch work, not this). Off (the default until
// a lent GPU has measured it: docs/performance.md), the same call is an ordinary launch.
// Kernels of other libraries (cuBLASLt) and memsets or copies in between keep plain stream order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kernels/common/cuda_check.cuh"

namespace gpt2::cuda {

// Whether a launch of `kernel` on the current device carries the programmatic attribute: GPT2_PDL (off | on,
// read once; anything else is fatal) or set_programmatic_launch's override, a device of compute capability
// >= 9.0 (before it the attribute does nothing), and the kernel's code compiled from PTX of architecture 90
// or later (in code for 80 the prologue is nothing, so such a kernel would not wait). Where it was asked for,
// records the answer for the kernels line ("launch: programmatic", or "launch: stream order (why)"); off,
// records nothing.
bool programmatic_launch(const void* kernel);
// For benchmarks and tests: 0 or 1 overrides GPT2_PDL, -1 goes back to it.
void set_programmatic_launch(int on);

// kernel<<<grid, block, smem, stream>>>(args...), with the attribute above where programmatic_launch().
// The arguments are converted to the kernel's parameter types as a `<<<` launch converts them. A bad
// configuration is fatal here, naming this call; the caller's CUDA_CHECK_LAUNCH finds nothing more.
template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic_launch(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
}

}  // namespace gpt2::cuda
