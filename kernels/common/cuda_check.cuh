// CUDA_CHECK: the CUDA member of the one error family (core/error.hpp).
#pragma once

#include <cuda_runtime.h>

#include "core/error.hpp"

#define CUDA_CHECK(call)                                                                       \
  do {                                                                                         \
    cudaError_t gpt2_err_ = (call);                                                            \
    GPT2_CHECK_GEN(gpt2_err_ == cudaSuccess,                                                   \
                   (::gpt2::msg() << "CUDA: " #call " failed: " << cudaGetErrorString(gpt2_err_)).str()); \
  } while (0)
