// Host helpers of the sm_90a kernels (sm90a_host.cuh).
#include "kernels/common/sm90a_host.cuh"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>

#include "core/error.hpp"
#include "kernels/common/cuda_check.cuh"

namespace gpt2::kernels {

namespace {

// cuTensorMapEncodeTiled from the driver through cudart, so nothing links libcuda (cudart is static).
// cudaGetDriverEntryPointByVersion: the unversioned cudaGetDriverEntryPoint is deprecated in CUDA 13.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &status));
    GPT2_CHECK(status == cudaDriverEntryPointSuccess && f != nullptr,
               "the CUDA driver has no cuTensorMapEncodeTiled (needs a CUDA 12+ driver): run without the sm_90a "
               "kernels (GPT2_GEMM_SM90=0 with --gemm hand; unset GPT2_ATTENTION_FWD and GPT2_ATTENTION_BWD)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_bf16_tensor_map(const __nv_bfloat16* base, int rank, const uint64_t* dims,
                                 const uint64_t* byte_strides, const uint32_t* box, const char* what) {
  GPT2_CHECK(rank >= 2 && rank <= 3, "tensor map for " << what << ": rank " << rank << " (2 or 3 supported)");
  CUtensorMap map;
  cuuint64_t d[3], s[2];
  cuuint32_t bx[3], elem_strides[3] = {1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    bx[i] = box[i];
    if (i + 1 < rank) s[i] = byte_strides[i];
  }
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank), const_cast<__nv_bfloat16*>(base), d, s,
      bx, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  GPT2_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult " << static_cast<int>(r) << ") for " << what
                                                                           << ": " << dims[1] << " x " << dims[0]
                                                                           << (rank == 3 ? " x batches" : "")
                                                                           << " bf16, row stride " << byte_strides[0]
                                                                           << " bytes");
  return map;
}

bool sm90a_kernel_runs_here(const void* kernel) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();  // no device: not an error here, just not ready
    return false;
  }
  if (major != 9 || minor != 0) return false;
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

int sm_count() {
  // Asked at every persistent launch: remembered per device (a process may switch devices).
  static std::atomic<int> known[64] = {};
  int dev = 0, count = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && (count = known[dev].load(std::memory_order_relaxed)) > 0) return count;
  CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
  if (dev < 64) known[dev].store(count, std::memory_order_relaxed);
  return count;
}

}  // namespace gpt2::kernels
