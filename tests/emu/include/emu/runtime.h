// CPU emulator of the sm_90a features the wgmma GEMM (and attention) kernels use. Every GPU thread of a block runs as a
// std::thread, or with EMU_FIBERS=1 as a fiber; warps / warpgroups rendezvous through mutex + condition variable. See README.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

namespace emu {

// ---- errors -------------------------------------------------------------------------------------
// A protocol violation: prints "[emu] ERROR (block, thread): msg" and ends the process with status 3.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void note(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// ---- configuration (environment variables, read once) ---------------------------------------------
struct Config {
  unsigned smem_offset = 1024;     // EMU_SMEM_OFFSET: where dynamic smem starts in the shared window
  unsigned tma_delay_us = 300;     // EMU_TMA_DELAY_US: a TMA copy lands after a random 0..delay us
  unsigned wait_delay_us = 1500;   // EMU_WAIT_DELAY_US: wgmma.wait_group retires after 0..delay us
  unsigned timeout_s = 20;         // EMU_TIMEOUT_S: a wait while the whole grid stands still this long is a deadlock
  unsigned seed = 1;               // EMU_SEED
  unsigned concurrent_blocks = 0;  // EMU_CONCURRENT_BLOCKS: blocks run at once (0: the whole grid, <= 24576 threads)
  unsigned sms = 3;                // EMU_SMS: the "device"'s multiprocessor count (persistent grid size)
  unsigned start_delay_us = 0;     // EMU_START_DELAY_US: a block's first __syncthreads holds it 0..delay us
  bool start_last_first = false;   // EMU_START_LAST_FIRST=1: blocks pass their first __syncthreads last first,
                                   // each once the grid stands still (emu_runtime.cpp, start_gate_last_first)
  bool fibers = false;             // EMU_FIBERS=1: a block's threads are fibers on one OS thread (run_block_fibers)
};
const Config& config();

// ---- per-thread builtins -----------------------------------------------------------------------
int tid();   // threadIdx.x (1-D blocks only)
void syncthreads();
void thread_exit_hook();
int atomic_add(int* p, int v);  // atomicAdd on global memory; a block's first one ranks it (EMU_START_LAST_FIRST)
[[noreturn]] void trap(const char* why);

// Warp shuffle: value bits exchanged through a 32-lane rendezvous.
uint64_t shfl_xor_bits(unsigned mask, uint64_t bits, int lane_mask, int width);
void syncwarp(unsigned mask);  // __syncwarp: every lane of the warp, full mask only

// ---- shared memory -------------------------------------------------------------------------------
unsigned char* dynamic_smem();          // the generic pointer of `extern __shared__` storage
// A static `__shared__` declaration's storage in the calling thread's block (EMU_STATIC_SHARED): the same
// for every thread of the block that asks with the same key (the declaration's own static tag).
unsigned char* static_smem(size_t bytes, size_t align, const void* key, const char* name);
uint32_t smem_offset(const void* p);    // generic -> shared-window address (checks the range)
unsigned char* smem_at(uint32_t off, uint32_t bytes, const char* what);  // window address -> pointer

// ---- mbarrier ------------------------------------------------------------------------------------
void mbar_init(uint32_t addr, uint32_t count);
void mbar_fence_init();
void mbar_arrive(uint32_t addr, uint32_t expect_tx_bytes);
bool mbar_try_wait_parity(uint32_t addr, uint32_t parity);  // suspends up to ~20 ms
uint64_t global_timer_ns();
// How long the whole grid has made no progress (no arrival at a barrier, collective or mbarrier, no
// copy landed, no thread ended), counted from since_ns (a global_timer_ns value) at the earliest: the
// deadlock detector's clock.
uint64_t stalled_ns(uint64_t since_ns);

// ---- TMA -----------------------------------------------------------------------------------------
void tma_load(uint32_t dst, const void* tensor_map, uint32_t bar, int rank, const int* coords);
void tma_prefetch(const void* tensor_map);
// cp.async.bulk.prefetch.tensor: nothing lands anywhere the program can see, so it checks the map's rank and
// that the box holds at least one element of the tensor (a box wholly outside it is a wrong coordinate: the
// kernels skip the boxes past their tails), and counts (LaunchStats::tma_prefetches).
void tma_prefetch_l2(const void* tensor_map, int rank, const int* coords);
// The prefetches issued since the last call (every block's, in no particular order): the tensor's base
// and the box's coordinates. Drivers check that a kernel prefetched exactly what its epilogue reads.
struct PrefetchRec {
  const void* base;
  int rank;
  int coords[5];
};
std::vector<PrefetchRec> take_prefetches();
// fence.proxy.async.shared::cta: the generic stores to shared memory so far become visible to the async
// proxy; a bulk copy from a range stored to after every fence fails (emu_runtime.cpp, Block::fenced_sources).
void fence_proxy_async();
void named_barrier(int id, int threads, const char* file, int line);  // file:line, the bar.sync call site
void named_barrier_arrive(int id, int threads);  // bar.arrive: counts, does not wait

// The recorded parameters of a tensor map (stored inside the 128-byte CUtensorMap).
struct TensorMapRec {
  uint64_t magic;
  const void* base;
  uint64_t dims[5];
  uint64_t strides[5];  // bytes; strides[0] = element size, strides[i] = byte stride of dim i
  uint32_t box[5];
  uint8_t rank, dtype, elem_bytes, swizzle, interleave, oob_fill;  // (element strides must be 1)
};
static_assert(sizeof(TensorMapRec) <= 128, "fits a CUtensorMap");
constexpr uint64_t kTensorMapMagic = 0x454d55544d415021ull;

// Validates against cuTensorMapEncodeTiled's documented requirements (cuda.h, CUDA 13); returns an
// error text or "" and fills *rec.
std::string encode_tensor_map(TensorMapRec* rec, int dtype, int rank, const void* base, const uint64_t* dims,
                              const uint64_t* strides, const uint32_t* box, const uint32_t* elem_strides,
                              int interleave, int swizzle, int l2promo, int oob_fill);

// ---- wgmma ---------------------------------------------------------------------------------------
void wgmma_fence();
void wgmma_commit();
void wgmma_wait(int pending);
void wgmma_ss(int n, float* d, uint64_t desc_a, uint64_t desc_b, int trans_a, int trans_b, int scale_d);
void wgmma_rs(int n, float* d, const uint32_t* a, uint64_t desc_b, int trans_b, int scale_d);

// ---- setmaxnreg (PTX ISA "setmaxnreg") ------------------------------------------------------------
// The warpgroup's per-thread register count moves to `regs` (a multiple of 8 in [24, 256]); every
// thread of the warpgroup takes part with the same count. A block starts with every warpgroup at the
// count __launch_bounds__(threads, 1) gives (65536 / threads, down to a multiple of 8, at most 256) and an
// empty pool: dec (regs below the current count) gives the difference to the pool, inc (above it) waits
// until the pool holds it; an inc that never gets it is a deadlock.
void setmaxnreg(int regs, bool inc);

// ---- sm_80: cp.async, ldmatrix, mma.sync (the mma.sync GEMM and attention kernels) -------------------
void cp_async(void* dst, const void* src, int bytes, bool full);  // lands at the wait_group that needs it
void cp_async_commit();
void cp_async_wait(int pending);
void cp_async_land_all();  // at thread exit

// ---- sm_90: bulk copies shared -> global (cp.async.bulk, cp.reduce.async.bulk .add.f32; bulk_group) ----
// An issued copy reads its shared source and writes global memory only when a bulk wait_group of its
// thread needs its group (or the thread exits): a source changed before that wait, or a reader of the
// destination that is released before it, sees the wrong data, as it may on the GPU. add_f32 adds the
// source's floats to the destination's (atomically against other blocks' adds). A .read wait reads the
// sources of the groups it covers then; their global writes still wait for a full wait.
void bulk_copy(void* gdst, const void* ssrc, int bytes, bool add_f32);
void bulk_commit();
void bulk_wait(int pending, bool read_only);  // read_only: wait_group.read (the sources are read then)
// A release by a thread whose bulk copies have not completed (no full wait_group since they were issued)
// does not order their global writes before it: an error (`what` names the release).
void bulk_check_release(const char* what);
void ldmatrix_x4(uint32_t* r, const void* p, bool trans);
void mma_16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1);

// ---- global-memory flags ------------------------------------------------------------------------
// ld.acquire.gpu of a flag another block sets, as used in spin loops: yields the CPU, and fails as a
// deadlock when the same thread keeps reading the same value of the same flag while the whole grid
// makes no progress for EMU_TIMEOUT_S.
int spin_load_acquire(const int* flag);

// ---- launch --------------------------------------------------------------------------------------
struct LaunchStats {
  long blocks = 0, wgmma_ops = 0, tma_copies = 0, tma_prefetches = 0;
};
LaunchStats& stats();
void set_max_dynamic_smem(const void* func, int bytes);
void check_dynamic_smem(const void* func, size_t smem);  // the function's limit, at the launch
void run_grid(const void* func, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body);

// ---- streams (cudart_stubs.cpp) --------------------------------------------------------------------
// Queues op on stream s: it runs now, in the caller (the default), or with EMU_ASYNC_STREAMS=1 on the
// emulated device's thread in stream order (README, Streams). It returns true once done; one that returns
// false (a collective waiting for its peers) keeps its stream busy and is called again later.
cudaError_t stream_submit(cudaStream_t s, std::function<bool()> op, const char* what);
// A launch's error, for cudaGetLastError (the first one until it is taken).
void set_launch_error(cudaError_t e);
bool async_streams();
// Whether s is being captured into a CUDA graph (cudaStreamBeginCapture).
bool stream_capturing(cudaStream_t s);
// Whether p lies in an allocation of cudaMalloc.
bool is_device_memory(const void* p);

struct Launch {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  Launch(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) : grid(g), block(b), smem(s), stream(st) {}
  template <class... P, class... A>
  void run(void (*kernel)(P...), A&&... args) {
    // Arguments converted to the parameter types when the launch is made (a kernel's parameters are
    // per-launch constants, copied by every thread), the grid run when its stream gets to it.
    check_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
    auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(args)...);
    const dim3 g = grid, b = block;
    const size_t sm = smem;
    const cudaError_t e = stream_submit(stream, [kernel, params, g, b, sm]() {
      run_grid(reinterpret_cast<const void*>(kernel), g, b, sm,
               [&]() { std::apply([&](auto... p) { kernel(p...); }, *params); });
      return true;
    }, "kernel");
    if (e != cudaSuccess) set_launch_error(e);
  }
};

}  // namespace emu

namespace emu {
// "Device" allocations: TMA reads outside every registered range are errors.
void register_global(const void* p, size_t bytes);
void unregister_global(const void* p);
void clear_globals();
}  // namespace emu
