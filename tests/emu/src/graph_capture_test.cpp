// The emulator's CUDA graphs (cudart_stubs.cpp, README "CUDA graphs by stream capture") against the rules
// of CUDA's stream capture: what a capture records and a launch replays, and what a capture refuses. The
// training programs' --cuda-graph check (train_emu.py) shows the replay gives the eager bits; this shows the
// emulator would refuse what a GPU refuses, so a capture that passes here is not passing by leniency.
// Built by emu.sh --train-build as BUILD/train/test_graph_capture; run with and without EMU_ASYNC_STREAMS.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}
void count_call(void* counter) { ++*static_cast<int*>(counter); }

// Begins a capture on s, runs body, ends it: the error cudaStreamEndCapture returned, the graph in *graph
// (destroyed by the caller when not null).
template <class F>
cudaError_t captured(cudaStream_t s, cudaStreamCaptureMode mode, F body, cudaGraph_t* graph) {
  if (cudaStreamBeginCapture(s, mode) != cudaSuccess) return cudaErrorUnknown;
  body();
  return cudaStreamEndCapture(s, graph);
}
}  // namespace

int main() {
  cudaStream_t s, blocking;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreate(&blocking);
  const size_t n = 256;
  char *src, *dst, *host;
  cudaMalloc(reinterpret_cast<void**>(&src), n);
  cudaMalloc(reinterpret_cast<void**>(&dst), n);
  cudaMallocHost(reinterpret_cast<void**>(&host), n);
  cudaMemset(src, 0, n);
  cudaMemset(dst, 0, n);
  cudaDeviceSynchronize();

  {  // Recorded, not run; each launch runs every node, copies reading their source as it is at the launch.
    int calls = 0;
    cudaGraph_t graph = nullptr;
    const cudaError_t end = captured(s, cudaStreamCaptureModeThreadLocal, [&] {
      cudaMemsetAsync(src, 7, n / 2, s);
      cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s);
      cudaLaunchHostFunc(s, count_call, &calls);
    }, &graph);
    check(end == cudaSuccess && graph != nullptr, "a capture of a memset, a copy and a host function ends in a graph");
    cudaDeviceSynchronize();
    cudaMemcpy(host, dst, n, cudaMemcpyDeviceToHost);
    check(host[0] == 0 && calls == 0, "nothing captured ran during the capture");
    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "the graph instantiates");
    cudaGraphDestroy(graph);
    cudaMemset(src + n / 2, 9, n / 2);  // after the capture: the launch's copy must see it
    cudaDeviceSynchronize();
    cudaGraphLaunch(exec, s);
    cudaGraphLaunch(exec, s);
    cudaStreamSynchronize(s);
    cudaMemcpy(host, dst, n, cudaMemcpyDeviceToHost);
    check(host[0] == 7 && host[n - 1] == 9, "a launch runs the memset and the copy, reading the source at the launch");
    check(calls == 2, "each launch runs the host function once");
    cudaGraphExecDestroy(exec);
  }
  {  // Thread-local mode: an unsafe call from the capturing thread fails and invalidates; from another, it may.
    cudaGraph_t graph = nullptr;
    void* p = nullptr;
    cudaError_t here = cudaSuccess, there = cudaErrorUnknown;
    cudaError_t end = captured(s, cudaStreamCaptureModeThreadLocal, [&] {
      std::thread([&] {
        void* q = nullptr;
        there = cudaMalloc(&q, 64);
        if (there == cudaSuccess) cudaFree(q);
      }).join();
    }, &graph);
    check(there == cudaSuccess && end == cudaSuccess, "thread-local capture: another thread may cudaMalloc");
    if (graph) cudaGraphDestroy(graph);
    end = captured(s, cudaStreamCaptureModeThreadLocal, [&] { here = cudaMalloc(&p, 64); }, &graph);
    check(here == cudaErrorStreamCaptureUnsupported, "thread-local capture: cudaMalloc on the capturing thread fails");
    check(end == cudaErrorStreamCaptureInvalidated && graph == nullptr, "... and the capture ends invalidated");
  }
  {  // Global mode: from any thread; relaxed mode: from none.
    cudaGraph_t graph = nullptr;
    cudaError_t there = cudaSuccess;
    cudaError_t end = captured(s, cudaStreamCaptureModeGlobal, [&] {
      std::thread([&] { there = cudaDeviceSynchronize(); }).join();
    }, &graph);
    check(there == cudaErrorStreamCaptureUnsupported && end == cudaErrorStreamCaptureInvalidated,
          "global capture: cudaDeviceSynchronize on another thread fails and invalidates it");
    cudaError_t copy = cudaErrorUnknown;
    end = captured(s, cudaStreamCaptureModeRelaxed, [&] { copy = cudaMemcpy(host, src, n, cudaMemcpyDeviceToHost); },
                   &graph);
    check(copy == cudaSuccess && end == cudaSuccess, "relaxed capture: cudaMemcpy is allowed");
    if (graph) cudaGraphDestroy(graph);
  }
  {  // The captured stream and its events cannot be waited for from the host.
    cudaGraph_t graph = nullptr;
    cudaError_t sync = cudaSuccess;
    cudaError_t end = captured(s, cudaStreamCaptureModeThreadLocal, [&] { sync = cudaStreamSynchronize(s); }, &graph);
    check(sync == cudaErrorStreamCaptureUnsupported && end == cudaErrorStreamCaptureInvalidated,
          "cudaStreamSynchronize of the captured stream fails and invalidates the capture");
    cudaEvent_t ev, outside;
    cudaEventCreate(&ev);
    cudaEventCreate(&outside);
    cudaError_t query = cudaSuccess, wait_own = cudaErrorUnknown;
    end = captured(s, cudaStreamCaptureModeThreadLocal, [&] {
      cudaEventRecord(ev, s);
      wait_own = cudaStreamWaitEvent(s, ev, 0);
    }, &graph);
    check(wait_own == cudaSuccess && end == cudaSuccess, "the captured stream may wait for its own captured record");
    if (graph) cudaGraphDestroy(graph);
    end = captured(s, cudaStreamCaptureModeThreadLocal, [&] {
      cudaEventRecord(ev, s);
      query = cudaEventQuery(ev);
    }, &graph);
    check(query == cudaErrorCapturedEvent && end == cudaErrorStreamCaptureInvalidated,
          "querying an event recorded in the capture is cudaErrorCapturedEvent, and invalidates it");
    if (graph) cudaGraphDestroy(graph);
    check(cudaEventSynchronize(ev) == cudaErrorCapturedEvent, "... and synchronising it after the capture too");
    cudaEventRecord(ev, s);
    cudaStreamSynchronize(s);
    check(cudaEventQuery(ev) == cudaSuccess, "a record outside a capture makes the event usable again");
    check(cudaStreamWaitEvent(blocking, outside, 0) == cudaSuccess, "waiting for a never-recorded event is a no-op");
    cudaEventRecord(outside, blocking);
    cudaError_t wait = cudaSuccess;
    end = captured(s, cudaStreamCaptureModeThreadLocal, [&] { wait = cudaStreamWaitEvent(s, outside, 0); }, &graph);
    check(wait == cudaErrorStreamCaptureIsolation && end == cudaErrorStreamCaptureInvalidated,
          "waiting for an event recorded outside the capture is cudaErrorStreamCaptureIsolation");
    // Two captures at once (two streams): one waiting for the other's captured event would merge them.
    cudaStream_t s2;
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaStreamBeginCapture(s2, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(ev, s2);
    end = captured(s, cudaStreamCaptureModeThreadLocal, [&] { wait = cudaStreamWaitEvent(s, ev, 0); }, &graph);
    check(wait == cudaErrorStreamCaptureMerge && end == cudaErrorStreamCaptureInvalidated,
          "waiting for another capture's event is cudaErrorStreamCaptureMerge");
    cudaGraph_t graph2 = nullptr;
    check(cudaStreamEndCapture(s2, &graph2) == cudaSuccess, "... and the other capture is not disturbed");
    if (graph2) cudaGraphDestroy(graph2);
    check(cudaStreamWaitEvent(blocking, ev, 0) == cudaErrorCapturedEvent,
          "a stream waiting for an event of an ended capture gets cudaErrorCapturedEvent");
    cudaEventRecord(ev, s);
    cudaStreamDestroy(s2);
    cudaDeviceSynchronize();
    cudaEventDestroy(ev);
    cudaEventDestroy(outside);
  }
  {  // The legacy stream would wait for a captured blocking stream.
    cudaGraph_t graph = nullptr;
    cudaError_t memset = cudaSuccess, capturing = cudaSuccess;
    cudaStreamCaptureStatus status;
    cudaError_t end = captured(blocking, cudaStreamCaptureModeThreadLocal, [&] {
      capturing = cudaStreamIsCapturing(nullptr, &status);
      memset = cudaMemsetAsync(dst, 1, n, nullptr);
    }, &graph);
    check(capturing == cudaErrorStreamCaptureImplicit, "asking the legacy stream then is cudaErrorStreamCaptureImplicit");
    check(memset == cudaErrorStreamCaptureImplicit && end == cudaErrorStreamCaptureInvalidated,
          "legacy-stream work while a blocking stream is captured fails and invalidates the capture");
    cudaDeviceSynchronize();
    end = captured(s, cudaStreamCaptureModeThreadLocal, [&] { memset = cudaMemsetAsync(dst, 1, n, nullptr); }, &graph);
    check(memset == cudaSuccess && end == cudaSuccess, "... and not while a non-blocking one is");
    if (graph) cudaGraphDestroy(graph);
    cudaDeviceSynchronize();
  }
  {  // Beginning and ending.
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported,
          "the legacy stream cannot be captured");
    check(cudaStreamEndCapture(s, &graph) == cudaErrorIllegalState, "ending a capture that was not begun fails");
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaErrorIllegalState,
          "a stream being captured cannot begin another capture");
    cudaStreamIsCapturing(s, &status);
    check(status == cudaStreamCaptureStatusActive, "cudaStreamIsCapturing says active");
    cudaError_t other = cudaSuccess;
    std::thread([&] {
      cudaGraph_t g = nullptr;
      other = cudaStreamEndCapture(s, &g);
    }).join();
    check(other == cudaErrorStreamCaptureWrongThread, "another thread cannot end a thread-local capture");
    check(cudaStreamEndCapture(s, &graph) == cudaSuccess && graph != nullptr, "... and the capturing thread can");
    cudaStreamIsCapturing(s, &status);
    check(status == cudaStreamCaptureStatusNone, "cudaStreamIsCapturing says none after the end");
    cudaGraphDestroy(graph);
  }

  cudaFree(src);
  cudaFree(dst);
  cudaFreeHost(host);
  cudaStreamDestroy(s);
  cudaStreamDestroy(blocking);
  std::printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
