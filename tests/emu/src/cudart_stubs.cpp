// The few CUDA runtime / driver entry points the host code calls, answered by the emulator: a
// "device" of compute capability 9.0, and cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion
// (so the repository's own sm90a_host.cu marshals the tensor-map parameters, unmodified).
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstring>
#include <string>

#include "emu/runtime.h"

namespace {
CUresult CUDAAPI emu_cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank, void* base,
                                            const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                            const cuuint32_t* es, CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                            CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  if (reinterpret_cast<uintptr_t>(map) % 64) {
    emu::note("cuTensorMapEncodeTiled: tensorMap %p not 64-byte aligned", (void*)map);
    return CUDA_ERROR_INVALID_VALUE;
  }
  emu::TensorMapRec rec;
  uint64_t d[5], s[5];
  uint32_t b[5], e[5];
  for (cuuint32_t i = 0; i < rank && i < 5; ++i) {
    d[i] = dims[i], b[i] = box[i], e[i] = es[i];
    if (i + 1 < rank) s[i] = strides[i];
  }
  const std::string err = emu::encode_tensor_map(&rec, dtype, static_cast<int>(rank), base, d, s, b, e, il, sw, l2, oob);
  if (!err.empty()) {
    emu::note("cuTensorMapEncodeTiled: %s", err.c_str());
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::memset(map, 0, sizeof *map);
  std::memcpy(map, &rec, sizeof rec);
  return CUDA_SUCCESS;
}
}  // namespace

extern "C" {
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                                       enum cudaDriverEntryPointQueryResult* status) {
  if (std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0) {
    *fn = reinterpret_cast<void*>(&emu_cuTensorMapEncodeTiled);
    if (status) *status = cudaDriverEntryPointSuccess;
    return cudaSuccess;
  }
  *fn = nullptr;
  if (status) *status = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value > 227 * 1024) return cudaErrorInvalidValue;
    emu::set_max_dynamic_smem(func, value);
  }
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetLastError(void) { return cudaSuccess; }
const char* CUDARTAPI cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int) {
  if (attr == cudaDevAttrComputeCapabilityMajor) *value = 9;
  else if (attr == cudaDevAttrComputeCapabilityMinor) *value = 0;
  else if (attr == cudaDevAttrMultiProcessorCount) *value = static_cast<int>(emu::config().sms);
  else *value = 0;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void*) {
  std::memset(attr, 0, sizeof *attr);
  return cudaSuccess;
}
}

// core/error.hpp's fatal(): print and end the process.
#include "core/error.hpp"
#include <cstdio>
#include <cstdlib>
namespace gpt2 {
void fatal(const std::string& what, const char* file, int line) {
  std::fprintf(stderr, "[gpt2] error: %s", what.c_str());
  if (file) std::fprintf(stderr, " (at %s:%d)", file, line);
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
  std::_Exit(1);
}
}  // namespace gpt2
