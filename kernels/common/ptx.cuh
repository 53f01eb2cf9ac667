// The one home of the project's inline PTX (STYLE.md: one home for each primitive). .cu files only.
//
//  * every architecture: 2^x and 1/x as single special-function instructions (.ftz).
//  * sm_90+ (no-ops before): programmatic dependent launch's trigger and wait (griddepcontrol).
//  * sm_80+: cp.async (16 and 4 bytes, zero-fill), ldmatrix, mma.sync m16n8k16 bf16; an acquire load
//    and a release add on a global flag, for blocks that take turns.
//  * sm_90 (plain): mbarrier with transaction counts, TMA (cp.async.bulk.tensor) into shared memory,
//    bulk copies and float reductions from shared to global memory (cp.async.bulk, cp.reduce.async.bulk),
//    the async-proxy fences.
//  * sm_90a only: wgmma (fence, mma_async with both operands in shared memory or A in registers,
//    commit, wait) and its shared-memory matrix descriptor; setmaxnreg.
//    These exist only in an sm_90a compilation pass (__CUDA_ARCH_FEAT_SM90_ALL); callers guard their use
//    the same way, so a file that includes this header still compiles for sm_80 and plain sm_90.
//
// Sources for the layout facts used here (read, not copied): the PTX ISA ("Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate Operation", "Matrix Descriptor Format", "mbarrier", "cp.async.bulk.tensor");
// CUTLASS cute/arch/mma_sm90_desc.hpp (GmmaDescriptor bit fields), cute/atom/mma_traits_sm90_gmma.hpp
// (make_gmma_desc: which stride is LBO and which SBO per major mode; CLayout_64xN, the accumulator
// fragment), cute/arch/copy_sm90_tma.hpp and cutlass/arch/barrier.h (instruction spellings), at
// NVIDIA/cutlass 7107b05535f8977f5ecb9d01ee203205b1fd9bc4.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gpt2::cuda {

// Generic -> shared-window address, as the shared-memory PTX instructions take it.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------------------------------------------
// Every architecture: the special-function unit's 2^x and 1/x, each one MUFU instruction.
//
// With .ftz: exp2f, __expf and __fdividef compile to ex2.approx.f32 and div.approx.f32 without it (nvcc
// 13.0, no --use_fast_math), and there the hardware's flush of subnormals is undone by extra
// instructions around the MUFU, on the dependent chain (triton-lang/triton#3816: exp2 without .ftz is
// MUFU.EX2 "and instructions to check and adjust for denorms"). A result below 2^-126 is 0 here instead:
// nothing the softmax or the GELU computes can tell (a probability or a GELU of 1e-38 next to values of
// order one). Both about 2 ulp (PTX ISA, ex2 and rcp); special values as exp2f and 1/x give them (2^-inf
// = 0, 2^inf = inf, 1/inf = 0, NaN stays NaN).

__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------------
// Programmatic dependent launch (PTX griddepcontrol, sm_90+; compiled to nothing before sm_90).
//
// The first statement of every kernel in kernels/ (tools/check_launches.py checks it): it lets the next
// kernel of the stream be launched now, then waits until the previous kernel has completed and its memory
// writes are visible. With a kernel launched without the programmatic attribute (launch.cuh; GPT2_PDL off,
// a device before 9.0) both are no-ops (PTX ISA: griddepcontrol.wait returns at once when the grid has no
// programmatic prerequisites). With it, the next kernel's launch and its blocks' dispatch overlap this
// kernel's last wave, and nothing of either kernel runs before its wait, so no kernel can read or write
// before its inputs are complete: the same memory order as plain stream order. Its trigger is given at
// the top because it only fires once every block of this grid has given it, i.e. once all of them are
// resident: the next kernel's blocks can then take only what this kernel's finished blocks free, never a
// slot this kernel still needs.
__device__ __forceinline__ void griddep_launch_dependents_then_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------------------
// sm_80+: cp.async, ldmatrix, mma.sync

// 16 bytes global -> shared, bypassing L1 and the registers. !full writes 16 zero bytes and reads
// nothing (src must still be a valid address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool full) {
  const int src_bytes = full ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
// 4 bytes global -> shared (through L1: .cg takes 16-byte copies only); !full writes zeros.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool full) {
  const int src_bytes = full ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives matrix
// i (lane l: row l/4, columns 2(l%4), 2(l%4)+1; transposed with _trans).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// d += a (16x16, row) * b (16x8, col); bf16 operands, fp32 accumulators. Fragments: a0..a3 = (rows
// g, g+8) x (cols 2t.., 2t+8..), b0/b1 = k 2t.. / 2t+8.. of column g, d0,d1 at (g, 2t..), d2,d3 at
// (g+8, 2t..), with g = lane/4, t = lane%4.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------------------------------------------
// sm_70+: a flag in global memory that orders blocks (CUTLASS cutlass/barrier.h spells them the same way)

// Acquire load at GPU scope: what the block that released `flag` wrote before releasing it is visible
// to this thread (and, after a block-wide barrier, to the whole block) once the value is seen.
__device__ __forceinline__ int ld_acquire_gpu(const int* flag) {
  int v;
  asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
  return v;
}
// Release add at GPU scope: every write this thread made (and, after a block-wide barrier, every write
// of its block) becomes visible before the new value does.
__device__ __forceinline__ void red_release_gpu_add(int* flag, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" : : "l"(flag), "r"(v) : "memory");
}

// A wait that has not completed after 10 seconds is a bug (a count or a phase that never comes): it traps
// rather than hanging the job, so the launch fails with an error the host's CUDA_CHECK reports, within
// seconds instead of at a test's or a job's time limit. The bound is in time (%globaltimer, ns), not in
// tries, because how long one try suspends is up to the hardware; 10 s leaves room for compute-sanitizer's
// slowdown. No printf before the trap: a function call in a kernel that issues wgmma makes ptxas
// serialize every wgmma (warning C7510).
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
constexpr uint64_t kBarrierWaitTrapNs = 10'000'000'000ull;

// Waits (acquire, as ld_acquire_gpu) until `flag`, which other blocks raise with red_release_gpu_add,
// reaches `target`; traps after kBarrierWaitTrapNs. The clock is read once every 256 tries, so a wait that
// completes soon never reads it.
__device__ __forceinline__ void wait_flag_at_least(const int* flag, int target) {
  uint32_t tries = 0;
  uint64_t t0 = 0;
  while (ld_acquire_gpu(flag) < target) {
    if ((++tries & 255u) == 0) {
      const uint64_t now = global_timer_ns();
      if (t0 == 0) t0 = now;
      else if (now - t0 > kBarrierWaitTrapNs) __trap();
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// sm_90: mbarrier, TMA, proxy fence

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

// A shared-memory barrier completes a phase when `count` arrivals have happened and the transaction
// count (bytes announced by expect_tx, retired by TMA completions) is back to zero.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes the initialisations visible to the async proxy (TMA) and to other threads; a block-wide barrier
// must follow before anyone uses the barriers.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` more to come from TMA in the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Waits for the completion of the phase with parity `parity` (0 or 1). A barrier starts in phase 0, not
// completed, so waiting on parity 1 returns at once: the "previous" phase counts as complete. That is
// how a producer's first wait on an empty buffer passes (PTX ISA, mbarrier.test_wait/try_wait; CUTLASS
// make_producer_start_state starts the producer at phase 1 for the same reason).
// A wait that has not completed after kBarrierWaitTrapNs is a bug (a phase or byte count that never
// completes): it traps rather than hanging the job (above, with the clock).

// One try: true once the phase with parity `parity` has completed (it may suspend the thread a while).
__device__ __forceinline__ bool mbarrier_try_wait(uint32_t bar_addr, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar_addr), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  uint32_t tries = 0;
  uint64_t t0 = 0;
  while (!mbarrier_try_wait(addr, parity)) {
    // The clock is read once every 1024 tries, so a wait that completes soon never reads it.
    if ((++tries & 1023u) == 0) {
      const uint64_t now = global_timer_ns();
      if (t0 == 0) t0 = now;
      else if (now - t0 > kBarrierWaitTrapNs) __trap();
    }
  }
}

// The same wait with no time bound, for a warpgroup that raised its registers with setmaxnreg_inc: a
// trap anywhere in its code makes ptxas hold it to the register count at entry (nvcc 13.0: spills and
// serialized wgmma, C7512, in the attention backward's consumers), which undoes the setmaxnreg. Such a
// block needs a watchdog instead: a warpgroup that waits with mbarrier_wait for the unbounded waiter's
// progress, so that the trap still ends the launch when a phase never completes (the attention backward's
// producer waits for its consumers' last empty arrivals).
__device__ __forceinline__ void mbarrier_wait_untimed(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  while (!mbarrier_try_wait(addr, parity)) {
  }
}

// 2-D tile global -> shared through the tensor map (a __grid_constant__ kernel parameter, passed by its
// generic address). c0 is the innermost (contiguous) coordinate, in elements. Completion retires the
// box's bytes on `bar`; out-of-bounds elements of the box are written as zeros and still count.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tensor_map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}
// The same for a rank-3 tensor map: c2 is the outermost coordinate (a batch index, say).
__device__ __forceinline__ void tma_load_3d(void* dst, const void* tensor_map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// Prefetches the 2-D box at (c0, c1) of the tensor into L2 (no shared memory, no barrier, nothing to wait
// for): for data that ordinary loads read later, which then come from L2 instead of DRAM (the wgmma GEMM's
// GELU-gradient pre-activations where its shared memory has no room for them).
__device__ __forceinline__ void tma_prefetch_l2_2d(const void* tensor_map, int c0, int c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global [%0, {%1, %2}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tensor_map)),
               "r"(c0), "r"(c1)
               : "memory");
}
// Fetches the tensor map into the descriptor cache ahead of the first copy.
__device__ __forceinline__ void tma_prefetch_descriptor(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tensor_map)) : "memory");
}
// Orders this thread's generic-proxy shared-memory accesses before later async-proxy ones (TMA, wgmma)
// on the same memory (HOPPER.md: ordinary stores read next by the tensor cores or the copy engine).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The same between this thread's global-memory accesses of the two proxies: a bulk copy's or reduction's
// writes (async proxy) and the generic loads and flag updates around them.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Bulk copies shared -> global without a tensor map (PTX ISA "cp.async.bulk", "cp.reduce.async.bulk"):
// `bytes` contiguous bytes (a multiple of 16; both addresses 16-byte aligned), completed through this
// thread's bulk async-groups. The source is read asynchronously: it must not change until a
// bulk_wait_group covers the copy. bulk_reduce_add_f32 adds the source's floats to the destination's
// (each element atomically, at L2), bulk_store_global overwrites it.
__device__ __forceinline__ void bulk_store_global(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_u32(src)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_u32(src)), "r"(bytes)
               : "memory");
}
// Closes the group of this thread's bulk copies issued since the last commit.
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed bulk groups are incomplete: the older ones
// have read their sources and their writes are visible to this thread (not the .read form, which only
// frees the sources).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// The same wait for the sources only: the older groups have read their shared memory, which may be
// written again; their global writes may still be in flight.
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Barrier over `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is
// __syncthreads): lets one warpgroup synchronise without the others.
// bar.sync and bar.arrive are .aligned (PTX ISA: bar is barrier.aligned): every thread waiting in one
// phase must execute the same bar instruction (one call site per barrier phase: the CPU emulator checks
// it; two were the attention backward's synccheck error on the H100, 2026-11-27), and the lanes of a warp
// must execute it together. A lane-only branch just before (`if (lane == 0) ...`, a spin of one thread)
// may leave a warp diverged: __syncwarp reconverges it first.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  __syncwarp();
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Counts this thread's arrival at barrier `id` without waiting: with the barrier_sync of other threads
// on the same id and count, one group lets another go on (a producer-consumer handoff).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  __syncwarp();  // aligned, as named_barrier_sync
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#endif  // sm_90

// ---------------------------------------------------------------------------------------------------
// sm_90a: wgmma

// The 64-bit shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"; CUTLASS GmmaDescriptor):
//   bits  0-13  start address >> 4
//   bits 16-29  leading dimension byte offset (LBO) >> 4
//   bits 32-45  stride dimension byte offset (SBO) >> 4
//   bits 49-51  base offset (0: every 1024-byte swizzle atom starts 1024-aligned)
//   bits 62-63  layout: 0 none (interleave), 1 128-byte swizzle, 2 64-byte, 3 32-byte
// With the 128-byte swizzle and 16-bit elements (make_gmma_desc in CUTLASS):
//   K-major:  rows of 64 K values (128 bytes), 8 rows per 1024-byte atom; SBO = the stride between
//             8-row groups along M/N; LBO is unused (set to 1).
//   MN-major: rows of 64 M/N values (128 bytes) indexed by K, 8 K-rows per atom; SBO = the stride between
//             8-row groups along K; LBO = the stride between 64-wide blocks along M/N.
// A K step inside a 128-byte row moves the start address by its byte offset (32 bytes per k16): the
// hardware applies the swizzle to the computed address, which is why atoms must be 1024-aligned.
enum class WgmmaSwizzle : uint64_t { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };

__host__ __device__ constexpr uint64_t wgmma_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                                  WgmmaSwizzle swizzle) {
  return (static_cast<uint64_t>((smem_addr >> 4) & 0x3FFF)) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) | (static_cast<uint64_t>(swizzle) << 62);
}

// The accumulator fragment of wgmma .m64nNk16 with fp32 D (PTX ISA "Register Fragments: Matrix D";
// CUTLASS CLayout_64xN = ((4,8,4),(2,2,N/8)):((128,1,16),(64,8,512)) over a column-major 64xN tile):
// register i of lane `lane` in warp `warp` (0..3 within the warpgroup) holds
//   row = 16*warp + lane/4 + 8*((i/2)%2),   col = 8*(i/4) + 2*(lane%4) + i%2.
// So registers 4j..4j+3 are one m16n8 tile laid out like mma.sync's accumulator.
__host__ __device__ constexpr int wgmma_acc_row(int warp, int lane, int i) {
  return 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
}
__host__ __device__ constexpr int wgmma_acc_col(int lane, int i) {
  return 8 * (i / 4) + 2 * (lane % 4) + i % 2;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Before the first wgmma, and whenever other instructions touched the accumulator registers since.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending of this warpgroup's committed wgmma groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator register across the asynchronous window
// (CUTLASS warpgroup_fence_operand).
__device__ __forceinline__ void wgmma_fence_operand(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}
// The same for an A fragment register of a register-sourced wgmma: it must keep its value (and its
// physical register) until the wgmma.wait_group that retires the product; fencing it after the wait
// keeps it alive until then.
__device__ __forceinline__ void wgmma_fence_operand(uint32_t& r) {
  asm volatile("" : "+r"(r)::"memory");
}

// d (64x128, fp32) = [d +] A (64x16) B (16x128), both bf16 from shared memory through descriptors.
// kTransA / kTransB: the operand is MN-major in shared memory (1) rather than K-major (0); the transpose
// immediates exist for 16-bit types only. scale_d = 0 ignores d's old value (the first K step).
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, %67, %68;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}

// d (64x256, fp32) = [d +] A (64x16) B (16x256): as wgmma_m64n128k16_bf16, twice as wide (the 128x256
// GEMM tile's consumers; PTX ISA: N up to 256 in steps of 8 for .bf16).
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, %131, %132;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}

// d (64x64, fp32) += A (64x16) B (16x64): A bf16 from registers, B bf16 from shared memory through a
// descriptor. The A fragment is mma.sync m16n8k16's per warp (warp w of the warpgroup owns rows
// 16w..16w+15): a[0] = (row g, k 2t..2t+1), a[1] = (row g+8, k 2t..), a[2] = (row g, k 2t+8..),
// a[3] = (row g+8, k 2t+8..), g = lane/4, t = lane%4 (PTX ISA "Register Fragments: Matrix A" for
// .m64nNk16), which is how an m64nN accumulator's registers 8j..8j+7 lie over columns 16j..16j+15: a
// softmax'ed score tile feeds the next product without shuffles. kTransB: B is MN-major in shared memory.
// scale_d = 0 ignores d's old value.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_bf16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                        int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTransB));
}

// Register reallocation between the warpgroups of a warp-specialised block (PTX ISA "setmaxnreg";
// CUTLASS cutlass/arch/reg_reconfig.h spells it the same way). The block's registers are a pool of
// (registers at entry) x (threads): dec gives this warpgroup's above kRegs back to it, inc waits until
// the pool can raise this warpgroup to kRegs (new registers hold garbage until written). Rules the
// callers keep:
//  * every thread of the warpgroup executes the same instruction (.sync.aligned), so it comes before any
//    of its warps return, and each role is one branch of a single if/else;
//  * the register count at entry must be known to ptxas, i.e. __launch_bounds__(threads, 1) (otherwise
//    it drops the instruction: info C7508), and it is the launch bound's cap: 168 for 384 threads;
//  * the warpgroups' counts sum to the pool exactly: 128 x 24 (a TMA producer) + 2 x 128 x 240 (two
//    consumers) = 384 x 168. Above it inc waits forever; below it, too, by a CUTLASS maintainer's answer
//    (NVIDIA/cutlass issue 2007: 24 + 2 x 232 hung, 40 + 2 x 232 ran);
//  * no trap after setmaxnreg_inc (mbarrier_wait_untimed, above, says why).
// kRegs: a multiple of 8 in [24, 256].
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace gpt2::cuda
