// The CUDA runtime / driver entry points the host code calls, answered by the emulator: a "device" of
// compute capability 9.0; cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion (so the
// repository's own sm90a_host.cu marshals the tensor-map parameters, unmodified); and, for the GPU test
// suites run on the emulator (emu.sh's gpu_tests), device memory in host memory and streams and events on
// which every launch and copy has completed when its call returns (launches run synchronously).
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
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
cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDriverGetVersion(int* v) {
  *v = 0;  // no driver: the emulator
  return cudaSuccess;
}

// Device memory is host memory: a kernel thread is a host thread. Fresh allocations hold 0xFF bytes (NaN in
// fp32 and bf16), so a kernel that reads what nobody wrote gives NaN, as an unlucky GPU allocation might.
// Each one is registered (TMA bounds checks) and must be freed once.
namespace {
std::mutex g_alloc_mu;
std::set<void*> g_allocs;
}  // namespace
cudaError_t CUDARTAPI cudaMalloc(void** p, size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256;
  *p = std::aligned_alloc(256, rounded ? rounded : 256);
  if (!*p) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xFF, rounded);
  emu::register_global(*p, bytes);
  std::lock_guard<std::mutex> g(g_alloc_mu);
  g_allocs.insert(*p);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaFree(void* p) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    if (g_allocs.erase(p) != 1) {
      emu::note("cudaFree(%p): not an allocation of cudaMalloc, or freed twice", p);
      return cudaErrorInvalidValue;
    }
  }
  emu::unregister_global(p);
  std::free(p);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t CUDARTAPI cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t CUDARTAPI cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t CUDARTAPI cudaMemset(void* p, int value, size_t bytes) {
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) { return cudaMemset(p, value, bytes); }
cudaError_t CUDARTAPI cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                        size_t height, enum cudaMemcpyKind, cudaStream_t) {
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* data) {
  fn(data);  // the stream has nothing pending
  return cudaSuccess;
}

// CUDA graphs are not emulated (launches run when called, so there is nothing to capture): capture fails
// with an error that names it, and the suites' graph tests are left out of the emulated runs.
cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t, enum cudaStreamCaptureMode) {
  emu::note("cudaStreamBeginCapture: CUDA graphs are not emulated");
  return cudaErrorNotSupported;
}
cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t, cudaGraph_t*) { return cudaErrorNotSupported; }
cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t*, cudaGraph_t, unsigned long long) {
  return cudaErrorNotSupported;
}
cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }

// Streams and events: distinct handles, nothing ever pending.
namespace {
struct EmuEvent {
  std::chrono::steady_clock::time_point at;
};
int g_stream_tag;
}  // namespace
cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(new int(++g_stream_tag));
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return cudaStreamCreate(s); }
cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int, int) { return cudaStreamCreate(s); }
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<int*>(s);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0, *greatest = -5;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new EmuEvent{std::chrono::steady_clock::now()});
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }
cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<EmuEvent*>(e);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  reinterpret_cast<EmuEvent*>(e)->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(reinterpret_cast<EmuEvent*>(b)->at - reinterpret_cast<EmuEvent*>(a)->at)
            .count();
  return cudaSuccess;
}
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
