// RAII for CUDA memory, streams and events. Host-safe (g++ compiles it).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <utility>
#include <vector>

#include "kernels/common/cuda_check.cuh"
#include "kernels/common/cuda_dtype.hpp"

namespace gpt2 {

// The error of a cudaMalloc that the device had no room for (device_alloc): how much was asked for, for
// what, and how much the device has left (CUDA's own text is only "out of memory"). Out of line: the
// allocations that inline device_alloc stay small.
[[noreturn]] __attribute__((noinline, cold)) inline void out_of_device_memory(size_t bytes, const char* what) {
  size_t free_bytes = 0, total_bytes = 0;
  char left[96] = "the device's free memory unknown";
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
    std::snprintf(left, sizeof(left), "%.1f MiB free of %.1f MiB on the device", free_bytes / 1048576.0,
                  total_bytes / 1048576.0);
  char text[256];
  std::snprintf(text, sizeof(text), "out of GPU memory: %.1f MiB for %s, with %s", bytes / 1048576.0, what, left);
  fatal(text);
}

// cudaMalloc of `bytes` for `what` (named in the error when the device is full).
inline void* device_alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) out_of_device_memory(bytes, what);
  GPT2_CHECK_GEN(e == cudaSuccess, (msg() << "CUDA: cudaMalloc of " << bytes << " bytes for " << what
                                          << " failed: " << cudaGetErrorString(e)).str());
  return p;
}

// n elements of T in device memory (uninitialised unless zeroed).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }

  // Reallocates (contents lost) when the size changes.
  void resize(size_t n) {
    if (n == n_) return;
    release();
    if (n > 0) p_ = static_cast<T*>(device_alloc(n * sizeof(T), "a device buffer"));
    n_ = n;
  }
  void zero(cudaStream_t s = nullptr) {
    if (n_) CUDA_CHECK(cudaMemsetAsync(p_, 0, n_ * sizeof(T), s));
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  // Host fp32 values -> T (rounded to nearest even for bf16); resizes to fit. Synchronous.
  void upload(const float* src, size_t n) {
    resize(n);
    std::vector<T> tmp(n);
    for (size_t i = 0; i < n; ++i) tmp[i] = from_float_host<T>(src[i]);
    CUDA_CHECK(cudaMemcpy(p_, tmp.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return before the DMA lands, and its (legacy) stream does not
    // order work on non-blocking streams: wait, so "synchronous" holds for every stream.
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  void upload(const std::vector<float>& src) { upload(src.data(), src.size()); }
  // Device T -> host fp32 (the whole buffer, or its first n elements). Synchronous.
  std::vector<float> download(size_t n = static_cast<size_t>(-1)) const {
    if (n > n_) n = n_;
    std::vector<T> tmp(n);
    if (n) CUDA_CHECK(cudaMemcpy(tmp.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = to_float_host(tmp[i]);
    return out;
  }

 private:
  void release() {
    if (p_) cudaFree(p_);  // no CHECK: destructors may run while a fatal error unwinds
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host memory (cudaHostAlloc): the GPU reads it by DMA, so a cudaMemcpyAsync from it is
// asynchronous and needs no bounce through a driver buffer. Call where the rank's device is current.
inline void* pinned_host_allocate(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}
inline void pinned_host_release(void* p) {
  if (p) cudaFreeHost(p);  // no CHECK: may run while a fatal error unwinds
}

// n elements of E in page-locked host memory (pinned_host_allocate), grown on demand: staging for
// asynchronous copies. Contents are lost when it grows; the caller makes sure no copy still uses them.
template <class E>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { pinned_host_release(p_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void resize(size_t n) {
    if (n <= n_) return;
    pinned_host_release(p_);
    p_ = nullptr;  // stays null if the allocation below fails
    p_ = static_cast<E*>(pinned_host_allocate(n * sizeof(E)));
    n_ = n;
  }
  E* data() { return p_; }
  size_t size() const { return n_; }

 private:
  E* p_ = nullptr;
  size_t n_ = 0;
};

class CudaStream {
 public:
  // priority: lower numbers run first (cudaDeviceGetStreamPriorityRange); 0 is the default.
  explicit CudaStream(int priority = 0) {
    CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
  }
  ~CudaStream() {
    if (s_) cudaStreamDestroy(s_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  // Timing events carry timestamps; ordering-only events are cheaper (cudaEventDisableTiming).
  explicit CudaEvent(bool timing = false) {
    CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() {
    if (e_) cudaEventDestroy(e_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(e_, s)); }
  bool done() const {
    cudaError_t err = cudaEventQuery(e_);
    if (err == cudaErrorNotReady) return false;
    CUDA_CHECK(err);
    return true;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace gpt2
