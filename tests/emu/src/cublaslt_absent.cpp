// cuBLASLt is not emulated: gemm_cublaslt.cu is left out of the emulated GPU test build, and these take
// its place. A call is an emulator error naming what happened, never a silent result; the emulated test
// build runs the hand backend alone (GPT2_EMU in tests/gpu/test_gemm.cpp).
#include <cstddef>

#include "emu/runtime.h"
#include "kernels/common/cuda_dtype.hpp"
#include "kernels/gemm/gemm_cuda.hpp"

extern "C" size_t cublasLtGetVersion() { return 0; }  // cuda_library_versions(): "cuBLASLt 0"

namespace gpt2::kernels::detail {
struct CublasLtState {};
void CublasLtStateDeleter::operator()(CublasLtState* s) const { delete s; }
CublasLtState* create_cublaslt_state() { emu::fail("cuBLASLt is not emulated: a GemmContext for kCublasLt was made"); }
template <class T>
void gemm_cublaslt(GemmContext&, T*, const T*, const T*, const T*, T*, int, int, int, bool, bool, bool, GemmEpilogue,
                   cudaStream_t) {
  emu::fail("cuBLASLt is not emulated: gemm_cublaslt was called");
}
template <class T>
bool weight_bias_grad_cublaslt(GemmContext&, T*, float*, const T*, const T*, int, int, int, cudaStream_t) {
  emu::fail("cuBLASLt is not emulated: weight_bias_grad_cublaslt was called");
}
template void gemm_cublaslt<float>(GemmContext&, float*, const float*, const float*, const float*, float*, int, int,
                                   int, bool, bool, bool, GemmEpilogue, cudaStream_t);
template void gemm_cublaslt<bf16>(GemmContext&, bf16*, const bf16*, const bf16*, const bf16*, bf16*, int, int, int,
                                  bool, bool, bool, GemmEpilogue, cudaStream_t);
template bool weight_bias_grad_cublaslt<float>(GemmContext&, float*, float*, const float*, const float*, int, int, int,
                                               cudaStream_t);
template bool weight_bias_grad_cublaslt<bf16>(GemmContext&, bf16*, float*, const bf16*, const bf16*, int, int, int,
                                              cudaStream_t);
}  // namespace gpt2::kernels::detail
