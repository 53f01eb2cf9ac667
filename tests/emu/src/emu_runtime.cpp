// The emulator proper: blocks of std::threads or fibers (EMU_FIBERS), warp / warpgroup rendezvous, mbarriers, TMA with a
// delayed "copy engine", and wgmma with deferred (asynchronous) execution. See README.md for the
// documentation each rule comes from.
#include "emu/runtime.h"

#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unistd.h>
#include <unordered_map>
#include <sys/mman.h>

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace emu {

struct Block;

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kSentinel = 0x7FC0BEEFu;  // quiet NaN written into in-flight accumulators
constexpr uint32_t kChunk = 1024;            // hazard-tracking granularity of shared memory
constexpr uint32_t kWindowBytes = 256 * 1024;  // a 14-bit (addr >> 4) descriptor field spans 256 KB

std::mutex g_print_mu;

// cp.async copies a thread has issued and not yet landed (cp_async below).
struct CpAsyncCopy {
  unsigned char* dst;
  std::vector<unsigned char> data;
};
struct CpAsyncState {
  std::vector<CpAsyncCopy> open;                   // issued since the last commit
  std::vector<std::vector<CpAsyncCopy>> committed;  // oldest first (a vector: moving it, on every fiber
                                                    // switch, allocates nothing)
};
// Bulk copies (shared -> global) a thread has issued and not yet completed (bulk_copy below).
struct BulkCopy {
  unsigned char* dst;  // global
  uint32_t src;        // shared offset
  int bytes;
  bool add_f32;
  bool read = false;                // the source was read (by a .read wait): `data` holds it
  std::vector<unsigned char> data;
};
struct BulkState {
  std::vector<BulkCopy> open;
  std::vector<std::vector<BulkCopy>> committed;  // oldest first
};
// What spin_load_acquire remembers of a thread's current spin.
struct SpinState {
  const int* last = nullptr;
  int last_value = 0;
  int64_t since = 0, since_run = 0;  // real time (the back-off), run clock (the detector)
};
// The emulated GPU thread running on this OS thread (cur()): the running fiber's with EMU_FIBERS, else the OS
// thread's own (blk null on the host and the copy engine).
struct TCtx {
  Block* blk = nullptr;
  int tid = -1;
  CpAsyncState cp;
  BulkState bulk;
  SpinState spin;
};
thread_local TCtx g_own_ctx;

// ---- fibers (EMU_FIBERS=1) ----
// Every GPU thread of a block is a fiber on the block's one OS thread, switched in user space at the
// emulated synchronisation points (a wait yields to the block's scheduler, which polls it again later).
// An OS thread per GPU thread costs ~50 us to start and ~30 us a switch on the CI VMs: the default kernels'
// test suites (thousands of blocks, a warp rendezvous per shuffle or mma.sync) would take hours. A fiber
// switch is a few instructions. What changes: threads interleave only at those points (a wait, a
// collective, a barrier), in an order the scheduler draws at random (EMU_SEED) every round.
struct Fiber {
  void* sp = nullptr;  // saved stack pointer while switched out
  unsigned char* stack = nullptr;
  TCtx ctx;    // cur() while the fiber runs
  uint3 tidx;  // its threadIdx
  bool done = false;
};
thread_local Fiber* g_fiber = nullptr;   // the running fiber; null outside (the scheduler, OS-thread mode)
// A pointer, not a copy swapped in and out at every switch (that was a tenth of the fiber runs' time).
inline TCtx& cur() { return g_fiber ? g_fiber->ctx : g_own_ctx; }
thread_local void* g_sched_sp = nullptr;  // the scheduler's stack pointer while a fiber runs
thread_local const std::function<void()>* g_fiber_body = nullptr;
constexpr size_t kFiberStack = 512 * 1024;  // touched pages only; the kernels' register arrays fit

}  // namespace
}  // namespace emu

// void emu_fiber_switch(void** save_sp, void* to_sp): saves the callee-saved registers, the x87 control
// word and MXCSR (SysV x86-64 ABI) on the current stack, stores the stack pointer in *save_sp, and resumes
// the context whose stack pointer is to_sp.
extern "C" void emu_fiber_switch(void** save_sp, void* to_sp);
asm(R"(
.text
.globl emu_fiber_switch
.type emu_fiber_switch,@function
emu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    fldcw (%rsp)
    ldmxcsr 8(%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_fiber_switch,.-emu_fiber_switch
.section .note.GNU-stack,"",@progbits
.text
)");

namespace emu {
namespace {

bool in_fiber() { return g_fiber != nullptr; }
void fiber_yield() {
  Fiber* f = g_fiber;
  emu_fiber_switch(&f->sp, g_sched_sp);
}
// Lets time pass for this GPU thread while the block's others run: a fiber yields until then (a sleep
// would stall its whole block), an OS thread sleeps.
void pass_time_until(Clock::time_point until) {
  if (in_fiber()) {
    while (Clock::now() < until) fiber_yield();
  } else {
    std::this_thread::sleep_until(until);
  }
}
[[noreturn]] void fiber_main() {
  (*g_fiber_body)();
  g_fiber->done = true;
  fiber_yield();
  __builtin_trap();  // a finished fiber is never resumed
}

// Buffers reused across blocks and launches (fiber stacks, shared-memory windows): making fresh ones page-faults
// at every launch, and unmapping them shoots down TLBs. A pool is never destroyed: a launch still running on
// the emulated device's thread at exit gives its buffers back.
struct BufferPool {
  std::mutex mu;
  std::vector<unsigned char*> free;
  unsigned char* take() {  // nullptr when empty
    std::lock_guard<std::mutex> g(mu);
    if (free.empty()) return nullptr;
    unsigned char* b = free.back();
    free.pop_back();
    return b;
  }
  void give(unsigned char* b) {
    std::lock_guard<std::mutex> g(mu);
    free.push_back(b);
  }
};
BufferPool& stack_pool() {
  static BufferPool* pool = new BufferPool;
  return *pool;
}
unsigned char* take_stack() {
  if (unsigned char* s = stack_pool().take()) return s;
  void* p = mmap(nullptr, kFiberStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("fiber stack: mmap of %zu bytes failed", kFiberStack);
  mprotect(p, 4096, PROT_NONE);  // a guard page: an overflow faults instead of corrupting a neighbour
  return static_cast<unsigned char*>(p);
}
void give_stack(unsigned char* s) { stack_pool().give(s); }
// The first switch into a fiber "returns" into fiber_main with the stack aligned as after a call.
void* initial_sp(unsigned char* stack) {
  auto top = reinterpret_cast<uintptr_t>(stack + kFiberStack) & ~uintptr_t{15};
  auto* w = reinterpret_cast<uint64_t*>(top);
  *--w = 0;                                              // fiber_main's (absent) return address
  *--w = reinterpret_cast<uint64_t>(&fiber_main);        // popped by emu_fiber_switch's ret
  for (int i = 0; i < 6; ++i) *--w = 0;                  // rbp rbx r12 r13 r14 r15
  *--w = 0x1F80;                                         // MXCSR at 8(%rsp)
  *--w = 0x037F;                                         // x87 control word at (%rsp)
  return w;
}

// Counts the events that move the grid on (progress()); the fiber scheduler sleeps a little when a whole
// round of its fibers passed without one (they all wait for a copy, another block or time). A fiber's events
// are counted in its OS thread's t_fiber_events and published here once a round: one shared counter written
// at every event by the blocks on both cores was a sixth of the fiber runs' time (perf, 2026-11-28).
std::atomic<uint64_t> g_progress_events{0};
thread_local uint64_t t_fiber_events = 0;


// ---- collectives ----
enum class Op : int { None, Shfl, SyncWarp, LdMatrix, Mma16816, WgFence, WgMma, WgCommit, WgWait, WgRetire, SetMaxNReg };
const char* op_name(Op o) {
  switch (o) {
    case Op::None: return "none";
    case Op::Shfl: return "shfl.sync";
    case Op::SyncWarp: return "bar.warp.sync";
    case Op::LdMatrix: return "ldmatrix";
    case Op::Mma16816: return "mma.sync";
    case Op::WgFence: return "wgmma.fence";
    case Op::WgMma: return "wgmma.mma_async";
    case Op::WgCommit: return "wgmma.commit_group";
    case Op::WgWait: return "wgmma.wait_group";
    case Op::WgRetire: return "wgmma.wait_group (retiring)";
    case Op::SetMaxNReg: return "setmaxnreg";
  }
  return "?";
}

struct Deposit {
  Op op = Op::None;
  // shuffle / warp-level
  uint64_t bits = 0;
  unsigned mask = 0;
  int lane_mask = 0, width = 0;
  const void* ptr = nullptr;
  uint32_t regs[4] = {0, 0, 0, 0};
  float acc[4] = {0, 0, 0, 0};
  // wgmma
  int n = 0, kind = 0, trans_a = 0, trans_b = 0, scale_d = 0, pending = 0;
  uint64_t desc_a = 0, desc_b = 0;
  float* d = nullptr;
  const uint32_t* a = nullptr;
};

struct WgmmaOp {
  int n = 0, kind = 0, trans_a = 0, trans_b = 0, scale_d = 0;  // kind 0: SS, 1: RS
  uint64_t desc_a = 0, desc_b = 0;
  float* d[128];
  const uint32_t* a[128];
  uint32_t a_issue[128][4];
  std::vector<float> old[128];
  bool chained[128];
  std::vector<std::pair<uint32_t, uint64_t>> chunks;  // (chunk, version at issue)
};

struct Group {  // a warp (32) or a warpgroup (128)
  std::mutex mu;
  std::condition_variable cv;
  int size = 0, base = 0;
  int arrived = 0, exited = 0;
  uint64_t gen = 0;
  std::vector<Deposit> dep;
  std::vector<uint64_t> result;
  std::vector<uint32_t> result4;  // 4 per lane (ldmatrix)
  // warpgroup wgmma state
  std::vector<WgmmaOp> open;
  std::deque<std::vector<WgmmaOp>> committed;
  std::vector<bool> fenced;
  // wgmma.mma_async: each thread's accumulators when it issued (not in Deposit: every collective of every warp
  // resets its Deposit, and 512 more bytes to clear there were most of the rendezvous' memory traffic)
  std::vector<std::array<float, 128>> old;
  Clock::time_point retire_at;  // wgmma.wait_group: when its products finish
  std::vector<std::map<const float*, std::vector<uint32_t>>> last_written;
  std::vector<std::map<const float*, std::vector<float>>> chain_val;  // running value of in-flight chains
};

struct Mbar {
  bool inited = false;
  uint32_t count = 0, pending = 0, phase = 0;
  int64_t tx = 0;
  int init_tid = -1;
  uint64_t init_sync_gen = 0;
};

struct Copy {
  uint32_t dst = 0, bar = 0;
  std::vector<std::pair<uint32_t, uint16_t>> elems;  // (physical smem address, bf16 bits) -- 2-byte types
  std::vector<unsigned char> raw;                    // generic: bytes at physical addresses `addrs`
  std::vector<uint32_t> addrs;
  uint32_t bytes = 0;
  Clock::time_point land;
  int issuer = -1;
};

struct NamedBar {
  int expected = 0, arrived = 0;
  uint64_t gen = 0;
  const char* sync_file = nullptr;  // the bar.sync call site of this phase's waiters (one: .aligned)
  int sync_line = 0;
};

}  // namespace

// What a thread waits in, for the deadlock report: a fixed text, or the numbers of a wait that are formatted
// only when a report prints them (describe). Formatting the text at every wait, as this did until 2026-11-28,
// took a quarter of the fiber runs' time: every shuffle and mma.sync has 31 lanes that wait for the 32nd.
struct WaitWhat {
  enum Kind : unsigned char { kRunning, kText, kCollective, kMbarrier, kNamedBarrier, kSpin };
  Kind kind = kRunning;
  const char* text = nullptr;  // kText: the wait; kCollective: the instruction
  const void* ptr = nullptr;   // kSpin: the flag
  long long v[6] = {};
  WaitWhat() = default;
  WaitWhat(const char* t) : kind(t && *t ? kText : kRunning), text(t && *t ? t : nullptr) {}  // NOLINT: a text converts ("": running)
  static WaitWhat collective(const char* op, int size, int base) {
    WaitWhat w;
    w.kind = kCollective, w.text = op, w.v[0] = size, w.v[1] = base;
    return w;
  }
  static WaitWhat mbarrier(uint32_t addr, uint32_t parity, uint32_t phase, uint32_t pending, uint32_t count, long long tx) {
    WaitWhat w;
    w.kind = kMbarrier, w.v[0] = addr, w.v[1] = parity, w.v[2] = phase, w.v[3] = pending, w.v[4] = count, w.v[5] = tx;
    return w;
  }
  static WaitWhat named_barrier(int id, int threads) {
    WaitWhat w;
    w.kind = kNamedBarrier, w.v[0] = id, w.v[1] = threads;
    return w;
  }
  static WaitWhat spin(const void* flag, int value) {
    WaitWhat w;
    w.kind = kSpin, w.ptr = flag, w.v[0] = value;
    return w;
  }
  bool operator==(const WaitWhat& o) const {
    if (kind != o.kind || text != o.text || ptr != o.ptr) return false;
    for (int i = 0; i < 6; ++i)
      if (v[i] != o.v[i]) return false;
    return true;
  }
};

std::string describe(const WaitWhat& w) {
  char buf[192];
  switch (w.kind) {
    case WaitWhat::kRunning: return "";
    case WaitWhat::kText: return w.text;
    case WaitWhat::kCollective:
      snprintf(buf, sizeof buf, "%s (%s of threads %lld..%lld)", w.text, w.v[0] == 32 ? "warp" : "warpgroup", w.v[1],
               w.v[1] + w.v[0] - 1);
      break;
    case WaitWhat::kMbarrier:
      snprintf(buf, sizeof buf,
               "mbarrier.try_wait.parity 0x%llx parity %lld (phase %lld: %lld of %lld arrivals, %lld bytes pending)",
               w.v[0], w.v[1], w.v[2], w.v[3], w.v[4], w.v[5]);
      break;
    case WaitWhat::kNamedBarrier: snprintf(buf, sizeof buf, "bar.sync %lld, %lld (named barrier)", w.v[0], w.v[1]); break;
    case WaitWhat::kSpin: snprintf(buf, sizeof buf, "a spin on the global flag %p, reading %lld", w.ptr, w.v[0]); break;
  }
  return buf;
}

// Shared-memory windows (kWindowBytes, 1024-aligned in a store 1024 bytes larger), pooled: a fresh one a block
// (257 KB: an mmap, page faults, an munmap) was most of the time of a grid of a thousand small blocks. A
// pooled window is all 0xFF (uninitialised shared memory reads as bf16 NaN): a block that ends refills all of
// it, so a kernel's stray store past its shared memory cannot reach a later block (microseconds, cached).
constexpr size_t kWindowStoreBytes = kWindowBytes + 1024;
BufferPool& window_pool() {
  static BufferPool* pool = new BufferPool;
  return *pool;
}
unsigned char* take_window() {
  if (unsigned char* w = window_pool().take()) return w;
  unsigned char* w = new unsigned char[kWindowStoreBytes];
  std::memset(w, 0xFF, kWindowStoreBytes);
  return w;
}
unsigned char* aligned_window(unsigned char* store) {
  return store + (1024 - reinterpret_cast<uintptr_t>(store) % 1024) % 1024;
}

struct Block {
  std::atomic<long> first_atomic_seq{-1};  // EMU_START_LAST_FIRST's order (atomic_add)
  dim3 idx;
  int nthreads = 0;
  unsigned char* window_store = nullptr;  // take_window's, given back refilled by the destructor
  unsigned char* window = nullptr;
  uint32_t dyn_off = 0, dyn_bytes = 0;
  // Static __shared__ storage (EMU_STATIC_SHARED): placed from the top of the window down, one place per
  // declaration (keyed by its static tag) and block; [static_lo, kWindowBytes) once any is placed.
  struct StaticShared {
    uint32_t off;
    size_t bytes, align;
  };
  uint32_t static_lo = 0;
  std::map<const void*, StaticShared> static_at;

  std::mutex mu;  // mbarriers, syncthreads, chunk state, named barriers
  std::condition_variable cv;
  std::unordered_map<uint32_t, Mbar> bars;
  bool fence_init_seen = false;
  int sync_arrived = 0, live = 0;
  uint64_t sync_gen = 0;
  std::map<int, NamedBar> named;
  std::vector<int> wg_regs;  // setmaxnreg: each warpgroup's per-thread register count
  std::vector<int> wg_inc_regs;                       // its pending inc's count
  std::vector<uint64_t> wg_inc_filed, wg_inc_granted;  // its incs filed / granted so far
  long reg_pool = 0;         // registers given back by dec, not yet taken by inc
  std::vector<uint64_t> chunk_version;
  std::vector<int> chunk_pending, chunk_readers;

  // The proxies (fence.proxy.async): every shared range a bulk copy has read, (offset, bytes) -> what it
  // held at the block's last fence.proxy.async (or the last TMA landing on it: the async proxy sees its own
  // writes). The async proxy sees generic stores only after a fence, so a copy issued from a range that
  // differs from this was written after every fence. Any thread's fence refreshes every range: a fence
  // dropped from all writers is caught, one dropped from some (another thread fences later) is not.
  std::mutex fence_mu;  // taken alone, or after mu
  std::map<std::pair<uint32_t, int>, std::vector<unsigned char>> fenced_sources;

  std::vector<std::unique_ptr<Group>> warps, wgs;

  // What each thread waits in, for the deadlock report (WaitWhat{} while it runs). Locked after mu or a group's
  // mutex, never before.
  std::mutex state_mu;
  std::vector<WaitWhat> waiting;

  std::thread dma;
  std::mutex dma_mu;
  std::condition_variable dma_cv;
  std::deque<Copy> queue;
  bool dma_stop = false;
  std::mt19937 rng;
  std::mutex rng_mu;
  unsigned rand_us(unsigned max_us) {
    if (max_us == 0) return 0;
    std::lock_guard<std::mutex> g(rng_mu);
    return std::uniform_int_distribution<unsigned>(0, max_us)(rng);
  }
  ~Block() {  // gives the window back as the pool keeps them: all 0xFF
    if (!window_store) return;
    std::memset(window_store, 0xFF, kWindowStoreBytes);
    window_pool().give(window_store);
  }
};

namespace {

std::vector<std::pair<uintptr_t, size_t>> g_globals;  // registered "device" allocations
std::mutex g_globals_mu;
std::map<const void*, int> g_max_dyn_smem;  // under g_max_dyn_smem_mu (the host sets it, the device thread reads it)
std::mutex g_max_dyn_smem_mu;
LaunchStats g_stats;
std::mutex g_stats_mu;
std::vector<PrefetchRec> g_prefetches;  // under g_stats_mu (tma_prefetch_l2, take_prefetches)

std::string ctx_string() {
  char buf[128];
  if (cur().blk)
    snprintf(buf, sizeof buf, "block (%u,%u,%u) thread %d (warpgroup %d warp %d lane %d)", cur().blk->idx.x,
             cur().blk->idx.y, cur().blk->idx.z, cur().tid, cur().tid / 128, cur().tid / 32, cur().tid % 32);
  else
    snprintf(buf, sizeof buf, "host / copy engine");
  return buf;
}

Block& blk() {
  if (!cur().blk) fail("device function called outside a kernel");
  return *cur().blk;
}

// ---- the deadlock report: what every thread of the resident blocks waits in ----
std::mutex g_resident_mu;
std::vector<Block*> g_resident;

void set_waiting(const WaitWhat& what) {
  TCtx& c = cur();
  if (!c.blk) return;
  WaitWhat& slot = c.blk->waiting[c.tid];
  if (slot == what) return;  // only this thread writes its slot: reading it unlocked races with nothing
  std::lock_guard<std::mutex> g(c.blk->state_mu);
  slot = what;
}

// Printed before a deadlock failure: per resident block, runs of threads in the same wait, and its
// mbarriers and named barriers. `held`: the mutex the reporting thread holds (read without locking it);
// another block's barriers are shown only if its mutex is free at once.
void report_waits(const std::mutex* held) {
  std::lock_guard<std::mutex> rg(g_resident_mu);
  std::lock_guard<std::mutex> pg(g_print_mu);
  fprintf(stderr, "[emu] deadlock report: %zu resident block(s); threads not listed are running\n", g_resident.size());
  int lines = 0;
  for (Block* b : g_resident) {
    if (++lines > 64) {
      fprintf(stderr, "[emu]   ... (more blocks left out)\n");
      break;
    }
    if (b->live == 0) {
      fprintf(stderr, "[emu]   block (%u,%u,%u): finished\n", b->idx.x, b->idx.y, b->idx.z);
      continue;
    }
    fprintf(stderr, "[emu]   block (%u,%u,%u), %d live thread(s):\n", b->idx.x, b->idx.y, b->idx.z, b->live);
    {
      std::map<std::string, std::vector<int>> by_wait;  // the threads in each wait
      {
        std::lock_guard<std::mutex> sg(b->state_mu);
        for (int t = 0; t < b->nthreads; ++t)
          if (b->waiting[t].kind != WaitWhat::kRunning) by_wait[describe(b->waiting[t])].push_back(t);
      }
      for (const auto& kv : by_wait) {
        std::string ranges;  // "0-3, 5, 9-127", the first 8 runs
        const std::vector<int>& ts = kv.second;
        int runs = 0;
        for (size_t i = 0; i < ts.size();) {
          size_t e = i;
          while (e + 1 < ts.size() && ts[e + 1] == ts[e] + 1) ++e;
          if (++runs > 8) {
            ranges += ", ...";
            break;
          }
          ranges += (ranges.empty() ? "" : ", ") + std::to_string(ts[i]) + (e > i ? "-" + std::to_string(ts[e]) : "");
          i = e + 1;
        }
        fprintf(stderr, "[emu]     %zu thread(s) in %s: %s\n", ts.size(), kv.first.c_str(), ranges.c_str());
      }
    }
    std::unique_lock<std::mutex> bl(b->mu, std::defer_lock);
    if (&b->mu != held && !bl.try_lock()) continue;
    for (const auto& kv : b->bars)
      fprintf(stderr, "[emu]     mbarrier 0x%x: phase %u, %u of %u arrivals and %lld bytes pending\n", kv.first,
              kv.second.phase, kv.second.pending, kv.second.count, static_cast<long long>(kv.second.tx));
    for (const auto& kv : b->named)
      if (kv.second.arrived > 0)
        fprintf(stderr, "[emu]     bar.sync %d: %d of %d threads arrived\n", kv.first, kv.second.arrived,
                kv.second.expected);
  }
  fflush(stderr);
}

// ---- the deadlock detector's clock ----
// A wait is a deadlock only when the whole emulated grid has stood still for EMU_TIMEOUT_S: no thread
// arrived at a barrier, collective or mbarrier, no copy landed, no thread ended. A long wait while other
// blocks advance is a dependency, not a deadlock: the attention backward's key tile kt waits for key
// tiles 0..kt-1 at every query tile, seconds of emulated time that a loaded 2-core CI machine stretched
// past the 20 s a per-wait bound allowed.
int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

// The detector counts only time in which this process ran. A ticker thread advances run_clock_ns() by the
// real time since its last tick, but by at most kMaxTickNs a tick: a gap in which the process did not run
// at all (stopped, its VM paused, a machine so loaded that not even the ticker ran) is not a stall of the
// grid. Every waiter sleeping through such a gap woke to "no progress for 20 s": a SIGSTOP of 24 s made
// the backward's quick set report a deadlock at a named barrier, as CI's two unexplained stalls did.
// A starved ticker only makes the detector slower to fire, never quicker.
constexpr int64_t kTickNs = 50'000'000, kMaxTickNs = 200'000'000;
std::atomic<int64_t> g_run_clock_ns{0};
int64_t run_clock_ns() {
  static std::once_flag started;
  std::call_once(started, [] {
    std::thread([] {
      for (int64_t last = now_ns();;) {
        std::this_thread::sleep_for(std::chrono::nanoseconds(kTickNs));
        const int64_t t = now_ns();
        g_run_clock_ns.fetch_add(std::min(t - last, kMaxTickNs), std::memory_order_relaxed);
        last = t;
      }
    }).detach();  // sleeps for the life of the process; exit() does not wait for it
  });
  return g_run_clock_ns.load(std::memory_order_relaxed);
}

std::atomic<int64_t> g_last_progress_ns{0};  // on run_clock_ns()
void progress() {  // moves the clock forward only: a thread preempted after reading the time must not set it back
  if (in_fiber())
    ++t_fiber_events;
  else
    g_progress_events.fetch_add(1, std::memory_order_relaxed);
  const int64_t t = run_clock_ns();
  int64_t seen = g_last_progress_ns.load(std::memory_order_relaxed);
  while (seen < t && !g_last_progress_ns.compare_exchange_weak(seen, t, std::memory_order_relaxed)) {
  }
}
int64_t timeout_ns() { return static_cast<int64_t>(config().timeout_s) * 1'000'000'000; }

// A waiter gives up its lock until something may have changed: an OS thread sleeps on the condition
// variable (a notify or `most` wakes it), a fiber yields to its block's scheduler.
void pause_waiter(std::unique_lock<std::mutex>& lk, std::condition_variable& cv, std::chrono::nanoseconds most) {
  if (in_fiber()) {
    lk.unlock();
    fiber_yield();
    lk.lock();
  } else {
    cv.wait_for(lk, most);
  }
}

template <class Pred>
void timed_wait(std::unique_lock<std::mutex>& lk, std::condition_variable& cv, Pred pred, const WaitWhat& what) {
  const int64_t since = run_clock_ns();
  // A fiber writes the deadlock report's entry from its second pause on: most waits (a warp's lanes waiting for
  // its last) end after one, and a fiber in a deadlock pauses every round before the report. An OS thread's
  // first pause may last until the report: it writes the entry before.
  const int show_at = in_fiber() ? 1 : 0;
  for (int pauses = 0; !pred(); ++pauses) {
    if (pauses == show_at) set_waiting(what);
    // Sleeps until the grid would have stood still for the timeout; progress meanwhile moves the deadline,
    // and a gap in which the process did not run moves the run clock by less than the sleep (run_clock_ns).
    const int64_t deadline = std::max(since, g_last_progress_ns.load(std::memory_order_relaxed)) + timeout_ns();
    const int64_t left = deadline - run_clock_ns();
    if (left <= 0) {
      set_waiting(what);
      report_waits(lk.mutex());
      fail("deadlock: the whole grid made no progress for %u s while this thread waited in %s", config().timeout_s,
           describe(what).c_str());
    }
    pause_waiter(lk, cv, std::chrono::nanoseconds(std::max(left, kTickNs)));
  }
  set_waiting("");
}

// A rendezvous of a warp or warpgroup: every member deposits, the last arrival runs `leader` under the
// group's lock, then everyone leaves with the results. All members must call the same instruction.
template <class Fill, class Leader, class Take>
void collective(Group& g, Op op, Fill&& fill, Leader&& leader, Take&& take) {
  const int me = cur().tid - g.base;
  std::unique_lock<std::mutex> lk(g.mu);
  if (g.exited > 0)
    fail("%s executed by a %s with %d exited thread(s): every thread must take part", op_name(op),
         g.size == 32 ? "warp" : "warpgroup", g.exited);
  Deposit& d = g.dep[me];
  d = Deposit{};
  d.op = op;
  fill(d);
  progress();
  const uint64_t my_gen = g.gen;
  if (++g.arrived == g.size) {
    for (int i = 0; i < g.size; ++i)
      if (g.dep[i].op != op)
        fail("divergent %s collective: thread %d is in %s, thread %d in %s", g.size == 32 ? "warp" : "warpgroup",
             g.base + me, op_name(op), g.base + i, op_name(g.dep[i].op));
    leader();
    g.arrived = 0;
    ++g.gen;
    g.cv.notify_all();
  } else {
    timed_wait(lk, g.cv, [&] { return g.gen != my_gen; }, WaitWhat::collective(op_name(op), g.size, g.base));
  }
  take(me);
}

// ---- shared-memory helpers ----
inline uint32_t swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

void check_dyn_range(Block& b, uint32_t off, uint32_t bytes, const char* what) {
  if (b.static_lo > 0 && off >= b.static_lo && static_cast<uint64_t>(off) + bytes <= kWindowBytes) return;
  if (off < b.dyn_off || static_cast<uint64_t>(off) + bytes > static_cast<uint64_t>(b.dyn_off) + b.dyn_bytes)
    fail("%s: shared address 0x%x (+%u bytes) outside the launched dynamic shared memory [0x%x, 0x%x)", what, off,
         bytes, b.dyn_off, b.dyn_off + b.dyn_bytes);
}

Mbar& bar_at(Block& b, uint32_t addr, const char* what) {  // b.mu held
  check_dyn_range(b, addr, 8, what);
  if (addr % 8) fail("%s: mbarrier address 0x%x not 8-byte aligned", what, addr);
  auto it = b.bars.find(addr);
  if (it == b.bars.end() || !it->second.inited) fail("%s: mbarrier at 0x%x used before mbarrier.init", what, addr);
  Mbar& m = it->second;
  if (cur().blk && cur().tid != m.init_tid && b.sync_gen == m.init_sync_gen)
    fail("%s: mbarrier at 0x%x used by thread %d before a block barrier followed its initialisation", what, addr,
         cur().tid);
  return m;
}

void complete_phase_if_done(Block& b, Mbar& m) {  // b.mu held
  if (m.pending == 0 && m.tx == 0) {
    ++m.phase;
    m.pending = m.count;
    b.cv.notify_all();
  }
}

void dma_loop(Block* b) {
  for (;;) {
    Copy c;
    {
      std::unique_lock<std::mutex> lk(b->dma_mu);
      b->dma_cv.wait(lk, [&] { return b->dma_stop || !b->queue.empty(); });
      if (b->queue.empty()) return;
      c = std::move(b->queue.front());
      b->queue.pop_front();
    }
    std::this_thread::sleep_until(c.land);
    std::lock_guard<std::mutex> g(b->mu);
    for (uint32_t ch = c.dst / kChunk; ch <= (c.dst + c.bytes - 1) / kChunk; ++ch) {
      if (b->chunk_readers[ch] > 0)
        fail("TMA copy (issued by thread %d) landed on shared memory chunk 0x%x that an in-flight wgmma reads", c.issuer,
             ch * kChunk);
      ++b->chunk_version[ch];
      --b->chunk_pending[ch];
    }
    for (auto& e : c.elems) std::memcpy(b->window + e.first, &e.second, 2);
    {
      std::lock_guard<std::mutex> fg(b->fence_mu);
      for (auto& [range, held] : b->fenced_sources)
        if (range.first < c.dst + c.bytes && c.dst < range.first + static_cast<uint32_t>(range.second))
          std::memcpy(held.data(), b->window + range.first, held.size());
    }
    auto it = b->bars.find(c.bar);
    if (it == b->bars.end() || !it->second.inited) fail("TMA completion on an uninitialised mbarrier 0x%x", c.bar);
    Mbar& m = it->second;
    m.tx -= c.bytes;
    progress();
    if (m.tx < 0)
      fail("mbarrier 0x%x: tx-count negative (%lld) after a TMA completion of %u bytes: expect_tx announced fewer "
           "bytes than arrived",
           c.bar, static_cast<long long>(m.tx), c.bytes);
    complete_phase_if_done(*b, m);
  }
}

// ---- wgmma operand decoding ----
struct Desc {
  uint32_t start, lbo, sbo, base_off, layout;
};
Desc decode(uint64_t d) {
  return Desc{static_cast<uint32_t>(d & 0x3FFF) << 4, static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4,
              static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4, static_cast<uint32_t>((d >> 49) & 7),
              static_cast<uint32_t>(d >> 62)};
}
// Swizzle width W of a layout type in 16-byte units (PTX "Matrix Descriptor Format": 0 interleave (no
// swizzle), 1 128B, 2 64B, 3 32B; CUTLASS cute/arch/mma_sm90_desc.hpp LayoutType).
int layout_w(uint32_t layout) { return layout == 1 ? 8 : layout == 2 ? 4 : layout == 3 ? 2 : 1; }
void check_desc(uint64_t raw, int trans, const char* which) {
  const Desc d = decode(raw);
  if ((raw >> 14) & 3 || (raw >> 30) & 3 || (raw >> 46) & 7 || (raw >> 52) & 0x3FF)
    fail("wgmma %s descriptor 0x%016llx has reserved bits set", which, static_cast<unsigned long long>(raw));
  if (d.base_off != 0) fail("wgmma %s descriptor: base offset %u (only 0 is modelled)", which, d.base_off);
  // Not documented as errors here: the addresses are computed anyway (swizzle on the absolute address
  // bits), noted once, and the numbers decide.
  static std::atomic<int> noted{0};
  if (d.layout == 1 && ((d.start >> 7) & 7) != 0 && noted++ == 0)
    note("WARNING wgmma %s descriptor: base offset 0 but the start address 0x%x is %u rows into its 1024-byte "
         "swizzle pattern (PTX: base offset = (start >> 7) & 7 for such starts)",
         which, d.start, (d.start >> 7) & 7);
  const uint32_t row = 16u * layout_w(d.layout);
  if (d.layout != 0 && trans == 0 && (d.start % row) + 32 > row && noted++ == 0)
    note("WARNING wgmma %s (K-major) start 0x%x: the k16 slice (32 bytes) crosses a %u-byte swizzle row", which,
         d.start, row);
  if (d.layout != 0 && trans == 1 && d.start % row != 0 && noted++ == 0)
    note("WARNING wgmma %s (MN-major) start 0x%x not at a %u-byte row start", which, d.start, row);
}
// Address of element (mn, k) of a k16 operand slice, 16-bit elements (T = 8 per 16 bytes). CUTLASS
// make_gmma_desc canonical layouts (cute/atom/mma_traits_sm90_gmma.hpp:160-194), in elements:
//   K-major,  swizzled (W = 8/4/2): ((8,m),(T,2)) : ((W*T,SBO),(1,T))
//             -> start + (mn%8)*16W + (mn/8)*SBO + 2k
//   K-major,  interleave:           ((8,m),(T,2)) : ((1T,SBO),(1,LBO))
//             -> start + (mn%8)*16 + (mn/8)*SBO + 2(k%8) + (k/8)*LBO
//   MN-major, swizzled:             ((T,W,m),(8,k)) : ((1,T,LBO),(W*T,SBO))
//             -> start + 2(mn%8W) + (mn/8W)*LBO + (k%8)*16W + (k/8)*SBO
//   MN-major, interleave:           ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO))
//             -> start + 2(mn%8) + (mn/8)*SBO + (k%8)*16 + (k/8)*LBO
// then the swizzle of the byte address, Swizzle<log2 W,4,3>: bits [4,4+log2 W) ^= bits [7,7+log2 W)
// (cute/swizzle.hpp; applied to the raw smem address, cute/pointer_swizzle.hpp).
uint32_t swizzle_w(uint32_t addr, int w) {
  const uint32_t mask = static_cast<uint32_t>(w - 1);
  return addr ^ (((addr >> 7) & mask) << 4);
}
uint32_t operand_addr(const Desc& d, int trans, int mn, int k) {
  const int w = layout_w(d.layout);
  uint32_t a;
  if (d.layout == 0) {
    if (trans == 0)
      a = d.start + (mn % 8) * 16 + (mn / 8) * d.sbo + 2 * (k % 8) + (k / 8) * d.lbo;
    else
      a = d.start + 2 * (mn % 8) + (mn / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo;
    return a;
  }
  if (trans == 0)
    a = d.start + (mn % 8) * 16 * w + (mn / 8) * d.sbo + 2 * k;
  else
    a = d.start + 2 * (mn % (8 * w)) + (mn / (8 * w)) * d.lbo + (k % 8) * 16 * w + (k / 8) * d.sbo;
  return swizzle_w(a, w);
}
float bf16_bits_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void op_chunks(Block& b, const WgmmaOp& op, std::vector<uint32_t>& out) {
  auto add = [&](uint64_t raw, int trans, int rows) {
    const Desc d = decode(raw);
    for (int mn = 0; mn < rows; ++mn)
      for (int k = 0; k < 16; ++k) {
        const uint32_t a = operand_addr(d, trans, mn, k);
        check_dyn_range(b, a, 2, "wgmma operand");
        out.push_back(a / kChunk);
      }
  };
  if (op.kind == 0) add(op.desc_a, op.trans_a, 64);
  add(op.desc_b, op.trans_b, op.n);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

// later_use(t, d): another unretired wgmma (issued after this one) accumulates into thread t's registers
// d. Then the chain's running value stays in g.chain_val and the registers keep the in-flight poison:
// they are architecturally defined only once the last wgmma on them has retired.
template <class LaterUse>
void retire(Block& b, Group& g, WgmmaOp& op, LaterUse&& later_use) {  // g.mu held
  {
    std::lock_guard<std::mutex> lk(b.mu);
    for (auto& cv : op.chunks) {
      if (b.chunk_pending[cv.first] > 0)
        fail("wgmma retires while a TMA write to its shared-memory operand (chunk 0x%x) is outstanding",
             cv.first * kChunk);
      if (b.chunk_version[cv.first] != cv.second)
        fail("the shared-memory operand (chunk 0x%x) of an in-flight wgmma was overwritten before "
             "wgmma.wait_group retired it",
             cv.first * kChunk);
      --b.chunk_readers[cv.first];
    }
  }
  static thread_local float A[64][16], B[16][256];
  if (op.kind == 1) {
    // A from registers (CUTLASS ALayout_64x16 = ((4,8,4),(2,2,2)):((128,1,16),(64,8,512)) over a
    // column-major 64x16 tile): element i of lane l, warp w: row 16w + l/4 + 8((i/2)%2),
    // k = 2(l%4) + i%2 + 8(i/4); register r holds elements 2r (low half) and 2r+1 (high half).
    for (int t = 0; t < 128; ++t) {
      const int w = t / 32, l = t % 32;
      for (int r = 0; r < 4; ++r) {
        const uint32_t v = op.a[t][r];
        if (v != op.a_issue[t][r])
          fail("A-fragment register %d of thread %d changed while its wgmma was in flight (0x%08x -> 0x%08x)", r,
               g.base + t, op.a_issue[t][r], v);
        for (int h = 0; h < 2; ++h) {
          const int i = 2 * r + h;
          const int row = 16 * w + l / 4 + 8 * ((i / 2) % 2), k = 2 * (l % 4) + (i % 2) + 8 * (i / 4);
          A[row][k] = bf16_bits_to_float(static_cast<uint16_t>(h ? v >> 16 : v & 0xFFFF));
        }
      }
    }
  } else {
    const Desc da = decode(op.desc_a);
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k) {
        uint16_t h;
        std::memcpy(&h, b.window + operand_addr(da, op.trans_a, m, k), 2);
        A[m][k] = bf16_bits_to_float(h);
      }
  }
  const Desc db = decode(op.desc_b);
  for (int n = 0; n < op.n; ++n)
    for (int k = 0; k < 16; ++k) {
      uint16_t h;
      std::memcpy(&h, b.window + operand_addr(db, op.trans_b, n, k), 2);
      B[k][n] = bf16_bits_to_float(h);
    }
  const int nregs = op.n / 2;
  if (getenv("EMU_DEBUG_NAN")) {
    int na = 0, nb = 0, nd = 0;
    for (int m = 0; m < 64; ++m) for (int k = 0; k < 16; ++k) na += std::isnan(A[m][k]);
    for (int k = 0; k < 16; ++k) for (int n = 0; n < op.n; ++n) nb += std::isnan(B[k][n]);
    for (int t = 0; t < 128; ++t) for (int i = 0; i < nregs; ++i) nd += op.scale_d && std::isnan(op.chained[t] ? op.d[t][i] : op.old[t][i]);
    const Desc da = decode(op.desc_a), db = decode(op.desc_b);
    note("retire wg %d: A start 0x%x B start 0x%x scale_d %d chained %d  NaN: A %d B %d D-in %d", g.base / 128, da.start, db.start, op.scale_d, (int)op.chained[0], na, nb, nd);
  }
  for (int t = 0; t < 128; ++t) {
    const int w = t / 32, l = t % 32;
    float* d = op.d[t];
    auto& lw = g.last_written[t][d];
    auto& cv = g.chain_val[t][d];
    if (op.chained[t] && cv.size() != static_cast<size_t>(nregs)) fail("emulator: chained wgmma without a chain value");
    float res[128];
    if (lw.size() != static_cast<size_t>(nregs) || std::memcmp(lw.data(), d, 4 * nregs) != 0)
      fail("accumulator registers of thread %d were written while its wgmma was in flight", g.base + t);
    for (int i = 0; i < nregs; ++i) {
      // D fragment (CUTLASS CLayout_64xN): row 16w + l/4 + 8((i/2)%2), col 2(l%4) + i%2 + 8(i/4).
      const int row = 16 * w + l / 4 + 8 * ((i / 2) % 2), col = 2 * (l % 4) + (i % 2) + 8 * (i / 4);
      double acc = 0;
      for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[row][k]) * B[k][col];
      const double base = op.scale_d ? (op.chained[t] ? cv[i] : op.old[t][i]) : 0.0;
      res[i] = static_cast<float>(base + acc);
    }
    cv.assign(res, res + nregs);
    if (!later_use(t, d)) {
      std::memcpy(d, res, 4 * nregs);
      std::memcpy(lw.data(), d, 4 * nregs);
    }
  }
}

void wg_mma(int n, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, int kind, int ta, int tb,
            int scale_d) {
  Block& b = blk();
  Group& g = *b.wgs[cur().tid / 128];
  collective(
      g, Op::WgMma,
      [&](Deposit& dp) {
        dp.n = n, dp.kind = kind, dp.desc_a = desc_a, dp.desc_b = desc_b, dp.trans_a = ta, dp.trans_b = tb;
        dp.scale_d = scale_d, dp.d = d, dp.a = a;
        if (g.old.empty()) g.old.resize(128);  // with the first wgmma (under the group's lock, as every fill)
        for (int i = 0; i < n / 2; ++i) g.old[static_cast<size_t>(cur().tid - g.base)][i] = d[i];
        if (a)
          for (int r = 0; r < 4; ++r) dp.regs[r] = a[r];
      },
      [&] {
        const Deposit& d0 = g.dep[0];
        for (int t = 0; t < 128; ++t) {
          const Deposit& x = g.dep[t];
          if (x.n != d0.n || x.kind != d0.kind || x.desc_a != d0.desc_a || x.desc_b != d0.desc_b ||
              x.trans_a != d0.trans_a || x.trans_b != d0.trans_b || x.scale_d != d0.scale_d)
            fail("wgmma.mma_async operands differ across the warpgroup (thread %d vs %d)", g.base + t, g.base);
          if (!g.fenced[t])
            fail("wgmma.mma_async by thread %d without a wgmma.fence since its last wgmma.wait_group", g.base + t);
        }
        if (kind == 0) check_desc(d0.desc_a, ta, "A");
        check_desc(d0.desc_b, tb, "B");
        if (kind == 1 && ta != 0) fail("register-sourced A must be K-major");
        WgmmaOp op;
        op.n = n, op.kind = kind, op.trans_a = ta, op.trans_b = tb, op.scale_d = scale_d;
        op.desc_a = d0.desc_a, op.desc_b = d0.desc_b;
        for (int t = 0; t < 128; ++t) {
          const Deposit& x = g.dep[t];
          op.d[t] = x.d;
          op.a[t] = x.a;
          std::memcpy(op.a_issue[t], x.regs, 16);
          op.old[t].assign(g.old[t].begin(), g.old[t].begin() + n / 2);
          bool chained = false;
          for (auto& o : g.open) chained |= o.d[t] == x.d;
          for (auto& grp : g.committed)
            for (auto& o : grp) chained |= o.d[t] == x.d;
          op.chained[t] = chained;
          if (chained && g.last_written[t][x.d].size() != static_cast<size_t>(n / 2))
            fail("wgmma accumulators of different shapes chained");
        }
        std::vector<uint32_t> ch;
        op_chunks(b, op, ch);
        {
          std::lock_guard<std::mutex> lk(b.mu);
          for (uint32_t c : ch) {
            if (b.chunk_pending[c] > 0)
              fail("wgmma.mma_async reads shared memory (chunk 0x%x) with an outstanding TMA write: the full "
                   "barrier was not waited for",
                   c * kChunk);
            op.chunks.emplace_back(c, b.chunk_version[c]);
            ++b.chunk_readers[c];
          }
        }
        g.open.push_back(std::move(op));
        std::lock_guard<std::mutex> sg(g_stats_mu);
        ++g_stats.wgmma_ops;
      },
      [&](int me) {
        // The accumulators are the hardware's until wgmma.wait_group: poison them.
        for (int i = 0; i < n / 2; ++i) std::memcpy(&d[i], &kSentinel, 4);
        auto& lw = g.last_written[me][d];
        lw.assign(n / 2, kSentinel);
      });
}

}  // namespace

// =====================================================================================================

void fail(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  {
    std::lock_guard<std::mutex> g(g_print_mu);
    fprintf(stderr, "[emu] ERROR in %s: %s\n", ctx_string().c_str(), buf);
    fflush(stderr);
    fflush(stdout);
  }
  _exit(3);
}

void note(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> g(g_print_mu);
  fprintf(stderr, "[emu] %s\n", buf);
}

const Config& config() {
  static const Config c = [] {
    Config c;
    auto get = [](const char* n, unsigned def) {
      const char* v = getenv(n);
      return v ? static_cast<unsigned>(strtoul(v, nullptr, 0)) : def;
    };
    c.smem_offset = get("EMU_SMEM_OFFSET", c.smem_offset);
    c.tma_delay_us = get("EMU_TMA_DELAY_US", c.tma_delay_us);
    c.wait_delay_us = get("EMU_WAIT_DELAY_US", c.wait_delay_us);
    c.timeout_s = get("EMU_TIMEOUT_S", c.timeout_s);
    c.seed = get("EMU_SEED", c.seed);
    c.concurrent_blocks = get("EMU_CONCURRENT_BLOCKS", c.concurrent_blocks);
    c.sms = get("EMU_SMS", c.sms);
    c.start_delay_us = get("EMU_START_DELAY_US", c.start_delay_us);
    c.start_last_first = get("EMU_START_LAST_FIRST", 0) != 0;
    c.fibers = get("EMU_FIBERS", 0) != 0;
    if (c.smem_offset % 16) fail("EMU_SMEM_OFFSET must be a multiple of 16 (dynamic smem is 16-byte aligned)");
    return c;
  }();
  return c;
}

LaunchStats& stats() { return g_stats; }

int tid() { return cur().tid; }

void trap(const char* why) { fail("trap: %s", why); }

uint64_t global_timer_ns() { return static_cast<uint64_t>(run_clock_ns()); }

uint64_t stalled_ns(uint64_t since_ns) {
  const int64_t from = std::max(static_cast<int64_t>(since_ns), g_last_progress_ns.load(std::memory_order_relaxed));
  return static_cast<uint64_t>(std::max<int64_t>(0, run_clock_ns() - from));
}

// One generation of a block-level barrier (b.mu held through lk): the expected-th arrival opens it and
// starts the next generation; the others wait for that.
static void arrive_and_wait(Block& b, std::unique_lock<std::mutex>& lk, int& arrived, uint64_t& gen, int expected,
                            const WaitWhat& what) {
  const uint64_t my = gen;
  progress();
  if (++arrived == expected) {
    arrived = 0;
    ++gen;
    b.cv.notify_all();
  } else {
    timed_wait(lk, b.cv, [&] { return gen != my; }, what);
  }
}

// EMU_START_LAST_FIRST: the blocks of a wave pass their first __syncthreads one at a time, in the reverse
// of the order they made their first atomicAdd (the backward's ticket: the last ticket goes first; a block
// without one ranks by when it reached the barrier), and each only once the blocks let through before it
// have finished or stand still: the whole grid made no progress for kGateStallNs. The most adversarial
// start order there is, and a deterministic one: a block runs as far as its waits let it before anything
// that it should have waited for runs at all. The dQ turns must still come out in order (a turn with no
// wait adds first and is caught every time, not only when a random delay happens to reorder the right two
// blocks) and must not deadlock. A block that ends without a __syncthreads leaves the wave's count.
constexpr int64_t kGateStallNs = 150'000'000;
struct StartGate {
  std::mutex mu;
  std::condition_variable cv;
  size_t size = 0;            // the wave's blocks that will reach the gate
  std::vector<long> keys;     // per arrival: the block's first-atomic sequence, else its arrival rank
  std::vector<size_t> order;  // arrival ranks in release order, once every block arrived
  size_t released = 0;
};
StartGate g_gate;
std::mutex g_first_atomic_mu;
long g_first_atomic_seq = 0;

void gate_order_if_complete() {  // g_gate.mu held
  if (!g_gate.order.empty() || g_gate.keys.size() < g_gate.size || g_gate.keys.empty()) return;
  g_gate.order.resize(g_gate.keys.size());
  for (size_t i = 0; i < g_gate.order.size(); ++i) g_gate.order[i] = i;
  std::sort(g_gate.order.begin(), g_gate.order.end(), [](size_t x, size_t y) { return g_gate.keys[x] > g_gate.keys[y]; });
  g_gate.cv.notify_all();
}

void start_gate_last_first(long first_atomic_seq) {
  std::unique_lock<std::mutex> lk(g_gate.mu);
  const size_t me = g_gate.keys.size();
  g_gate.keys.push_back(first_atomic_seq >= 0 ? first_atomic_seq : static_cast<long>(me));
  gate_order_if_complete();
  set_waiting("EMU_START_LAST_FIRST's start gate");
  const int64_t t0 = run_clock_ns();
  while (g_gate.order.empty() || g_gate.order[g_gate.released] != me) {
    if (g_gate.order.empty() && static_cast<int64_t>(stalled_ns(static_cast<uint64_t>(t0))) > timeout_ns())
      fail("EMU_START_LAST_FIRST: %zu of the wave's %zu blocks reached a __syncthreads, and the grid stood still "
           "for %u s", g_gate.keys.size(), g_gate.size, config().timeout_s);
    pause_waiter(lk, g_gate.cv, std::chrono::milliseconds(10));
  }
  if (g_gate.released > 0) {  // the blocks let through before have run as far as they can
    const int64_t since = run_clock_ns();
    while (static_cast<int64_t>(stalled_ns(static_cast<uint64_t>(since))) < kGateStallNs)
      pause_waiter(lk, g_gate.cv, std::chrono::milliseconds(10));
  }
  set_waiting("");
  progress();
  ++g_gate.released;
  g_gate.cv.notify_all();
}

void syncthreads() {
  Block& b = blk();
  std::unique_lock<std::mutex> lk(b.mu);
  // The last thread to reach the block's first __syncthreads may hold the block there (every other thread
  // of the block waits in this barrier meanwhile). What came before (the backward's work ticket) is taken
  // in start order; the work after it then runs in another order. EMU_START_DELAY_US: a random 0..delay
  // us, as on an SM that is slow to start or shared. EMU_START_LAST_FIRST: start_gate_last_first. A turn
  // protocol that relied on the order blocks happen to run in, not on its waits, gives wrong sums.
  const bool first_sync_complete = b.sync_gen == 0 && b.sync_arrived + 1 == b.live;
  if (first_sync_complete && config().start_last_first) {
    lk.unlock();
    start_gate_last_first(b.first_atomic_seq.load());
    lk.lock();
  } else if (first_sync_complete && config().start_delay_us > 0) {
    const unsigned us = b.rand_us(config().start_delay_us);
    lk.unlock();
    pass_time_until(Clock::now() + std::chrono::microseconds(us));  // the block's other fibers wait here meanwhile
    lk.lock();
  }
  arrive_and_wait(b, lk, b.sync_arrived, b.sync_gen, b.live, "__syncthreads");
}

void thread_exit_hook() {
  Block& b = blk();
  cp_async_land_all();  // a thread's copies still land after it exits
  // A bulk copy's source is the block's shared memory, which goes when the block ends: a thread that issued
  // copies waits (cp.async.bulk.wait_group, or its .read form) until they have read it before it exits.
  // (Their writes may still land after: they complete here.)
  size_t unread = 0;
  for (const BulkCopy& c : cur().bulk.open) unread += c.read ? 0 : 1;
  for (const auto& group : cur().bulk.committed)
    for (const BulkCopy& c : group) unread += c.read ? 0 : 1;
  if (unread > 0)
    fail(
        "a thread exits with %zu bulk copies (cp.async.bulk) whose shared-memory source no wait has read: a "
        "cp.async.bulk.wait_group[.read] is missing before the block ends, and the copies would read freed "
        "shared memory",
        unread);
  if (!cur().bulk.open.empty()) bulk_commit();
  bulk_wait(0, false);
  const bool in_wg = static_cast<size_t>(cur().tid / 128) < b.wgs.size();
  Group* gs[2] = {b.warps[cur().tid / 32].get(), in_wg ? b.wgs[cur().tid / 128].get() : nullptr};
  for (Group* g : gs) {
    if (!g) continue;
    std::lock_guard<std::mutex> lk(g->mu);
    ++g->exited;
    if (g->arrived > 0)
      fail("thread exited while %d thread(s) of its %s wait in %s", g->arrived, g->size == 32 ? "warp" : "warpgroup",
           op_name(g->dep[0].op));
  }
  if (in_wg) {
    Group& g = *gs[1];
    std::lock_guard<std::mutex> lk(g.mu);
    if (!g.open.empty() || !g.committed.empty()) fail("thread exited with wgmma operations not retired by a wait");
  }
  set_waiting("exited");
  std::lock_guard<std::mutex> lk(b.mu);
  progress();
  --b.live;
  if (b.sync_arrived > 0) fail("thread exited while others wait at __syncthreads");
  if (b.live == 0 && b.sync_gen == 0 && config().start_last_first) {  // it never reached the start gate
    std::lock_guard<std::mutex> gg(g_gate.mu);
    --g_gate.size;
    gate_order_if_complete();
  }
}

int atomic_add(int* p, int v) {
  Block* b = cur().blk;
  if (b == nullptr || b->first_atomic_seq.load() >= 0) return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  // A block's first atomic (the backward's ticket) and its place in EMU_START_LAST_FIRST's order, together.
  std::lock_guard<std::mutex> g(g_first_atomic_mu);
  const int old = __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  b->first_atomic_seq.store(g_first_atomic_seq++);
  return old;
}

uint64_t shfl_xor_bits(unsigned mask, uint64_t bits, int lane_mask, int width) {
  Block& b = blk();
  Group& g = *b.warps[cur().tid / 32];
  uint64_t out = 0;
  collective(
      g, Op::Shfl,
      [&](Deposit& d) {
        d.bits = bits, d.mask = mask, d.lane_mask = lane_mask, d.width = width;
      },
      [&] {
        for (int l = 0; l < 32; ++l) {
          const Deposit& d = g.dep[l];
          if (d.mask != 0xffffffffu) fail("shfl.sync with a partial member mask 0x%x (not modelled)", d.mask);
          if (d.width != 32) fail("shfl.sync width %d (not modelled)", d.width);
          const int src = l ^ (d.lane_mask & 31);
          g.result[l] = g.dep[src].bits;
        }
      },
      [&](int me) { out = g.result[me]; });
  return out;
}

// __syncwarp: a rendezvous of the warp's 32 lanes (a partial member mask is not modelled).
void syncwarp(unsigned mask) {
  if (mask != 0xffffffffu) fail("__syncwarp with a partial member mask 0x%x (not modelled)", mask);
  Group& g = *blk().warps[cur().tid / 32];
  collective(g, Op::SyncWarp, [](Deposit&) {}, [] {}, [](int) {});
}

unsigned char* dynamic_smem() { return blk().window + blk().dyn_off; }

unsigned char* static_smem(size_t bytes, size_t align, const void* key, const char* name) {
  Block& b = blk();
  std::lock_guard<std::mutex> lk(b.mu);
  auto it = b.static_at.find(key);
  if (it != b.static_at.end()) {
    if (it->second.bytes != bytes || it->second.align != align)
      fail("static __shared__ %s: asked for %zu bytes aligned to %zu, placed as %zu aligned to %zu", name, bytes, align,
           it->second.bytes, it->second.align);
    return b.window + it->second.off;
  }
  const size_t a = std::max<size_t>(align, 16);
  const uint32_t top = b.static_lo > 0 ? b.static_lo : kWindowBytes;
  if (bytes > top) fail("static __shared__ %s: %zu bytes do not fit", name, bytes);
  const uint32_t off = static_cast<uint32_t>((top - bytes) / a * a);
  // CUDA's limit on static shared memory is 48 KB a block; static and dynamic storage must not overlap
  if (kWindowBytes - off > 48 * 1024)
    fail("static __shared__ storage above 48 KB a block (%u bytes with %s)", kWindowBytes - off, name);
  if (off < b.dyn_off + b.dyn_bytes)
    fail("static __shared__ storage (with %s) and %u bytes of dynamic shared memory exceed the window", name,
         b.dyn_bytes);
  b.static_lo = off;
  b.static_at[key] = Block::StaticShared{off, bytes, align};
  return b.window + off;
}

uint32_t smem_offset(const void* p) {
  Block& b = blk();
  const auto u = reinterpret_cast<uintptr_t>(p), w = reinterpret_cast<uintptr_t>(b.window);
  if (u < w || u >= w + kWindowBytes) fail("generic address %p is not in the shared window (cvta.to.shared)", p);
  return static_cast<uint32_t>(u - w);
}

unsigned char* smem_at(uint32_t off, uint32_t bytes, const char* what) {
  Block& b = blk();
  check_dyn_range(b, off, bytes, what);
  return b.window + off;
}

// ---- mbarrier (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier") ----
void mbar_init(uint32_t addr, uint32_t count) {
  Block& b = blk();
  std::lock_guard<std::mutex> lk(b.mu);
  check_dyn_range(b, addr, 8, "mbarrier.init");
  if (addr % 8) fail("mbarrier.init: address 0x%x not 8-byte aligned", addr);
  if (count < 1 || count > (1u << 20) - 1) fail("mbarrier.init: count %u out of range [1, 2^20-1]", count);
  Mbar& m = b.bars[addr];
  if (m.inited) fail("mbarrier.init on an mbarrier that is already initialised (0x%x)", addr);
  m = Mbar{};
  m.inited = true;
  m.count = m.pending = count;
  m.init_tid = cur().tid;
  m.init_sync_gen = b.sync_gen;
}

void mbar_fence_init() {
  Block& b = blk();
  std::lock_guard<std::mutex> lk(b.mu);
  b.fence_init_seen = true;
}

void mbar_arrive(uint32_t addr, uint32_t expect_tx) {
  Block& b = blk();
  std::lock_guard<std::mutex> lk(b.mu);
  Mbar& m = bar_at(b, addr, expect_tx ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive");
  if (m.init_tid != cur().tid && !b.fence_init_seen) fail("mbarrier used before fence.mbarrier_init");
  m.tx += expect_tx;  // expect-tx happens before the arrive-on (PTX)
  if (m.tx > (1 << 20) - 1) fail("mbarrier 0x%x: tx-count %lld exceeds 2^20-1", addr, static_cast<long long>(m.tx));
  if (m.pending == 0)
    fail("mbarrier 0x%x: arrival beyond the expected count %u in phase %u", addr, m.count, m.phase);
  --m.pending;
  progress();
  complete_phase_if_done(b, m);
}

bool mbar_try_wait_parity(uint32_t addr, uint32_t parity) {
  Block& b = blk();
  std::unique_lock<std::mutex> lk(b.mu);
  Mbar& m = bar_at(b, addr, "mbarrier.try_wait.parity");
  if (parity > 1) fail("try_wait.parity with parity %u", parity);
  // The phase with parity p is complete when the current (incomplete) phase has the other parity.
  auto done = [&] { return (m.phase & 1u) != parity; };
  // try_wait suspends for a while; a completing phase wakes it at once (complete_phase_if_done), so the
  // bound only sets how often a waiter rechecks its time limit. 1 ms made hundreds of waiting threads
  // (every block of a grid resident) wake 1000 times a second each, and the 2 cores spent their time on it.
  if (!done()) pause_waiter(lk, b.cv, std::chrono::milliseconds(20));
  if (done()) {
    set_waiting("");
    return true;
  }
  set_waiting(WaitWhat::mbarrier(addr, parity, m.phase, m.pending, m.count, static_cast<long long>(m.tx)));
  return false;
}

// ---- TMA (cp.async.bulk.tensor, tile mode) ----
std::string encode_tensor_map(TensorMapRec* rec, int dtype, int rank, const void* base, const uint64_t* dims,
                              const uint64_t* strides, const uint32_t* box, const uint32_t* es, int interleave,
                              int swizzle, int l2promo, int oob_fill) {
  char buf[256];
  auto err = [&](const char* fmt, auto... a) {
    snprintf(buf, sizeof buf, fmt, a...);
    return std::string(buf);
  };
  int eb = 0;
  switch (dtype) {
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_UINT16: eb = 2; break;
    default: return err("data type %d not modelled", dtype);
  }
  if (rank < 1 || rank > 5) return err("tensorRank %d not in [1,5]", rank);
  if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) return err("interleave %d not modelled", interleave);
  if (reinterpret_cast<uintptr_t>(base) % 16) return err("globalAddress %p not 16-byte aligned", base);
  for (int i = 0; i < rank; ++i)
    if (dims[i] == 0 || dims[i] > (1ull << 32)) return err("globalDim[%d] = %llu not in [1, 2^32]", i, (unsigned long long)dims[i]);
  for (int i = 0; i + 1 < rank; ++i) {
    if (strides[i] % 16 || strides[i] >= (1ull << 40))
      return err("globalStrides[%d] = %llu not a multiple of 16 below 2^40", i, (unsigned long long)strides[i]);
    const uint64_t need = i == 0 ? dims[0] * eb : strides[i - 1] * dims[i];
    if (strides[i] < need)
      return err("globalStrides[%d] = %llu smaller than the extent of the dimensions below it (%llu)", i,
                 (unsigned long long)strides[i], (unsigned long long)need);
  }
  for (int i = 0; i < rank; ++i) {
    if (box[i] == 0 || box[i] > 256) return err("boxDim[%d] = %u not in [1,256]", i, box[i]);
    if (es[i] == 0 || es[i] > 8) return err("elementStrides[%d] = %u not in [1,8]", i, es[i]);
    if (es[i] != 1) return err("elementStrides != 1 not modelled");
  }
  if ((box[0] * eb) % 16) return err("boxDim[0] * elementSize = %u not a multiple of 16", box[0] * eb);
  const int span = swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 128 : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                   : swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 32 : swizzle == CU_TENSOR_MAP_SWIZZLE_NONE ? 0 : -1;
  if (span < 0) return err("swizzle %d not modelled", swizzle);
  if (span && box[0] * eb > static_cast<uint32_t>(span))
    return err("inner box %u bytes exceeds the swizzle span %d", box[0] * eb, span);
  if (swizzle == CU_TENSOR_MAP_SWIZZLE_128B && box[0] * eb != 128)
    return err("emulator models the 128B swizzle with a 128-byte inner box only (got %u)", box[0] * eb);
  if (swizzle != CU_TENSOR_MAP_SWIZZLE_128B && swizzle != CU_TENSOR_MAP_SWIZZLE_NONE)
    return err("swizzle %d not modelled", swizzle);
  if (l2promo < 0 || l2promo > 3) return err("l2Promotion %d invalid", l2promo);
  if (oob_fill != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) return err("oobFill NaN not modelled");
  std::memset(rec, 0, sizeof *rec);
  rec->magic = kTensorMapMagic;
  rec->rank = rank, rec->dtype = dtype, rec->elem_bytes = eb, rec->swizzle = swizzle, rec->interleave = interleave;
  rec->oob_fill = oob_fill, rec->base = base;
  rec->strides[0] = eb;
  for (int i = 0; i < rank; ++i) {
    rec->dims[i] = dims[i], rec->box[i] = box[i];
    if (i > 0) rec->strides[i] = strides[i - 1];
  }
  return "";
}

void register_global(const void* p, size_t bytes);

static const TensorMapRec& tensor_map_rec(const void* tmap) {
  if (reinterpret_cast<uintptr_t>(tmap) % 64) fail("tensor map at %p not 64-byte aligned", tmap);
  const auto* rec = static_cast<const TensorMapRec*>(tmap);
  if (rec->magic != kTensorMapMagic) fail("tensor map at %p was not made by cuTensorMapEncodeTiled", tmap);
  return *rec;
}

void tma_prefetch(const void* tmap) { (void)tensor_map_rec(tmap); }

void tma_load(uint32_t dst, const void* tmap, uint32_t bar, int rank, const int* c) {
  Block& b = blk();
  const TensorMapRec& t = tensor_map_rec(tmap);
  if (t.rank != rank) fail("cp.async.bulk.tensor.%dd with a rank-%d tensor map", rank, t.rank);
  if (dst % 128) fail("cp.async.bulk.tensor: shared destination 0x%x not 128-byte aligned", dst);
  if (t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B && dst % 1024)
    fail("cp.async.bulk.tensor with the 128B swizzle: destination 0x%x not 1024-byte aligned", dst);
  uint64_t nelem = 1;
  for (int i = 0; i < rank; ++i) nelem *= t.box[i];
  const uint32_t bytes = static_cast<uint32_t>(nelem * t.elem_bytes);
  check_dyn_range(b, dst, bytes, "cp.async.bulk.tensor destination");
  Copy cp;
  cp.dst = dst, cp.bar = bar, cp.bytes = bytes, cp.issuer = cur().tid;
  cp.elems.reserve(nelem);
  uint32_t idx[5] = {0, 0, 0, 0, 0};
  for (uint64_t e = 0; e < nelem; ++e) {
    bool oob = false;
    uint64_t off = 0;
    for (int i = 0; i < rank; ++i) {
      const int64_t g = static_cast<int64_t>(c[i]) + idx[i];
      if (g < 0 || g >= static_cast<int64_t>(t.dims[i])) oob = true;
      off += static_cast<uint64_t>(g) * t.strides[i];
    }
    uint16_t v = 0;  // OOB_FILL_NONE: zeros
    if (!oob) {
      const auto* p = static_cast<const unsigned char*>(t.base) + off;
      bool ok = false;
      {
        std::lock_guard<std::mutex> g(g_globals_mu);
        for (auto& r : g_globals)
          ok |= reinterpret_cast<uintptr_t>(p) >= r.first && reinterpret_cast<uintptr_t>(p) + 2 <= r.first + r.second;
      }
      if (!ok) fail("TMA reads global address %p outside every registered allocation", (const void*)p);
      std::memcpy(&v, p, 2);
    }
    const uint32_t addr = dst + static_cast<uint32_t>(e * t.elem_bytes);
    const uint32_t phys = t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? swizzle128(addr) : addr;
    cp.elems.emplace_back(phys, v);
    for (int i = 0; i < rank; ++i) {  // next box index, dimension 0 fastest
      if (++idx[i] < t.box[i]) break;
      idx[i] = 0;
    }
  }
  {
    std::lock_guard<std::mutex> lk(b.mu);
    (void)bar_at(b, bar, "cp.async.bulk.tensor mbarrier");
    for (uint32_t ch = dst / kChunk; ch <= (dst + bytes - 1) / kChunk; ++ch) {
      if (b.chunk_readers[ch] > 0)
        fail("TMA issued into shared memory (chunk 0x%x) that an in-flight wgmma still reads: the stage was "
             "released before wgmma.wait_group retired its readers",
             ch * kChunk);
      ++b.chunk_pending[ch];
    }
  }
  cp.land = Clock::now() + std::chrono::microseconds(b.rand_us(config().tma_delay_us));
  {
    std::lock_guard<std::mutex> lk(b.dma_mu);
    b.queue.push_back(std::move(cp));
    // The block's copy engine starts with its first copy: most kernels issue none, and a thread started and
    // joined for each of a grid's thousand blocks cost more than they ran.
    if (!b.dma.joinable()) b.dma = std::thread(dma_loop, &b);
  }
  b.dma_cv.notify_one();
  std::lock_guard<std::mutex> sg(g_stats_mu);
  ++g_stats.tma_copies;
}

void tma_prefetch_l2(const void* tmap, int rank, const int* c) {
  const TensorMapRec& t = tensor_map_rec(tmap);
  if (t.rank != rank) fail("cp.async.bulk.prefetch.tensor.%dd with a rank-%d tensor map", rank, t.rank);
  for (int i = 0; i < rank; ++i)
    if (static_cast<int64_t>(c[i]) + t.box[i] <= 0 || static_cast<int64_t>(c[i]) >= static_cast<int64_t>(t.dims[i]))
      fail("cp.async.bulk.prefetch.tensor: the box at coordinate %d = %d (box %u) lies outside the tensor's %llu",
           i, c[i], t.box[i], static_cast<unsigned long long>(t.dims[i]));
  std::lock_guard<std::mutex> sg(g_stats_mu);
  ++g_stats.tma_prefetches;
  PrefetchRec r{t.base, rank, {0, 0, 0, 0, 0}};
  for (int i = 0; i < rank; ++i) r.coords[i] = c[i];
  g_prefetches.push_back(r);
}

std::vector<PrefetchRec> take_prefetches() {
  std::lock_guard<std::mutex> sg(g_stats_mu);
  std::vector<PrefetchRec> out;
  out.swap(g_prefetches);
  return out;
}

void fence_proxy_async() {
  if (cur().blk == nullptr) return;
  Block& b = blk();
  std::lock_guard<std::mutex> g(b.fence_mu);
  for (auto& [range, held] : b.fenced_sources)
    std::memcpy(held.data(), smem_at(range.first, static_cast<uint32_t>(range.second), "fence.proxy.async"),
                held.size());
}

// Named barrier `id` for an arrival of `op` (bar.sync or bar.arrive) over `threads` threads; b.mu held.
static NamedBar& named_bar_at(Block& b, int id, int threads, const char* op) {
  if (id < 1 || id > 15) fail("%s id %d (1..15 for named barriers)", op, id);
  if (threads % 32 || threads <= 0 || threads > b.nthreads) fail("%s thread count %d", op, threads);
  NamedBar& nb = b.named[id];
  if (nb.arrived == 0) {
    nb.expected = threads;
    nb.sync_file = nullptr;
  }
  if (nb.expected != threads) fail("%s %d with thread counts %d and %d", op, id, nb.expected, threads);
  return nb;
}

void named_barrier(int id, int threads, const char* file, int line) {
  Block& b = blk();
  std::unique_lock<std::mutex> lk(b.mu);
  NamedBar& nb = named_bar_at(b, id, threads, "bar.sync");
  // bar.sync is barrier.sync.aligned (PTX ISA): every thread waiting in one phase of a barrier executes
  // the same instruction. Two call sites in one phase are undefined; on the H100 compute-sanitizer's
  // synccheck reports "Divergent thread(s) in block" (bar.arrive, the producer's side, may be anywhere).
  if (nb.sync_file == nullptr) {
    nb.sync_file = file;
    nb.sync_line = line;
  } else if (nb.sync_line != line || std::strcmp(nb.sync_file, file) != 0) {
    fail("bar.sync %d, %d reached from two call sites in one phase (%s:%d and %s:%d): bar.sync is .aligned, "
         "every thread of a phase must wait at the same instruction",
         id, threads, nb.sync_file, nb.sync_line, file, line);
  }
  arrive_and_wait(b, lk, nb.arrived, nb.gen, threads, WaitWhat::named_barrier(id, threads));
}

void named_barrier_arrive(int id, int threads) {
  Block& b = blk();
  std::lock_guard<std::mutex> lk(b.mu);
  NamedBar& nb = named_bar_at(b, id, threads, "bar.arrive");
  progress();
  if (++nb.arrived == threads) {  // the arrival that completes the barrier releases the threads in bar.sync
    nb.arrived = 0;
    ++nb.gen;
    b.cv.notify_all();
  }
}

// ---- wgmma (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions") ----
void wgmma_fence() {
  Block& b = blk();
  Group& g = *b.wgs[cur().tid / 128];
  collective(g, Op::WgFence, [](Deposit&) {}, [&] {}, [&](int me) { g.fenced[me] = true; });
}

void wgmma_commit() {
  Block& b = blk();
  Group& g = *b.wgs[cur().tid / 128];
  collective(
      g, Op::WgCommit, [](Deposit&) {},
      [&] {
        g.committed.push_back(std::move(g.open));
        g.open.clear();
      },
      [](int) {});
}

void wgmma_wait(int pending) {
  Block& b = blk();
  Group& g = *b.wgs[cur().tid / 128];
  collective(
      g, Op::WgWait, [&](Deposit& d) { d.pending = pending; },
      [&] {
        for (int t = 0; t < 128; ++t)
          if (g.dep[t].pending != pending) fail("wgmma.wait_group with different N across the warpgroup");
        // The products finish at some time before the wait returns: as late as possible here, so that
        // anything that touches the operands in between is caught.
        g.retire_at = Clock::now();
        if (!g.committed.empty() && static_cast<int>(g.committed.size()) > pending)
          g.retire_at += std::chrono::microseconds(b.rand_us(config().wait_delay_us));
      },
      [](int) {});
  // The delay passes outside the collective, whose leader holds the warpgroup's lock: the block's other
  // warpgroups run meanwhile, as OS threads and as fibers (which yield; a sleep would stall the block).
  pass_time_until(g.retire_at);
  collective(
      g, Op::WgRetire, [](Deposit&) {},
      [&] {
        while (static_cast<int>(g.committed.size()) > pending) {
          auto& grp = g.committed.front();
          for (size_t i = 0; i < grp.size(); ++i) {
            auto later_use = [&](int t, const float* d) {
              for (size_t j = i + 1; j < grp.size(); ++j)
                if (grp[j].d[t] == d) return true;
              for (size_t q = 1; q < g.committed.size(); ++q)
                for (auto& o : g.committed[q])
                  if (o.d[t] == d) return true;
              for (auto& o : g.open)
                if (o.d[t] == d) return true;
              return false;
            };
            retire(b, g, grp[i], later_use);
          }
          g.committed.pop_front();
        }
        for (int t = 0; t < 128; ++t) g.fenced[t] = false;
      },
      [](int) {});
}

void wgmma_ss(int n, float* d, uint64_t desc_a, uint64_t desc_b, int ta, int tb, int scale_d) {
  wg_mma(n, d, nullptr, desc_a, desc_b, 0, ta, tb, scale_d);
}
void wgmma_rs(int n, float* d, const uint32_t* a, uint64_t desc_b, int tb, int scale_d) {
  wg_mma(n, d, a, 0, desc_b, 1, 0, tb, scale_d);
}

// ---- setmaxnreg (PTX ISA "Miscellaneous Instructions: setmaxnreg") ----
void setmaxnreg(int regs, bool inc) {
  Block& b = blk();
  const int wg = cur().tid / 128;
  Group& g = *b.wgs[wg];
  // The collective checks the instruction and files an inc's request; the threads then wait for the pool
  // outside it (a wait inside the leader would hold the warpgroup's lock, and with fibers no other fiber
  // of the block could take it). Whichever thread first sees the pool hold enough grants the request.
  collective(
      g, Op::SetMaxNReg, [&](Deposit& d) { d.pending = regs, d.kind = inc ? 1 : 0; },
      [&] {
        for (int t = 0; t < 128; ++t)
          if (g.dep[t].pending != regs || g.dep[t].kind != (inc ? 1 : 0))
            fail("setmaxnreg: the warpgroup's threads ran different instructions (.sync.aligned)");
        if (regs < 24 || regs > 256 || regs % 8) fail("setmaxnreg %d: not a multiple of 8 in [24, 256]", regs);
        std::lock_guard<std::mutex> lk(b.mu);
        int& cur = b.wg_regs[wg];
        if (inc) {
          if (regs < cur) fail("setmaxnreg.inc to %d below warpgroup %d's %d registers", regs, wg, cur);
          b.wg_inc_regs[wg] = regs;
          ++b.wg_inc_filed[wg];
        } else {
          if (regs > cur) fail("setmaxnreg.dec to %d above warpgroup %d's %d registers", regs, wg, cur);
          b.reg_pool += 128L * (cur - regs);
          cur = regs;
          b.cv.notify_all();
        }
      },
      [](int) {});
  if (!inc) return;
  std::unique_lock<std::mutex> lk(b.mu);
  // No new request of this warpgroup can be filed before this thread joins its next collective.
  const uint64_t mine = b.wg_inc_filed[wg];
  timed_wait(
      lk, b.cv,
      [&] {
        if (b.wg_inc_granted[wg] >= mine) return true;
        const long need = 128L * (b.wg_inc_regs[wg] - b.wg_regs[wg]);
        if (b.reg_pool < need) return false;
        b.reg_pool -= need;
        b.wg_regs[wg] = b.wg_inc_regs[wg];
        b.wg_inc_granted[wg] = mine;
        b.cv.notify_all();
        return true;
      },
      "setmaxnreg.inc (the block's register pool never held enough: do the warpgroups' counts sum above the count "
      "at entry times the threads?)");
}

// ---- sm_80 helpers ----
// cp.async (PTX ISA "cp.async", "cp.async.commit_group", "cp.async.wait_group"): a copy is taken from global
// memory when issued and lands only when a wait_group of its thread requires it (or the thread exits);
// until then its destination reads as NaN (0xFF bytes), so a read that a missing wait or barrier leaves
// early sees garbage, as it may on the GPU, and a refill of a stage another warp still reads overwrites it.
namespace {
void land(std::vector<CpAsyncCopy>& group) {
  for (auto& c : group) std::memcpy(c.dst, c.data.data(), c.data.size());
  group.clear();
}
}  // namespace

void cp_async(void* dst, const void* src, int bytes, bool full) {
  const uint32_t off = smem_offset(dst);
  if (off % bytes) fail("cp.async of %d bytes to shared address 0x%x, not %d-byte aligned", bytes, off, bytes);
  if (full && reinterpret_cast<uintptr_t>(src) % bytes)
    fail("cp.async of %d bytes from global address %p, not %d-byte aligned", bytes, src, bytes);
  unsigned char* p = smem_at(off, bytes, "cp.async");
  CpAsyncCopy c{p, std::vector<unsigned char>(bytes, 0)};
  if (full) std::memcpy(c.data.data(), src, bytes);
  std::memset(p, 0xFF, bytes);
  cur().cp.open.push_back(std::move(c));
}
void cp_async_commit() {
  cur().cp.committed.push_back(std::move(cur().cp.open));
  cur().cp.open.clear();
}
void cp_async_wait(int pending) {
  // Copies not yet committed are not waited for by wait_group (PTX ISA); they stay in flight.
  const size_t n = cur().cp.committed.size();
  if (static_cast<int>(n) <= pending) return;
  const size_t done = n - static_cast<size_t>(pending);
  for (size_t i = 0; i < done; ++i) land(cur().cp.committed[i]);
  cur().cp.committed.erase(cur().cp.committed.begin(), cur().cp.committed.begin() + static_cast<long>(done));
}
void cp_async_land_all() {
  cp_async_wait(0);
  land(cur().cp.open);
}

// ---- sm_90 bulk copies shared -> global ----
namespace {
std::mutex g_bulk_add_mu;  // the hardware's reductions are atomic per element
void read_source(BulkCopy& c) {
  if (c.read) return;
  c.data.resize(static_cast<size_t>(c.bytes));
  std::memcpy(c.data.data(), smem_at(c.src, c.bytes, "cp.async.bulk source"), c.data.size());
  c.read = true;
}
void complete(std::vector<BulkCopy>& group) {
  for (BulkCopy& c : group) {
    read_source(c);
    const std::vector<unsigned char>& data = c.data;
    if (!c.add_f32) {
      std::memcpy(c.dst, data.data(), data.size());
      continue;
    }
    std::lock_guard<std::mutex> lk(g_bulk_add_mu);
    for (int i = 0; i < c.bytes / 4; ++i) {
      float a, v;
      std::memcpy(&a, c.dst + 4 * i, 4);
      std::memcpy(&v, data.data() + 4 * i, 4);
      a += v;
      std::memcpy(c.dst + 4 * i, &a, 4);
    }
  }
}
}  // namespace

void bulk_copy(void* gdst, const void* ssrc, int bytes, bool add_f32) {
  const uint32_t src = smem_offset(ssrc);
  const char* what = add_f32 ? "cp.reduce.async.bulk" : "cp.async.bulk";
  if (bytes <= 0 || bytes % 16) fail("%s of %d bytes: not a positive multiple of 16", what, bytes);
  if (src % 16) fail("%s from shared address 0x%x, not 16-byte aligned", what, src);
  if (reinterpret_cast<uintptr_t>(gdst) % 16) fail("%s to global address %p, not 16-byte aligned", what, gdst);
  const unsigned char* now = smem_at(src, bytes, what);  // in the block's shared memory
  {
    Block& b = blk();
    std::lock_guard<std::mutex> g(b.fence_mu);
    auto [it, first] = b.fenced_sources.try_emplace({src, bytes});
    if (first)  // nothing to compare with yet: the range's first copy is not checked
      it->second.assign(now, now + bytes);
    else if (std::memcmp(it->second.data(), now, static_cast<size_t>(bytes)) != 0)
      fail("%s from shared address 0x%x (%d bytes) by thread %d: generic stores changed that memory after the "
           "block's last fence.proxy.async, so the async proxy may not see them (each writing thread needs "
           "fence.proxy.async.shared::cta before the barrier that precedes the copy)",
           what, src, bytes, cur().tid);
  }
  cur().bulk.open.push_back(BulkCopy{static_cast<unsigned char*>(gdst), src, bytes, add_f32});
}
void bulk_commit() {
  cur().bulk.committed.push_back(std::move(cur().bulk.open));
  cur().bulk.open.clear();
}
void bulk_wait(int pending, bool read_only) {
  const size_t n = cur().bulk.committed.size();
  if (static_cast<int>(n) <= pending) return;
  // The copy engine takes a while (0..EMU_TMA_DELAY_US): the block's other threads run meanwhile, so a
  // buffer freed before this wait can be refilled before the copy reads it.
  pass_time_until(Clock::now() + std::chrono::microseconds(blk().rand_us(config().tma_delay_us)));
  if (read_only) {  // the older groups read their sources now; their writes wait for a full wait
    for (size_t i = 0; i < n - static_cast<size_t>(pending); ++i)
      for (BulkCopy& c : cur().bulk.committed[i]) read_source(c);
    return;
  }
  const size_t done = n - static_cast<size_t>(pending);
  for (size_t i = 0; i < done; ++i) complete(cur().bulk.committed[i]);
  cur().bulk.committed.erase(cur().bulk.committed.begin(), cur().bulk.committed.begin() + static_cast<long>(done));
}

void bulk_check_release(const char* what) {
  size_t pending = cur().bulk.open.size();
  for (const auto& group : cur().bulk.committed) pending += group.size();
  if (pending > 0)
    fail("%s by a thread with %zu bulk copies not complete: their global writes are not ordered before it "
         "(a full cp.async.bulk.wait_group is missing)",
         what, pending);
}

void ldmatrix_x4(uint32_t* r, const void* p, bool trans) {
  Block& b = blk();
  Group& g = *b.warps[cur().tid / 32];
  collective(
      g, Op::LdMatrix, [&](Deposit& d) { d.ptr = p; },
      [&] {
        std::lock_guard<std::mutex> lk(b.mu);  // chunk state
        for (int l = 0; l < 32; ++l)
          for (int i = 0; i < 4; ++i) {
            uint16_t h[2];
            for (int e = 0; e < 2; ++e) {
              // matrix i: row addresses from lanes 8i..8i+7; lane l gets row l/4, cols 2(l%4)+e (or the
              // transpose: row 2(l%4)+e, col l/4).
              const int row = trans ? 2 * (l % 4) + e : l / 4, col = trans ? l / 4 : 2 * (l % 4) + e;
              const auto* rp = static_cast<const unsigned char*>(g.dep[8 * i + row].ptr);
              const uint32_t off = smem_offset(rp) + 2 * col;
              if (b.chunk_pending[off / kChunk] > 0)
                fail("ldmatrix reads shared memory (chunk 0x%x) with an outstanding TMA write: the full barrier "
                     "was not waited for",
                     off / kChunk * kChunk);
              std::memcpy(&h[e], smem_at(off, 2, "ldmatrix"), 2);
            }
            g.result4[4 * l + i] = h[0] | (static_cast<uint32_t>(h[1]) << 16);
          }
      },
      [&](int me) {
        for (int i = 0; i < 4; ++i) r[i] = g.result4[4 * me + i];
      });
}

void mma_16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  Block& b = blk();
  Group& g = *b.warps[cur().tid / 32];
  collective(
      g, Op::Mma16816,
      [&](Deposit& dp) {
        std::memcpy(dp.regs, a, 16);
        dp.bits = b0 | (static_cast<uint64_t>(b1) << 32);
        std::memcpy(dp.acc, d, 16);
      },
      [&] {
        float A[16][16], Bm[16][8];
        for (int l = 0; l < 32; ++l) {
          const int gq = l / 4, t = l % 4;
          for (int i = 0; i < 8; ++i) {
            const uint32_t v = g.dep[l].regs[i / 2];
            const float f = bf16_bits_to_float(static_cast<uint16_t>(i % 2 ? v >> 16 : v & 0xFFFF));
            A[gq + 8 * ((i / 2) % 2)][2 * t + (i % 2) + 8 * (i / 4)] = f;
            const uint32_t bv = static_cast<uint32_t>(g.dep[l].bits >> (32 * ((i / 2) % 2)));
            if (i < 4)
              Bm[2 * t + (i % 2) + 8 * (i / 2)][gq] = bf16_bits_to_float(static_cast<uint16_t>(i % 2 ? bv >> 16 : bv & 0xFFFF));
          }
        }
        for (int l = 0; l < 32; ++l) {
          const int gq = l / 4, t = l % 4;
          for (int i = 0; i < 4; ++i) {
            const int row = gq + 8 * (i / 2), col = 2 * t + (i % 2);
            double acc = g.dep[l].acc[i];
            for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[row][k]) * Bm[k][col];
            float f = static_cast<float>(acc);
            std::memcpy(&g.result4[4 * l + i], &f, 4);
          }
        }
      },
      [&](int me) {
        for (int i = 0; i < 4; ++i) std::memcpy(&d[i], &g.result4[4 * me + i], 4);
      });
}

// ---- global-memory flags ----
int spin_load_acquire(const int* flag) {
  SpinState& st = cur().spin;
  const int*& last = st.last;
  int& last_value = st.last_value;
  int64_t &since = st.since, &since_run = st.since_run;
  const int v = __atomic_load_n(flag, __ATOMIC_ACQUIRE);
  if (flag != last || v != last_value) {
    if (now_ns() - since > 1'000'000) set_waiting("");
    last = flag, last_value = v, since = now_ns(), since_run = run_clock_ns();
  } else {
    if (static_cast<int64_t>(stalled_ns(static_cast<uint64_t>(since_run))) > timeout_ns()) {
      report_waits(nullptr);
      fail("deadlock: a spin on the global flag %p has read %d while the whole grid made no progress for %u s",
           static_cast<const void*>(flag), v, config().timeout_s);
    }
    // Backs off after 1 ms: a dozen threads spinning with yield() took CPU time from the 2 cores that the
    // blocks they wait for need.
    if (now_ns() - since > 1'000'000) {
      set_waiting(WaitWhat::spin(flag, v));
      if (in_fiber())
        fiber_yield();  // the scheduler backs off when no fiber makes progress
      else
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    } else if (in_fiber()) {
      fiber_yield();
    } else {
      std::this_thread::yield();
    }
  }
  return v;
}

// ---- launch ----
void register_global(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> g(g_globals_mu);
  g_globals.emplace_back(reinterpret_cast<uintptr_t>(p), bytes);
}
void unregister_global(const void* p) {
  std::lock_guard<std::mutex> g(g_globals_mu);
  for (size_t i = 0; i < g_globals.size(); ++i)
    if (g_globals[i].first == reinterpret_cast<uintptr_t>(p)) {
      g_globals.erase(g_globals.begin() + static_cast<long>(i));
      return;
    }
}
void clear_globals() {
  std::lock_guard<std::mutex> g(g_globals_mu);
  g_globals.clear();
}

void set_max_dynamic_smem(const void* func, int bytes) {
  std::lock_guard<std::mutex> g(g_max_dyn_smem_mu);
  g_max_dyn_smem[func] = bytes;
}
// At the launch, as CUDA checks it (a launch queued before cudaFuncSetAttribute raised the limit is wrong)
void check_dynamic_smem(const void* func, size_t smem) {
  int max_dyn = 48 * 1024;
  {
    std::lock_guard<std::mutex> g(g_max_dyn_smem_mu);
    const auto it = g_max_dyn_smem.find(func);
    if (it != g_max_dyn_smem.end()) max_dyn = it->second;
  }
  if (smem > static_cast<size_t>(max_dyn))
    fail("launch: %zu bytes of dynamic shared memory above the function's limit %d (cudaFuncSetAttribute)", smem, max_dyn);
}

// EMU_FIBERS: the block's threads as fibers on this OS thread. Each round runs every live fiber once, until
// it waits (yields) or ends, in an order drawn at random; a round in which nothing moved the grid on
// pauses a little, up to 1 ms, so that a block waiting for a copy or another block leaves the cores to them.
void run_block_fibers(Block* b, dim3 block, dim3 grid, const std::function<void()>& body) {
  blockIdx = uint3{b->idx.x, b->idx.y, b->idx.z};
  blockDim = block;
  gridDim = grid;
  std::vector<Fiber> fibers(static_cast<size_t>(b->nthreads));
  std::vector<int> order(fibers.size());
  for (size_t t = 0; t < fibers.size(); ++t) {
    Fiber& f = fibers[t];
    f.ctx.blk = b;
    f.ctx.tid = static_cast<int>(t);
    f.tidx = uint3{static_cast<unsigned>(t) % block.x, static_cast<unsigned>(t) / block.x % block.y,
                   static_cast<unsigned>(t) / (block.x * block.y)};
    f.stack = take_stack();
    f.sp = initial_sp(f.stack);
    order[t] = static_cast<int>(t);
  }
  const std::function<void()> fiber_body = [&] {
    body();
    thread_exit_hook();
  };
  g_fiber_body = &fiber_body;
  std::mt19937 rng(config().seed * 2654435761u + b->idx.x * 7919u + b->idx.y * 131u + b->idx.z);
  size_t live = fibers.size();
  unsigned idle_us = 0;
  while (live > 0) {
    const uint64_t events = g_progress_events.load(std::memory_order_relaxed), own_events = t_fiber_events;
    std::shuffle(order.begin(), order.end(), rng);
    size_t ended = 0;
    for (int t : order) {
      Fiber& f = fibers[static_cast<size_t>(t)];
      if (f.done) continue;
      threadIdx = f.tidx;
      g_fiber = &f;
      emu_fiber_switch(&g_sched_sp, f.sp);
      g_fiber = nullptr;
      if (f.done) {
        give_stack(f.stack);
        ++ended;
      }
    }
    live -= ended;
    const bool moved = t_fiber_events != own_events;
    if (moved) g_progress_events.fetch_add(1, std::memory_order_relaxed);
    if (ended == 0 && !moved && events == g_progress_events.load(std::memory_order_relaxed)) {
      // A completing mbarrier phase (a TMA copy landing) notifies the block's condition variable: it ends
      // the pause at once. Another block's flag or arrival is seen after the pause.
      idle_us = std::min(1000u, idle_us ? 2 * idle_us : 10u);
      std::unique_lock<std::mutex> lk(b->mu);
      b->cv.wait_for(lk, std::chrono::microseconds(idle_us));
    } else {
      idle_us = 0;
    }
  }
  g_fiber_body = nullptr;
}

void run_grid(const void* func, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  const Config& cfg = config();
  const unsigned nthreads = block.x * block.y * block.z;
  if (nthreads == 0 || nthreads > 1024) fail("launch: block (%u,%u,%u): %u threads", block.x, block.y, block.z, nthreads);
  if (nthreads % 32) fail("launch: %u threads is not a whole number of warps (not modelled)", nthreads);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535)
    fail("launch: grid (%u,%u,%u) is invalid", grid.x, grid.y, grid.z);
  if (smem > 227 * 1024) fail("launch: %zu bytes of dynamic shared memory above sm_90's 227 KB", smem);
  if (cfg.smem_offset + smem > kWindowBytes) fail("EMU_SMEM_OFFSET too large");
  // Blocks run concurrently, up to EMU_CONCURRENT_BLOCKS at a time (0: the whole grid at once), as
  // the resident blocks of a persistent grid do on the GPU.
  std::vector<dim3> ids;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) ids.push_back(dim3(bx, by, bz));
  // The default (0) is the whole grid, in waves of at most kMaxEmuThreads threads: each GPU thread is an
  // OS thread, and GPT-2's attention grid (192 blocks x 384) would exceed the process's thread mappings.
  constexpr size_t kMaxEmuThreads = 24576;
  const size_t wave = cfg.concurrent_blocks ? cfg.concurrent_blocks
                                            : std::max<size_t>(1, std::min(ids.size(), kMaxEmuThreads / nthreads));
  // (With fibers a block is one OS thread, but its fibers' stacks and contexts are the same in number.)
  for (size_t first = 0; first < ids.size(); first += wave) {
    const size_t last = std::min(ids.size(), first + wave);
    {
      std::lock_guard<std::mutex> gg(g_gate.mu);
      g_gate.size = last - first, g_gate.keys.clear(), g_gate.order.clear(), g_gate.released = 0;
    }
    std::vector<std::unique_ptr<Block>> blocks;
    std::vector<std::thread> threads;
    for (size_t bi = first; bi < last; ++bi) {
      const unsigned bx = ids[bi].x, by = ids[bi].y, bz = ids[bi].z;
      blocks.emplace_back(new Block);
      Block& b = *blocks.back();
      b.idx = ids[bi];
      b.nthreads = static_cast<int>(nthreads);
      b.live = static_cast<int>(nthreads);
      b.window_store = take_window();  // all 0xFF: uninitialised smem reads as bf16 NaN
      b.window = aligned_window(b.window_store);
      b.dyn_off = cfg.smem_offset;
      b.dyn_bytes = static_cast<uint32_t>(smem);
      b.chunk_version.assign(kWindowBytes / kChunk, 0);
      b.chunk_pending.assign(kWindowBytes / kChunk, 0);
      b.chunk_readers.assign(kWindowBytes / kChunk, 0);
      b.rng.seed(cfg.seed * 7919u + bx * 131u + by * 17u + bz);
      const int nw = static_cast<int>(nthreads) / 32, nwg = static_cast<int>(nthreads) / 128;  // whole warpgroups
      b.wg_regs.assign(nwg, std::min(256, static_cast<int>(65536 / nthreads) / 8 * 8));
      b.wg_inc_regs.assign(nwg, 0);
      b.wg_inc_filed.assign(nwg, 0);
      b.wg_inc_granted.assign(nwg, 0);
      for (int w = 0; w < nw; ++w) {
        b.warps.emplace_back(new Group);
        Group& g = *b.warps.back();
        g.size = 32, g.base = 32 * w;
        g.dep.resize(32), g.result.resize(32), g.result4.resize(128);
      }
      for (int w = 0; w < nwg; ++w) {
        b.wgs.emplace_back(new Group);
        Group& g = *b.wgs.back();
        g.size = 128, g.base = 128 * w;
        g.dep.resize(128), g.result.resize(128), g.fenced.assign(128, false), g.last_written.resize(128);
        g.chain_val.resize(128);
      }
      b.waiting.assign(nthreads, WaitWhat{});
    }
    {
      std::lock_guard<std::mutex> rg(g_resident_mu);
      for (auto& bp : blocks) g_resident.push_back(bp.get());
    }
    for (auto& bp : blocks) {
      Block* bb = bp.get();
      if (cfg.fibers) {
        threads.emplace_back([&, bb] { run_block_fibers(bb, block, grid, body); });
        continue;
      }
      for (unsigned t = 0; t < nthreads; ++t)
        threads.emplace_back([&, bb, t] {
          cur().blk = bb;
          cur().tid = static_cast<int>(t);  // the linear thread index: warps are consecutive x, then y, then z
          threadIdx = uint3{t % block.x, t / block.x % block.y, t / (block.x * block.y)};
          blockIdx = uint3{bb->idx.x, bb->idx.y, bb->idx.z};
          blockDim = block;
          gridDim = grid;
          body();
          thread_exit_hook();
        });
    }
    for (auto& th : threads) th.join();
    {
      std::lock_guard<std::mutex> rg(g_resident_mu);
      g_resident.clear();
    }
    for (auto& bp : blocks) {
      Block& b = *bp;
      {
        std::lock_guard<std::mutex> lk(b.dma_mu);
        b.dma_stop = true;
      }
      b.dma_cv.notify_all();
      if (b.dma.joinable()) b.dma.join();
      // Every phase the kernel started must have completed: a partial phase means mismatched arrival
      // counts or transaction bytes.
      for (auto& kv : b.bars) {
        const Mbar& m = kv.second;
        if (m.pending != m.count || m.tx != 0)
          fail("block (%u,%u,%u) ended with mbarrier 0x%x in an incomplete phase %u: %u of %u arrivals missing, "
               "tx-count %lld",
               b.idx.x, b.idx.y, b.idx.z, kv.first, m.phase, m.pending, m.count, static_cast<long long>(m.tx));
      }
      // Arrivals left at a named barrier: a bar.arrive that no bar.sync consumed, so the kernel's two
      // sides disagree on how many handoffs there are.
      for (auto& kv : b.named)
        if (kv.second.arrived != 0)
          fail("block (%u,%u,%u) ended with %d of %d arrivals at named barrier %d", b.idx.x, b.idx.y, b.idx.z,
               kv.second.arrived, kv.second.expected, kv.first);
      std::lock_guard<std::mutex> sg(g_stats_mu);
      ++g_stats.blocks;
    }
  }
}

}  // namespace emu
