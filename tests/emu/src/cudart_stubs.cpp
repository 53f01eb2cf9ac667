// The CUDA runtime / driver entry points the host code calls, answered by the emulator: a "device" of
// compute capability 9.0; cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion (so the
// repository's own sm90a_host.cu marshals the tensor-map parameters, unmodified); and, for the GPU test
// suites and the training programs run on the emulator (emu.sh --gpu-tests, --train), device memory in host
// memory, copies, and streams and events: synchronous by default, as on a GPU with EMU_ASYNC_STREAMS=1
// (below, "Streams and events").
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

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
// A launch's error (emu::set_launch_error: one refused during a capture) until cudaGetLastError takes it.
static thread_local cudaError_t t_last_error = cudaSuccess;
cudaError_t CUDARTAPI cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return t_last_error; }
// One device, or EMU_DEVICES of them (emu.sh --train: two ranks, each with a device of its own, as NCCL wants).
// They are all the same host memory; the device number is only checked.
namespace {
int emu_devices() {
  const char* e = std::getenv("EMU_DEVICES");
  const int n = e ? std::atoi(e) : 1;
  return n > 0 ? n : 1;
}
// The device's memory: 80 GiB as on the lent H100, or EMU_DEVICE_MEMORY_MIB (a device that a program fills,
// to see how it fails). Every device of EMU_DEVICES has this much, counted together (one process uses one).
size_t emu_device_memory() {
  static const size_t bytes = [] {
    const char* e = std::getenv("EMU_DEVICE_MEMORY_MIB");
    const long long mib = e ? std::atoll(e) : 0;
    return mib > 0 ? static_cast<size_t>(mib) << 20 : size_t{80} << 30;
  }();
  return bytes;
}
}  // namespace
cudaError_t CUDARTAPI cudaGetDeviceCount(int* n) {
  *n = emu_devices();
  return cudaSuccess;
}
static thread_local int t_device = 0;  // cudaSetDevice's, per host thread as CUDA keeps it
cudaError_t CUDARTAPI cudaSetDevice(int d) {
  if (d < 0 || d >= emu_devices()) return cudaErrorInvalidDevice;
  t_device = d;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp* prop, int d) {
  if (d < 0 || d >= emu_devices()) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "emulated sm_90 (tests/emu, on the CPU)");
  prop->major = 9, prop->minor = 0;
  prop->multiProcessorCount = static_cast<int>(emu::config().sms);
  prop->totalGlobalMem = emu_device_memory();
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->warpSize = 32;
  return cudaSuccess;
}
// The device's memory, less what cudaMalloc holds: the training binaries report their device memory in use
// after the first step (against their estimate) from this.
namespace {
std::mutex g_alloc_mu;
std::map<void*, size_t> g_allocs;  // cudaMalloc's live allocations and their sizes
size_t g_alloc_bytes = 0;
}  // namespace
cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = emu_device_memory();
  std::lock_guard<std::mutex> g(g_alloc_mu);
  *free_bytes = *total_bytes - g_alloc_bytes;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDriverGetVersion(int* v) {
  *v = 0;  // no driver: the emulator
  return cudaSuccess;
}

namespace {
cudaError_t unsafe_during_capture(const char* call);  // below, with the streams
}  // namespace

// Device memory is host memory: a kernel thread is a host thread. Fresh allocations hold 0xFF bytes (NaN in
// fp32 and bf16), so a kernel that reads what nobody wrote gives NaN, as an unlucky GPU allocation might.
// Each one is registered (TMA bounds checks) and must be freed once.
cudaError_t CUDARTAPI cudaMalloc(void** p, size_t bytes) {
  if (cudaError_t e = unsafe_during_capture("cudaMalloc")) return e;
  const size_t rounded = (bytes + 255) / 256 * 256;
  // More than the device has left is refused as the runtime refuses it: *p untouched, and the error also
  // this thread's last error (cudaGetLastError), not sticky. Reserved first, under the lock.
  {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    if (bytes > emu_device_memory() - g_alloc_bytes) return t_last_error = cudaErrorMemoryAllocation;
    g_alloc_bytes += bytes;
  }
  void* q = std::aligned_alloc(256, rounded ? rounded : 256);
  if (!q) {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    g_alloc_bytes -= bytes;
    return t_last_error = cudaErrorMemoryAllocation;
  }
  std::memset(q, 0xFF, rounded);
  emu::register_global(q, bytes);
  {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    g_allocs[q] = bytes;
  }
  *p = q;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaFree(void* p) {
  if (cudaError_t e = unsafe_during_capture("cudaFree")) return e;
  if (!p) return cudaSuccess;
  cudaDeviceSynchronize();  // as cudaFree does: no queued work may still use it
  {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    const auto it = g_allocs.find(p);
    if (it == g_allocs.end()) {
      emu::note("cudaFree(%p): not an allocation of cudaMalloc, or freed twice", p);
      return cudaErrorInvalidValue;
    }
    g_alloc_bytes -= it->second;
    g_allocs.erase(it);
  }
  emu::unregister_global(p);
  std::free(p);
  return cudaSuccess;
}
// Page-locked host memory: a cudaMemcpyAsync to or from it is asynchronous (pageable memory is not: below).
namespace {
std::map<void*, size_t> g_pinned;  // under g_alloc_mu
// Whether p lies in the allocation map m (cudaMalloc's or cudaHostAlloc's) holds
bool inside(const std::map<void*, size_t>& m, const void* p) {
  std::lock_guard<std::mutex> g(g_alloc_mu);
  auto it = m.upper_bound(const_cast<void*>(p));
  if (it == m.begin()) return false;
  --it;
  return static_cast<const char*>(p) < static_cast<const char*>(it->first) + std::max<size_t>(it->second, 1);
}
bool is_pinned(const void* p) { return inside(g_pinned, p); }
bool is_device(const void* p) { return inside(g_allocs, p); }
}  // namespace
cudaError_t CUDARTAPI cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  if (cudaError_t e = unsafe_during_capture("cudaHostAlloc")) return e;
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (!*p) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> g(g_alloc_mu);
  g_pinned[*p] = bytes;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t CUDARTAPI cudaFreeHost(void* p) {
  if (cudaError_t e = unsafe_during_capture("cudaFreeHost")) return e;
  cudaDeviceSynchronize();  // as cudaFreeHost does
  {
    std::lock_guard<std::mutex> g(g_alloc_mu);
    g_pinned.erase(p);
  }
  std::free(p);
  return cudaSuccess;
}

// Copies, by CUDA's "API synchronization behavior" rules, taking each "might" as "might not" (so code that
// relies on one fails here instead of on some GPU):
//  * cudaMemcpy: from pageable memory to the device, the stream synchronises, the source is staged before the
//    call returns, and the copy lands later; device to device returns at once; to pageable memory, from
//    pinned memory, and host to host, the call returns once the copy has landed. It runs on the legacy
//    default stream.
//  * cudaMemcpyAsync / cudaMemcpy2DAsync: queued on the stream, the source read when the copy runs; only host
//    to host is synchronous.
namespace {
cudaError_t copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                    cudaStream_t s, bool sync_call) {
  if (!width || !height) return cudaSuccess;
  auto* d = static_cast<char*>(dst);
  const auto* from = static_cast<const char*>(src);
  const bool src_dev = is_device(src), dst_dev = is_device(dst);
  const bool src_pageable = !src_dev && !is_pinned(src);
  std::shared_ptr<std::vector<char>> staged;
  if (sync_call && src_pageable && dst_dev) {
    cudaStreamSynchronize(s);  // "a stream sync is performed before the copy is initiated"
    staged = std::make_shared<std::vector<char>>(width * height);
    for (size_t r = 0; r < height; ++r) std::memcpy(staged->data() + r * width, from + r * spitch, width);
    from = staged->data();
    spitch = width;
  }
  if (cudaError_t e = emu::stream_submit(s, [d, dpitch, from, spitch, width, height, staged]() {
        for (size_t r = 0; r < height; ++r) std::memmove(d + r * dpitch, from + r * spitch, width);
        return true;
      }, "memcpy"))
    return e;
  const bool host_to_host = !src_dev && !dst_dev;
  const bool waits = host_to_host || (sync_call && !(src_pageable && dst_dev) && !(src_dev && dst_dev));
  return waits ? cudaStreamSynchronize(s) : cudaSuccess;
}
}  // namespace
cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind) {
  if (cudaError_t e = unsafe_during_capture("cudaMemcpy")) return e;
  return copy_2d(dst, bytes, src, bytes, bytes, 1, nullptr, true);
}
cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind, cudaStream_t s) {
  return copy_2d(dst, bytes, src, bytes, bytes, 1, s, false);
}
cudaError_t CUDARTAPI cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                        size_t height, enum cudaMemcpyKind, cudaStream_t s) {
  return copy_2d(dst, dpitch, src, spitch, width, height, s, false);
}
// Asynchronous on device memory (cudaMemset too: "asynchronous with respect to the host except when the
// target memory is pinned host memory").
cudaError_t CUDARTAPI cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  return emu::stream_submit(s, [p, value, bytes]() {
    std::memset(p, value, bytes);
    return true;
  }, "memset");
}
cudaError_t CUDARTAPI cudaMemset(void* p, int value, size_t bytes) {
  if (cudaError_t e = unsafe_during_capture("cudaMemset")) return e;
  if (cudaError_t e = cudaMemsetAsync(p, value, bytes, nullptr)) return e;
  return is_device(p) ? cudaSuccess : cudaStreamSynchronize(nullptr);  // pinned host memory: synchronous
}
}  // extern "C"

// Streams and events. By default a stream runs what it is given when it is given it (the caller runs it), so
// every launch and copy has completed when its call returns. With EMU_ASYNC_STREAMS=1 they run as on a GPU:
// each stream is a queue, and one device thread takes the next operation of a stream chosen at random
// (EMU_SEED) among those whose head may run, each only once a random 0..EMU_STREAM_DELAY_US (default
// 2000) has passed since it was enqueued, or at once while a host thread waits for the device. Work on
// different streams then interleaves in any order their events allow, and the host sees a result only after
// it synchronises: a missing cudaStreamWaitEvent, or a host read before its stream synchronised, gives
// wrong values instead of passing by luck. The legacy default stream (0) waits for all earlier work of the
// blocking streams (cudaStreamCreate) and they for its, and not the non-blocking ones
// (cudaStreamNonBlocking), as CUDA's "default stream" semantics say. Operations run one at a time (kernels
// never overlap); an operation may take several turns (an emulated NCCL collective is started by its first
// turn and polled by the next ones, while the device thread runs other streams).
namespace {
using Clock = std::chrono::steady_clock;
// An event's state, shared with the operations that record it or wait for it: CUDA lets an event be
// destroyed while a stream still waits for one of its records.
struct EventState {
  uint64_t recorded = 0;  // cudaEventRecord calls
  // Which records have run: all up to `prefix`, and those in `later` (records on different streams may run
  // out of order, and a wait is for the record it took, not for any later one)
  uint64_t prefix = 0;
  std::set<uint64_t> later;
  Clock::time_point at;
  uint64_t captured_in = 0;  // the capture that made its last record (Capture::id), 0 if none
  bool done(uint64_t n) const { return n <= prefix || later.count(n); }
  void complete(uint64_t n) {
    later.insert(n);
    while (later.count(prefix + 1)) later.erase(++prefix);
  }
};
struct EmuEvent {
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};
struct Op {
  std::function<bool()> fn;  // empty: a wait for wait_event to reach wait_count
  std::shared_ptr<EventState> wait_event;
  uint64_t wait_count = 0;
  const char* what = "";
  uint64_t seq = 0;
  Clock::time_point eligible;
};
struct EmuStream {
  bool blocking = true;
  std::deque<Op> ops;
  bool destroyed = false;
};
// A graph: what a capture recorded, in stream order (one stream's capture is a chain). A node is an
// operation, or a host function (a fresh operation for each launch, cudaLaunchHostFunc's state being per run).
struct Node {
  std::function<bool()> fn;
  cudaHostFn_t host_fn = nullptr;
  void* host_data = nullptr;
  const char* what = "";
};
struct EmuGraph {
  std::vector<Node> nodes;
};
struct Capture {
  uint64_t id = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;  // the one that began it
  std::vector<Node> nodes;
  std::string invalid;  // why it was invalidated ("": it was not)
};

struct Engine {
  bool async = false;
  unsigned delay_us = 2000;
  std::mutex mu;
  std::condition_variable cv;
  EmuStream legacy;
  std::set<EmuStream*> streams;  // the created ones
  uint64_t seq = 0;
  int waiters = 0;  // host threads waiting for the device: everything may run at once
  std::mt19937_64 rng;
  std::map<EmuStream*, Capture> captures;  // the streams being captured
  uint64_t capture_ids = 0;
  std::atomic<uint64_t> graphs_made{0}, graph_nodes{0}, graph_launches{0};  // for the report at exit

  Engine() {
    const char* a = std::getenv("EMU_ASYNC_STREAMS");
    async = a && std::atoi(a) != 0;
    if (const char* d = std::getenv("EMU_STREAM_DELAY_US")) delay_us = static_cast<unsigned>(std::atoi(d));
    rng.seed(emu::config().seed * 7919u + 17u);
    if (async) std::thread([this] { run_device(); }).detach();  // the device: runs until the process exits
  }
  EmuStream* of(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &legacy;
    return reinterpret_cast<EmuStream*>(s);
  }
  // Whether the head of st may run: its wait is satisfied and the legacy stream's ordering holds.
  bool ready(EmuStream* st) {
    const Op& op = st->ops.front();
    if (!op.fn && !op.wait_event->done(op.wait_count)) return false;
    if (st == &legacy) {
      for (EmuStream* o : streams)
        if (o->blocking && !o->ops.empty() && o->ops.front().seq < op.seq) return false;
    } else if (st->blocking && !legacy.ops.empty() && legacy.ops.front().seq < op.seq) {
      return false;
    }
    return true;
  }
  void run_device() {
    std::unique_lock<std::mutex> lk(mu);
    std::vector<EmuStream*> can;
    for (;;) {
      can.clear();
      Clock::time_point next = Clock::now() + std::chrono::milliseconds(50);
      const Clock::time_point now = Clock::now();
      auto consider = [&](EmuStream* st) {
        if (st->ops.empty() || !ready(st)) return;
        const Op& op = st->ops.front();
        if (waiters > 0 || op.eligible <= now) can.push_back(st);
        else next = std::min(next, op.eligible);
      };
      consider(&legacy);
      for (EmuStream* st : streams) consider(st);
      if (can.empty()) {
        if (idle()) {
          stalled_since = now;
        } else if (now - stalled_since > std::chrono::seconds(stall_report_s) && !reported) {
          report();  // once: what every stream waits for (the host may still be polling an event)
          reported = true;
        }
        cv.wait_until(lk, next);
        continue;
      }
      stalled_since = now;
      reported = false;
      EmuStream* st = can[rng() % can.size()];
      Op& op = st->ops.front();
      bool done = true;
      if (op.fn) {
        std::function<bool()> fn = op.fn;  // the queue may grow (and move) while it runs
        lk.unlock();
        done = fn();
        lk.lock();
      }
      if (done) {
        st->ops.pop_front();
        if (st->destroyed && st->ops.empty()) {
          streams.erase(st);
          delete st;
        }
        cv.notify_all();
      } else {
        // In progress (a collective waiting for its peers): the stream stays busy; come back shortly.
        st->ops.front().eligible = Clock::now() + std::chrono::microseconds(100);
        if (waiters > 0) {
          lk.unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          lk.lock();
        }
      }
    }
  }
  // Work is queued and none of it can run: every head waits for an event no queued record will complete.
  // On a GPU that work would never run either.
  Clock::time_point stalled_since = Clock::now();
  bool reported = false;
  int stall_report_s = static_cast<int>(emu::config().timeout_s);  // EMU_TIMEOUT_S
  std::string describe(const EmuStream* st) {
    if (st == &legacy) return "the legacy default stream";
    char b[64];
    std::snprintf(b, sizeof b, "stream %p (%s)", static_cast<const void*>(st), st->blocking ? "blocking" : "non-blocking");
    return b;
  }
  void report() {
    emu::note("streams: queued work has not run for %d s; each stream's first operations:", stall_report_s);
    auto show = [&](const EmuStream* st) {
      if (st->ops.empty()) return;
      std::string line = describe(st) + ":";
      int shown = 0;
      for (const Op& op : st->ops) {
        if (++shown > 4) break;
        char b[160];
        if (op.fn) std::snprintf(b, sizeof b, " [#%llu %s]", static_cast<unsigned long long>(op.seq), op.what);
        else
          std::snprintf(b, sizeof b, " [#%llu wait for event %p record %llu, records 1..%llu completed]",
                        static_cast<unsigned long long>(op.seq), static_cast<const void*>(op.wait_event.get()),
                        static_cast<unsigned long long>(op.wait_count),
                        static_cast<unsigned long long>(op.wait_event->prefix));
        line += b;
      }
      line += " (" + std::to_string(st->ops.size()) + " queued)";
      emu::note("  %s", line.c_str());
    };
    show(&legacy);
    for (const EmuStream* st : streams) show(st);
  }
  // ---- stream capture (under mu) ----
  Capture* capture_of(cudaStream_t s) {
    auto it = captures.find(of(s));
    return it == captures.end() ? nullptr : &it->second;
  }
  // A query or sync of an event last recorded in a capture: cudaErrorCapturedEvent, and "when an invalid
  // operation is attempted during stream capture, any associated capture graphs are invalidated".
  cudaError_t captured_event_used(const EventState& ev, const char* call) {
    for (auto& [st, c] : captures)
      if (c.id == ev.captured_in) invalidate(c, std::string(call) + " of an event recorded in the capture");
    return cudaErrorCapturedEvent;
  }
  // The capture fails at cudaStreamEndCapture (cudaErrorStreamCaptureInvalidated), as CUDA's does; the
  // first reason is said.
  void invalidate(Capture& c, const std::string& why) {
    if (!c.invalid.empty()) return;
    c.invalid = why;
    emu::note("stream capture %llu invalidated: %s", static_cast<unsigned long long>(c.id), why.c_str());
  }
  // A call CUDA calls "potentially unsafe" during capture (it synchronises, or allocates outside the stream
  // order): an error, and the end of every capture it may interfere with (global mode: from any thread;
  // thread-local mode: from the capturing thread; relaxed: none).
  cudaError_t unsafe_call(const char* call) {
    std::lock_guard<std::mutex> g(mu);
    bool hit = false;
    for (auto& [st, c] : captures)
      if (c.mode == cudaStreamCaptureModeGlobal ||
          (c.mode == cudaStreamCaptureModeThreadLocal && c.thread == std::this_thread::get_id())) {
        invalidate(c, std::string(call) + " while a stream is captured (cudaErrorStreamCaptureUnsupported)");
        hit = true;
      }
    return hit ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
  }
  // Work for the legacy stream would wait for a captured blocking stream, which CUDA refuses: the call fails
  // (cudaErrorStreamCaptureImplicit) and the capture is invalidated.
  bool implicit_dependency(EmuStream* st, const char* what) {
    if (st != &legacy) return false;
    bool hit = false;
    for (auto& [other, c] : captures)
      if (other->blocking) {
        invalidate(c, std::string(what) + " on the legacy default stream while a blocking stream is captured "
                                          "(cudaErrorStreamCaptureImplicit)");
        hit = true;
      }
    return hit;
  }
  // Where submit's operation went: into a capture, refused, or (false) to the queue.
  enum class Route { kQueue, kCaptured, kRefused };
  Route route(EmuStream* st, std::function<bool()>& fn, const char* what) {
    if (captures.empty()) return Route::kQueue;
    auto it = captures.find(st);
    if (it != captures.end()) {
      if (!fn) {  // an event wait that raced with the capture's beginning (cudaStreamWaitEvent decides under mu)
        invalidate(it->second, "an event wait enqueued as the capture began");
        return Route::kRefused;
      }
      it->second.nodes.push_back({std::move(fn), nullptr, nullptr, what});
      return Route::kCaptured;
    }
    return implicit_dependency(st, what) ? Route::kRefused : Route::kQueue;
  }

  cudaError_t submit(cudaStream_t s, std::function<bool()> fn, std::shared_ptr<EventState> ev, uint64_t count,
                     const char* what) {
    std::unique_lock<std::mutex> lk(mu);
    EmuStream* st = of(s);
    switch (route(st, fn, what)) {
      case Route::kCaptured: return cudaSuccess;
      case Route::kRefused: return st == &legacy ? cudaErrorStreamCaptureImplicit : cudaErrorStreamCaptureInvalidated;
      case Route::kQueue: break;
    }
    if (!async) {
      lk.unlock();
      if (fn) while (!fn()) std::this_thread::yield();
      return cudaSuccess;
    }
    queue_locked(st, std::move(fn), std::move(ev), count, what);
    return cudaSuccess;
  }
  void queue_locked(EmuStream* st, std::function<bool()> fn, std::shared_ptr<EventState> ev, uint64_t count,
                    const char* what) {
    Op op;
    op.fn = std::move(fn);
    op.wait_event = std::move(ev);
    op.wait_count = count;
    op.what = what;
    op.seq = ++seq;
    op.eligible = Clock::now() + std::chrono::microseconds(delay_us ? rng() % (delay_us + 1) : 0);
    st->ops.push_back(std::move(op));
    cv.notify_all();
  }
  // An event wait, queued under mu (cudaStreamWaitEvent decides capture and queue in one hold of the lock).
  // With streams run in the call every earlier record has run: nothing to wait for.
  cudaError_t submit_wait_locked(cudaStream_t s, std::shared_ptr<EventState> ev, uint64_t count) {
    if (async) queue_locked(of(s), nullptr, std::move(ev), count, "event wait");
    return cudaSuccess;
  }
  // Blocks the calling host thread until done() holds (checked under the lock), everything runnable
  // running at once meanwhile.
  template <class F>
  void wait(F done) {
    if (!async) return;
    std::unique_lock<std::mutex> lk(mu);
    ++waiters;
    cv.notify_all();
    cv.wait(lk, [&] { return done(); });
    --waiters;
  }
  bool idle() {
    if (!legacy.ops.empty()) return false;
    for (EmuStream* st : streams)
      if (!st->ops.empty()) return false;
    return true;
  }
};
Engine& engine() {
  static Engine* e = new Engine;  // never destroyed: the device thread may run until exit
  return *e;
}
}  // namespace

namespace emu {
cudaError_t stream_submit(cudaStream_t s, std::function<bool()> op, const char* what) {
  return engine().submit(s, std::move(op), nullptr, 0, what);
}
void set_launch_error(cudaError_t e) {
  if (t_last_error == cudaSuccess) t_last_error = e;
}
bool async_streams() { return engine().async; }
bool is_device_memory(const void* p) { return is_device(p); }
bool stream_capturing(cudaStream_t s) {
  Engine& e = engine();
  std::lock_guard<std::mutex> g(e.mu);
  return e.captures.count(e.of(s)) != 0;
}
}  // namespace emu

namespace {
cudaError_t unsafe_during_capture(const char* call) { return engine().unsafe_call(call); }
bool capture_host_func(cudaStream_t s, cudaHostFn_t fn, void* data) {
  Engine& e = engine();
  std::lock_guard<std::mutex> g(e.mu);
  Capture* c = e.capture_of(s);
  if (c) c->nodes.push_back({nullptr, fn, data, "host function"});
  return c != nullptr;  // (not captured: stream_submit makes the legacy-stream check)
}
// One run of fn(data) as a stream operation; a graph launch makes a fresh one for each launch.
std::function<bool()> host_func_op(cudaHostFn_t fn, void* data) {
  if (!emu::async_streams())
    return [fn, data]() {
      fn(data);
      return true;
    };
  auto done = std::make_shared<std::atomic<int>>(-1);  // -1 not started, 0 running, 1 done
  return [fn, data, done]() {
    if (done->load() < 0) {
      done->store(0);
      std::thread([fn, data, done] {
        fn(data);
        done->store(1);
      }).detach();
    }
    return done->load() == 1;
  };
}
}  // namespace

extern "C" {

// With asynchronous streams the function runs on a thread of its own, as on CUDA's driver thread: it holds
// up its stream only, while the device runs the others. A captured one becomes a node of the graph.
cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  if (capture_host_func(s, fn, data)) return cudaSuccess;
  return emu::stream_submit(s, host_func_op(fn, data), "host function");
}

cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int) {
  Engine& e = engine();
  auto* st = new EmuStream;
  st->blocking = (flags & cudaStreamNonBlocking) == 0;
  std::lock_guard<std::mutex> g(e.mu);
  e.streams.insert(st);
  *s = reinterpret_cast<cudaStream_t>(st);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  return cudaStreamCreateWithPriority(s, flags, 0);
}
cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithPriority(s, 0, 0); }
// Returns at once; the stream's queued work still runs, and the stream goes when it has.
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t s) {
  Engine& e = engine();
  std::lock_guard<std::mutex> g(e.mu);
  EmuStream* st = e.of(s);
  if (st == &e.legacy) return cudaErrorInvalidResourceHandle;
  if (st->ops.empty()) {
    e.streams.erase(st);
    delete st;
  } else {
    st->destroyed = true;
  }
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t s) {
  Engine& e = engine();
  EmuStream* st = e.of(s);
  {
    std::lock_guard<std::mutex> g(e.mu);
    if (Capture* c = e.capture_of(s)) {
      e.invalidate(*c, "cudaStreamSynchronize of the stream being captured (cudaErrorStreamCaptureUnsupported)");
      return cudaErrorStreamCaptureUnsupported;
    }
    if (e.implicit_dependency(st, "cudaStreamSynchronize")) return cudaErrorStreamCaptureImplicit;
  }
  e.wait([&] { return st->ops.empty(); });
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  Engine& e = engine();
  if (cudaError_t err = unsafe_during_capture("cudaDeviceSynchronize")) return err;
  e.wait([&] { return e.idle(); });
  return cudaSuccess;
}
// During capture, a captured stream may wait for a record of its own capture (one stream's capture is in
// order already); CUDA refuses a record from outside it (cudaErrorStreamCaptureIsolation, unless the wait
// says cudaEventWaitExternal, which the emulator does not do). A stream outside the capture that waits for a
// captured record would join the capture (a fork): not emulated, and said so.
cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags) {
  Engine& e = engine();
  std::shared_ptr<EventState> st = reinterpret_cast<EmuEvent*>(ev)->state;
  std::lock_guard<std::mutex> g(e.mu);  // capture and queue decided in one hold
  const uint64_t count = st->recorded;  // the most recent record, as CUDA's wait takes it
  {
    Capture* live = nullptr;  // the capture that made the event's last record, if it is still going
    for (auto& [other, c] : e.captures)
      if (st->captured_in && c.id == st->captured_in) live = &c;
    if (Capture* c = e.capture_of(s)) {
      if (flags != 0) {
        e.invalidate(*c, "cudaStreamWaitEvent with flags (cudaEventWaitExternal) is not emulated");
        return cudaErrorNotSupported;
      }
      if (st->captured_in == c->id || (st->captured_in == 0 && count == 0)) return cudaSuccess;
      // "It is invalid to merge two separate capture graphs by waiting on a captured event" (Programming
      // Guide, Prohibited and Unhandled Operations); an event from outside crosses the capture's boundary.
      const bool merge = live != nullptr;
      e.invalidate(*c, merge ? "cudaStreamWaitEvent for an event of another capture (cudaErrorStreamCaptureMerge)"
                             : "cudaStreamWaitEvent for an event recorded outside the capture "
                               "(cudaErrorStreamCaptureIsolation)");
      return merge ? cudaErrorStreamCaptureMerge : cudaErrorStreamCaptureIsolation;
    }
    if (live) {
      e.invalidate(*live, "another stream waits for an event recorded in the capture: a fork, not emulated");
      emu::note("cudaStreamWaitEvent: a wait for a captured event (a fork of the capture) is not emulated");
      return cudaErrorNotSupported;
    }
    if (st->captured_in) return cudaErrorCapturedEvent;  // its capture has ended: the record is in a graph
    if (e.implicit_dependency(e.of(s), "cudaStreamWaitEvent")) return cudaErrorStreamCaptureImplicit;
  }
  // A never-recorded event: nothing to wait for, as in CUDA
  return count ? e.submit_wait_locked(s, std::move(st), count) : cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0, *greatest = -5;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* e) {
  auto* ev = new EmuEvent;
  ev->state->at = Clock::now();
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }
// Queued records and waits keep its state.
cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t ev) {
  delete reinterpret_cast<EmuEvent*>(ev);
  return cudaSuccess;
}
// A record in a captured stream only orders the capture: the event is "captured" until recorded again
// outside one, and querying or synchronising it is an error (cudaErrorCapturedEvent).
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  Engine& e = engine();
  std::shared_ptr<EventState> st = reinterpret_cast<EmuEvent*>(ev)->state;
  uint64_t n;
  {
    std::lock_guard<std::mutex> g(e.mu);
    if (Capture* c = e.capture_of(s)) {
      st->captured_in = c->id;
      return cudaSuccess;
    }
    st->captured_in = 0;
    n = ++st->recorded;
  }
  const cudaError_t err = e.submit(s, [&e, st, n]() {
    std::lock_guard<std::mutex> g(e.mu);  // (an operation runs with the engine unlocked)
    st->complete(n);
    st->at = Clock::now();
    return true;
  }, nullptr, 0, "event record");
  if (err != cudaSuccess) {  // refused (cudaErrorStreamCaptureImplicit): the record was not made
    std::lock_guard<std::mutex> g(e.mu);
    if (st->recorded == n) --st->recorded;
  }
  return err;
}
cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t ev) {
  Engine& e = engine();
  const EventState& st = *reinterpret_cast<EmuEvent*>(ev)->state;
  std::lock_guard<std::mutex> g(e.mu);
  if (st.captured_in) return e.captured_event_used(st, "cudaEventQuery");
  return st.done(st.recorded) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t ev) {
  Engine& e = engine();
  std::shared_ptr<EventState> st = reinterpret_cast<EmuEvent*>(ev)->state;
  uint64_t n;
  {
    std::lock_guard<std::mutex> g(e.mu);
    if (st->captured_in) return e.captured_event_used(*st, "cudaEventSynchronize");
    n = st->recorded;
  }
  e.wait([&] { return st->done(n); });
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  Engine& e = engine();
  const EventState& sa = *reinterpret_cast<EmuEvent*>(a)->state;
  const EventState& sb = *reinterpret_cast<EmuEvent*>(b)->state;
  std::lock_guard<std::mutex> g(e.mu);
  if (sa.captured_in || sb.captured_in) return cudaErrorCapturedEvent;
  if (!sa.done(sa.recorded) || !sb.done(sb.recorded)) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(sb.at - sa.at).count();
  return cudaSuccess;
}
// CUDA graphs made by stream capture (all the repository makes): BeginCapture .. EndCapture records what
// the stream is given instead of running it; a launch of the instantiated graph queues the same operations
// on the launch stream, with the kernel arguments and copy addresses they were captured with. What CUDA
// refuses during capture is refused here, with the capture invalidated (above: unsafe calls, syncs and
// queries of the captured stream or its events, implicit legacy-stream dependencies, outside events).
cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  Engine& e = engine();
  std::lock_guard<std::mutex> g(e.mu);
  EmuStream* st = e.of(s);
  if (st == &e.legacy) return cudaErrorStreamCaptureUnsupported;  // "may not be initiated if stream is legacy"
  if (e.captures.count(st)) return cudaErrorIllegalState;
  Capture& c = e.captures[st];
  c.id = ++e.capture_ids;
  c.mode = mode;
  c.thread = std::this_thread::get_id();
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  Engine& e = engine();
  std::lock_guard<std::mutex> g(e.mu);
  *graph = nullptr;
  auto it = e.captures.find(e.of(s));
  if (it == e.captures.end()) return cudaErrorIllegalState;
  Capture& c = it->second;
  if (c.mode != cudaStreamCaptureModeRelaxed && c.thread != std::this_thread::get_id())
    return cudaErrorStreamCaptureWrongThread;
  const bool ok = c.invalid.empty();
  if (ok) {
    // What the graphs did, said at exit: a run that meant to replay graphs can tell that it did.
    if (e.graphs_made++ == 0) std::atexit([] {
      const Engine& en = engine();
      emu::note("CUDA graphs: %llu captured (%llu nodes), %llu launches", (unsigned long long)en.graphs_made.load(),
                (unsigned long long)en.graph_nodes.load(), (unsigned long long)en.graph_launches.load());
    });
    e.graph_nodes += c.nodes.size();
    *graph = reinterpret_cast<cudaGraph_t>(new EmuGraph{std::move(c.nodes)});
  }
  e.captures.erase(it);
  return ok ? cudaSuccess : cudaErrorStreamCaptureInvalidated;
}
cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus* status) {
  Engine& e = engine();
  std::lock_guard<std::mutex> g(e.mu);
  if (e.of(s) == &e.legacy)  // "will return cudaErrorStreamCaptureImplicit ... not invalidated"
    for (const auto& [st, c] : e.captures)
      if (st->blocking) return cudaErrorStreamCaptureImplicit;
  const Capture* c = e.capture_of(s);
  *status = !c ? cudaStreamCaptureStatusNone
               : c->invalid.empty() ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!exec || !graph) return cudaErrorInvalidValue;
  *exec = reinterpret_cast<cudaGraphExec_t>(new EmuGraph(*reinterpret_cast<EmuGraph*>(graph)));
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return cudaErrorInvalidValue;
  ++engine().graph_launches;
  for (const Node& n : reinterpret_cast<const EmuGraph*>(exec)->nodes)
    if (cudaError_t e = engine().submit(s, n.host_fn ? host_func_op(n.host_fn, n.host_data) : n.fn, nullptr, 0, n.what))
      return e;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<EmuGraph*>(graph);
  return cudaSuccess;
}
// Queued launches keep their operations (copies of the nodes): an executable graph may go while it runs.
cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<EmuGraph*>(exec);
  return cudaSuccess;
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (emulated)";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (emulated)";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream (emulated)";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream (emulated)";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream (emulated)";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread (emulated)";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences (emulated)";
    case cudaErrorIllegalState: return "the operation is not permitted in the current state (emulated)";
    default: return "emulated error";
  }
}
cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = t_device;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int) {
  if (attr == cudaDevAttrComputeCapabilityMajor) *value = 9;
  else if (attr == cudaDevAttrComputeCapabilityMinor) *value = 0;
  else if (attr == cudaDevAttrMultiProcessorCount) *value = static_cast<int>(emu::config().sms);
  else *value = 0;
  return cudaSuccess;
}
// Every kernel here is the emulated device's own code: compiled for architecture 90 (sm_90a), as the lent GPU's
// are (kernels/common/launch.cpp launches only such kernels with programmatic dependent launch).
cudaError_t CUDARTAPI cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void*) {
  std::memset(attr, 0, sizeof *attr);
  attr->ptxVersion = attr->binaryVersion = 90;
  return cudaSuccess;
}
}
