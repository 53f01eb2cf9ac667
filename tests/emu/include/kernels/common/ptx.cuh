// EMULATOR SHADOW of kernels/common/ptx.cuh: the same declarations (names, signatures,
// templates), implemented on the CPU by the emulator (emu/runtime.h). Nothing here is copied from the
// repository's file: the layout facts come from the PTX ISA / CUTLASS (see README.md), so that the
// kernel's use of them is tested rather than assumed.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "emu/runtime.h"

namespace gpt2::cuda {

inline uint32_t smem_u32(const void* p) { return emu::smem_offset(p); }

// ---- every architecture: MUFU.EX2 and MUFU.RCP with .ftz (PTX ISA: subnormal inputs and results are
// sign-preserving zeros). The emulator computes them with glibc's exp2f and an exact division, then moves the
// result by up to 2 ulp (ex2) or 1 ulp (rcp), as far as the hardware's are allowed to be off, by a hash of
// the input's bits: the same input gives the same result (two kernels that compute the same probability
// still agree bit for bit), and the tests meet errors of the hardware's size rather than none. Results the
// hardware gives exactly stay exact: 2^n for a whole n, 1/x for a power of two x.
inline float flush_subnormal(float v) { return std::fabs(v) < FLT_MIN ? std::copysign(0.0f, v) : v; }
inline float mufu_error(float exact, float input, int max_ulps) {
  if (exact == 0.0f || !std::isfinite(exact)) return exact;
  uint32_t key;
  std::memcpy(&key, &input, sizeof(key));
  key *= 0x9E3779B1u;  // Fibonacci hashing: neighbouring inputs get unrelated offsets
  key ^= key >> 16;
  const int32_t ulps = static_cast<int32_t>(key % (2u * max_ulps + 1)) - max_ulps;
  uint32_t bits;
  std::memcpy(&bits, &exact, sizeof(bits));
  bits += static_cast<uint32_t>(ulps);  // the magnitude's bits: +-1 is one ulp either way
  float r;
  std::memcpy(&r, &bits, sizeof(r));
  return std::isfinite(r) && std::signbit(r) == std::signbit(exact) ? flush_subnormal(r) : exact;
}
inline float ex2_approx_ftz(float x) {
  x = flush_subnormal(x);
  const float exact = flush_subnormal(std::exp2(x));
  return x == std::nearbyint(x) ? exact : mufu_error(exact, x, 2);
}
inline float rcp_approx_ftz(float x) {
  x = flush_subnormal(x);
  const float exact = flush_subnormal(1.0f / x);
  int exponent;
  const float mantissa = std::fabs(std::frexp(x, &exponent));  // 0.5 for a power of two
  return mantissa == 0.5f ? exact : mufu_error(exact, x, 1);
}

// ---- sm_90+: programmatic dependent launch. Kernels run here one after another in stream order, so the wait
// has nothing to wait for; that each kernel waits before anything else is tools/check_launches.py's to check.
inline void griddep_launch_dependents_then_wait() {}

// ---- sm_80+ ----
inline void cp_async_16(void* dst, const void* src, bool full) { emu::cp_async(dst, src, 16, full); }
inline void cp_async_4(void* dst, const void* src, bool full) { emu::cp_async(dst, src, 4, full); }
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int kPending>
inline void cp_async_wait() { emu::cp_async_wait(kPending); }
inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) { emu::ldmatrix_x4(r, p, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) { emu::ldmatrix_x4(r, p, true); }
inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma_16816(d, a, b0, b1);
}
// A spin on a flag that other blocks set: yields, and a value unchanged for EMU_TIMEOUT_S is a deadlock.
inline int ld_acquire_gpu(const int* flag) { return emu::spin_load_acquire(flag); }
inline void red_release_gpu_add(int* flag, int v) {
  emu::bulk_check_release("red.release.gpu");
  __atomic_fetch_add(flag, v, __ATOMIC_RELEASE);
}
// The repository's traps after 10 s; here a count that never comes is the spin's deadlock report
// (emu::spin_load_acquire: EMU_TIMEOUT_S during which the whole grid made no progress).
inline void wait_flag_at_least(const int* flag, int target) {
  while (ld_acquire_gpu(flag) < target) {
  }
}

// ---- sm_90: mbarrier, TMA, proxy fence ----
inline void mbarrier_init(uint64_t* bar, uint32_t count) { emu::mbar_init(smem_u32(bar), count); }
inline void fence_mbarrier_init() { emu::mbar_fence_init(); }
inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) { emu::mbar_arrive(smem_u32(bar), bytes); }
inline void mbarrier_arrive(uint64_t* bar) { emu::mbar_arrive(smem_u32(bar), 0); }
// One arrival for the warp, by lane 0 after a rendezvous of all 32 lanes (__syncwarp).
inline void mbarrier_arrive_warp(uint64_t* bar, int lane) {
  emu::syncwarp(0xffffffffu);
  if (lane == 0) mbarrier_arrive(bar);
}
inline uint64_t global_timer_ns() { return emu::global_timer_ns(); }
constexpr uint64_t kBarrierWaitTrapNs = 10'000'000'000ull;
// try_wait.parity in a loop; like the repository's, a wait traps after 10 s (or EMU_TIMEOUT_S when that is
// longer), but 10 s during which the whole grid made no progress (emu::stalled_ns): emulated time runs
// thousands of times slower, and a wait on blocks that advance, such as the attention backward's key tile
// 15 waiting for key tiles 0..14 in turn, is not a phase that never completes.
inline bool mbarrier_try_wait(uint32_t bar_addr, uint32_t parity) { return emu::mbar_try_wait_parity(bar_addr, parity); }
inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  const uint64_t t0 = emu::global_timer_ns();
  const uint64_t limit = kBarrierWaitTrapNs > emu::config().timeout_s * 1'000'000'000ull
                             ? kBarrierWaitTrapNs
                             : emu::config().timeout_s * 1'000'000'000ull;
  while (!mbarrier_try_wait(addr, parity)) {
    if (emu::stalled_ns(t0) > limit) emu::trap("mbarrier wait exceeded its limit (phase never completed)");
  }
}
// No bound, as the repository's: a phase that never completes hangs here until another thread's bounded
// wait traps (the kernel's watchdog) or, without one, until the caller's `timeout` (emu.sh counts that
// as a hang, not a catch).
inline void mbarrier_wait_untimed(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  while (!mbarrier_try_wait(addr, parity)) {
  }
}
inline void tma_load_2d(void* dst, const void* tensor_map, uint64_t* bar, int c0, int c1) {
  const int c[2] = {c0, c1};
  emu::tma_load(smem_u32(dst), tensor_map, smem_u32(bar), 2, c);
}
inline void tma_load_3d(void* dst, const void* tensor_map, uint64_t* bar, int c0, int c1, int c2) {
  const int c[3] = {c0, c1, c2};
  emu::tma_load(smem_u32(dst), tensor_map, smem_u32(bar), 3, c);
}
inline void tma_prefetch_descriptor(const void* tensor_map) { emu::tma_prefetch(tensor_map); }
inline void tma_prefetch_l2_2d(const void* tensor_map, int c0, int c1) {
  const int c[2] = {c0, c1};
  emu::tma_prefetch_l2(tensor_map, 2, c);
}
inline void fence_proxy_async_shared() { emu::fence_proxy_async(); }
// Global memory between the proxies is not modelled (the emulated bulk reductions land in program order):
// this fence must not count as the shared one, which bulk_copy checks for.
inline void fence_proxy_async_global() {}
inline void bulk_store_global(void* dst, const void* src, uint32_t bytes) {
  emu::bulk_copy(dst, src, static_cast<int>(bytes), false);
}
inline void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  emu::bulk_copy(dst, src, static_cast<int>(bytes), true);
}
inline void bulk_commit_group() { emu::bulk_commit(); }
template <int kPending>
inline void bulk_wait_group() { emu::bulk_wait(kPending, false); }
template <int kPending>
inline void bulk_wait_group_read() { emu::bulk_wait(kPending, true); }
// The call site (GCC's __builtin_FILE/LINE in a default argument: the caller's) for the .aligned check.
inline void named_barrier_sync(int id, int threads, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::named_barrier(id, threads, file, line);
}
inline void named_barrier_arrive(int id, int threads) { emu::named_barrier_arrive(id, threads); }

// ---- sm_90a: wgmma ----
enum class WgmmaSwizzle : uint64_t { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };

// PTX ISA "Matrix Descriptor Format" (CUTLASS cute/arch/mma_sm90_desc.hpp GmmaDescriptor):
// start address [0,14) in 16-byte units, LBO [16,30), SBO [32,46) in 16-byte units, base offset
// [49,52) (left 0), layout type [62,64).
__host__ __device__ constexpr uint64_t wgmma_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                                  WgmmaSwizzle swizzle) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr >> 4) & 0x3FFFu);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= (static_cast<uint64_t>(swizzle) & 0x3u) << 62;
  return d;
}

// Accumulator fragment, from CUTLASS CLayout_64xN = ((4,8,4),(2,2,N/8)):((128,1,16),(64,8,512)) over
// a column-major 64xN tile (offset = row + 64*col): thread (t0 = lane%4, t1 = lane/4, t2 = warp),
// value (v0 = i%2, v1 = (i/2)%2, v2 = i/4): row = t1 + 16 t2 + 8 v1, col = 2 t0 + v0 + 8 v2.
__host__ __device__ constexpr int wgmma_acc_row(int warp, int lane, int i) {
  return (lane >> 2) + 16 * warp + 8 * ((i >> 1) & 1);
}
__host__ __device__ constexpr int wgmma_acc_col(int lane, int i) {
  return 2 * (lane & 3) + (i & 1) + 8 * (i >> 2);
}

inline void wgmma_fence() { emu::wgmma_fence(); }
inline void wgmma_commit_group() { emu::wgmma_commit(); }
template <int kPending>
inline void wgmma_wait_group() { emu::wgmma_wait(kPending); }
inline void wgmma_fence_operand(float& r) { asm volatile("" : "+m"(r)::"memory"); }
inline void wgmma_fence_operand(uint32_t& r) { asm volatile("" : "+m"(r)::"memory"); }

// setmaxnreg: the warpgroup's register count moves to kRegs through the block's pool (emu::setmaxnreg).
template <int kRegs>
inline void setmaxnreg_dec() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
  emu::setmaxnreg(kRegs, false);
}
template <int kRegs>
inline void setmaxnreg_inc() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
  emu::setmaxnreg(kRegs, true);
}

template <int kTransA, int kTransB>
inline void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  emu::wgmma_ss(128, d, desc_a, desc_b, kTransA, kTransB, scale_d);
}
template <int kTransA, int kTransB>
inline void wgmma_m64n256k16_bf16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  emu::wgmma_ss(256, d, desc_a, desc_b, kTransA, kTransB, scale_d);
}
template <int kTransB>
inline void wgmma_m64n64k16_bf16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  emu::wgmma_rs(64, d, a, desc_b, kTransB, scale_d);
}

}  // namespace gpt2::cuda
