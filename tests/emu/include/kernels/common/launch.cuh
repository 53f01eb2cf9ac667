// EMULATOR SHADOW of kernels/common/launch.cuh: the same declarations; a launch runs as the rewritten
// `<<<` launches do (emu::Launch, in stream order). Whether it would carry the programmatic attribute is
// still decided, and recorded for the kernels line, by the repository's own kernels/common/launch.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "emu/runtime.h"

namespace gpt2::cuda {

bool programmatic_launch(const void* kernel);
void set_programmatic_launch(int on);

template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  (void)programmatic_launch(reinterpret_cast<const void*>(kernel));
  ::emu::Launch(grid, block, smem, stream).run(kernel, std::forward<A>(args)...);
}

}  // namespace gpt2::cuda
