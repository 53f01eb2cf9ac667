// The hand GEMM on Hopper's own path (bf16, compute capability 9.0, sm_90a code):
//
//   TMA (cp.async.bulk.tensor, 128-byte swizzle) --full[s]--> 2 consumer warpgroups: wgmma m64nNk16
//        ^                                                          |            (N = 128 or 256)
//        +--------------------------- empty[s] ---------------------+
//
//  * One block per SM (persistent): work units are (split, output tile) pairs, taken in the tile order of
//    the mma.sync kernel (gemm_common.cuh), blockIdx.x, blockIdx.x + gridDim.x, ... A launch takes every
//    tile or a range of them: a split tail (gemm.cu gemm_hand) runs the whole waves' tiles unsplit in one
//    launch and splits only the rest in a second.
//  * Three configurations (WgmmaTile, gemm_cuda.hpp GemmWgmmaKernel): 128x128 tiles (4 stages), 128x256
//    (3 stages; CUTLASS's fastest Hopper bf16 shape: wgmma m64n256 reads fewer shared-memory bytes per
//    flop than m64n128), and 128x128 on a ping-pong schedule. The context picks one (GPT2_GEMM_SM90);
//    128x256, the fastest 124M step on the H100 and the H200, is the default.
//  * Warpgroup 0 is the producer: one thread waits for an empty stage, announces its bytes on the
//    stage's full barrier and issues the TMA copies. Warpgroups 1 and 2 are consumers. Cooperative: each
//    owns 64 rows of every tile. Ping-pong: each takes every other tile of the block whole, so one's
//    epilogue overlaps the other's products. A consumer waits for a full stage, runs the stage's wgmma
//    (k16 each) from shared memory, and frees the stage once those have completed (one group kept in
//    flight).
//  * The epilogue stages each consumer's fp32 accumulators through its own shared-memory tile, 64 x 128
//    at a time, and finishes them with the hand backend's apply_epilogue4 (bias, bias+GELU, GELU
//    gradient, C +=), or writes split-K partials: the same arithmetic and rounding as the mma.sync
//    kernel's epilogue.
//  * The GELU gradient's pre-activations (128x128 kernels): each consumer's thread 0 loads its rows of the
//    unit with TMA when the consumer starts it, on the consumer's aux_full barrier, so the load runs under
//    the products and the epilogue reads shared memory (WgmmaTile::kAuxFits says where they fit; read
//    from global memory in the epilogue they cost the H100's mlp_down input gradient 44% of cuBLASLt).
//    Where they do not fit (128x256), the same thread prefetches its rows into L2 instead (TMA's L2
//    prefetch: no shared memory, nothing to wait for), so the epilogue's loads find them there rather than
//    in DRAM: its 2 vectors in flight a thread could not cover DRAM's latency (H200: 2.61x the product
//    without the epilogue, against 1.63x for the 128x128 kernel's TMA tiles).
//  * The bias gradient fused into a weight gradient (A transposed, B not, no epilogue: dW += inp^T dout
//    with dbias += dout's column sums): on the units of row tile 0, every consumer thread of the unit sums
//    a pair of columns over a slice of the K rows of each B stage (WgmmaTile::kBiasGroups slices), after
//    the stage's wgmma are issued and before it is released, one fp32 sum per k-step added with Kahan's
//    compensation; at the unit's end the slices' sums are added in slice order through shared memory.
//    16-32 bf16x2 shared loads per thread and stage, in 4 chains, against ~700 cycles of tensor work per
//    128 x 128 x 64 stage: hidden behind the products in flight. (The first version, consumer 0 alone
//    summing one column per thread over all 64 rows, 64 dependent loads a stage, ran the fused weight and
//    bias gradient at 0.71-0.92x of the GEMM plus the separate bias kernel on the H100, 2026-11-27.)
//
// Verified on an H100 and an H200 (2026-11-27: its GPU suite and synccheck; docs/performance.md); the hand
// backend's bf16 kernel on compute capability 9.0 since 2026-12-02 (GPT2_GEMM_SM90=0: mma.sync; the test hooks:
// gemm_cuda.hpp GemmHandPath, GemmWgmmaKernel). Changes since are checked on the emulator (tests/emu) until a
// GPU runs them.
//
// Layout facts, and where they come from (see kernels/common/ptx.cuh for the wrappers' own sources):
//  * TMA box: 64 x 64 bf16 with CU_TENSOR_MAP_SWIZZLE_128B: the inner extent is 128 bytes, the most that
//    128-byte swizzle allows (cuda.h, cuTensorMapEncodeTiled), and each box is 8 rows x 128 bytes x 8 =
//    8 KB, eight 1024-byte swizzle atoms. Each operand tile of a stage is such boxes 8 KB apart: two for
//    A (128 rows), two or four for B (128 or 256 columns).
//  * The same 128-byte swizzle (16-byte chunk index XOR row % 8 within a 1024-byte atom, CUTLASS
//    Swizzle<3,4,3>) is what wgmma's layout type 1 expects, so the descriptors point at the TMA output
//    directly. Stage buffers are 1024-byte aligned (descriptor base offset 0).
//  * Descriptors (make_gmma_desc in CUTLASS cute/atom/mma_traits_sm90_gmma.hpp):
//      K-major operand (A not transposed, B transposed): rows = M or N, 128 bytes of K each; SBO = 1024
//        (8 rows), LBO unused; the k16 step kk moves the start address by 32*kk bytes.
//      MN-major operand (A transposed, B not transposed): rows = K, 128 bytes = 64 of M or N each;
//        SBO = 1024 (8 K-rows), LBO = 8192 (the next box: the next 64 of M or N, as far as N = 256); the k16 step kk moves
//        the start by 16 rows = 2048*kk bytes; the wgmma transpose immediate is 1 (16-bit types only).
//  * Accumulators: wgmma_acc_row/col in ptx.cuh (PTX ISA wgmma D fragment; CUTLASS CLayout_64xN).
//  * Barrier phases: a k-step counter `it` runs over every unit of the block, identically in the
//    producer and the consumers; stage = it % kStages, and the use count it / kStages gives the parity.
//    Consumers wait full[stage] for parity (it/kStages)&1; the producer waits empty[stage] for the
//    opposite parity, which a fresh barrier passes at once (CUTLASS make_producer_start_state).
//    full: 1 arrival (the producer's arrive.expect_tx) + the stage's bytes. empty: one arrival from lane
//    0 of each consumer warp after that warp's wgmma.wait_group (8), so no warp can still be reading.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90a_host.cuh"
#include "kernels/gemm/gemm_sm90.cuh"

namespace gpt2::kernels::gemm_detail {

namespace {

using cuda::ceil_div;

// TMA box: 64 x 64 bf16; 64 * 2 bytes = 128, the inner extent of the 128-byte swizzle.
constexpr int kBox = 64;

// Launch configuration of one tile width and schedule (named data; the reasons in the comments).
//   cooperative (kPingPongSchedule false): both consumer warpgroups work on every unit, 64 rows each;
//   ping-pong: each consumer warpgroup takes every other unit of the block whole (two m64 row blocks),
//     so that one's epilogue runs while the other's products do (CUTLASS KernelTmaWarpSpecializedPingpong).
template <int kTileN, bool kPingPongSchedule = false>
struct WgmmaTile {
  // 128 x kTileN per unit, K in steps of 64: two consumer warpgroups of m64n<kTileN>, kTileN / 2 fp32
  // accumulators per thread (64 or 128), within the 168 registers that 384 threads at one block per SM
  // allow (ptxas -v: no spills). The 128x256 tile uses 166-168 of them: no headroom. If a change makes it
  // spill, give the consumers more with setmaxnreg (CUTLASS: producer 40, consumers 232), which needs
  // their barrier waits untimed and a watchdog, as attention_bwd_sm90.cu does (ptx.cuh says why).
  static constexpr int kBM = 128, kBN = kTileN, kBK = kWgmmaBK;
  static constexpr int kConsumers = 2;
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static constexpr bool kPingPong = kPingPongSchedule;
  static constexpr int kWgRows = 64;                         // one wgmma M: a row block
  static constexpr int kRowBlocks = kPingPong ? 2 : 1;       // row blocks per consumer and unit
  static constexpr int kUnitConsumers = kPingPong ? 1 : kConsumers;  // warpgroups that read a unit's stages
  static constexpr int kAcc = kBN / 2;  // accumulators per thread and row block (PTX: m64nN has N/2 per thread)
  static constexpr int kWgmmaK = 16;
  static constexpr int kBoxBytes = kBox * kBox * 2;
  static constexpr int kABoxes = kBM / kBox, kBBoxes = kBN / kBox;
  static constexpr int kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;  // 32 or 48 KB, the full barrier's transaction count
  // 128x128: 4 stages x 32 KB, three in flight while one is consumed. 128x256: 3 x 48 KB, what fits
  // beside the epilogue staging (one stage of wgmma, 4 x m64n256k16, is ~0.5 us at H100 peak, so two in
  // flight cover a TMA latency of about 1 us).
  static constexpr int kStages = kBN == 128 ? 4 : 3;
  // Epilogue staging per consumer: 64 rows x 128 fp32 (a 256-wide tile goes through it in two column
  // halves), rows padded by 8 floats so the fragment stores (float2 per lane, 8 rows x 4 lanes per warp)
  // do not conflict. The kernels that also hold the aux tiles (below) need those 4 KB: theirs is
  // unpadded and swizzled instead (gemm_common.cuh SwizzledStaging128; its XOR addressing costs the
  // 168-register kernels a spill, so only they use it).
  static constexpr int kStageCols = 128;
  // The epilogue's vectors in flight a thread (finish_staged_tile): ping-pong keeps the other row block's
  // 64 accumulators live through it, and a 256-wide tile the second pass's 64; with 4 the bias+GELU
  // epilogue (ping-pong) and the fused bias gradient's 256-wide kernel spilled (ptxas, 168 registers).
  static constexpr int kEpilogueUnroll = kPingPong || kBN == 256 ? 2 : 4;
  static constexpr int kCStride = kStageCols + 8;
  static constexpr int kStagingBytesFor(bool aux) { return kWgRows * (aux ? kStageCols : kCStride) * 4; }
  // The bulk-store epilogue's staging (WgmmaParams::bulk_store), in the same room: 64 rows of kBN bf16 and 16
  // bytes more, so that each row starts 16-byte aligned (cp.async.bulk's rule) and the fragment stores, 8 rows
  // x 4 lanes of 4 bytes a warp, fall on 32 banks (a row starts 4 banks past the one before it).
  static constexpr int kBulkRowElems = kBN + 8;
  static_assert(kWgRows * kBulkRowElems * 2 <= kStagingBytesFor(false) && kBulkRowElems * 2 % 16 == 0,
                "bulk-store rows fit the staging and start 16-byte aligned");
  // The GELU gradient's pre-activations (kDGelu), read by TMA while the products run: each consumer loads
  // its own rows of the unit (64 x 128 cooperative, 128 x 128 ping-pong) as kAuxRowBlocks x 2 boxes of
  // 64 x 64. The 128x128 kernels have the room: cooperative 225 of 227 KiB with its 4 stages, ping-pong
  // 225 KiB with 3 (kStagesFor). 128x256 would need 64 KB beside its 3 stages of 48: it reads them from
  // global memory in the epilogue.
  static constexpr bool kAuxFits = kBN == 128;
  static constexpr int kAuxRowBlocks = kRowBlocks;
  static constexpr int kAuxBoxes = kAuxRowBlocks * (kBN / kBox);
  static constexpr int kAuxBytes = kAuxBoxes * kBox * kBox * 2;  // per consumer
  // Stages with the aux tiles: ping-pong gives one up for them (two in flight while one is consumed, as
  // the 128x256 kernel has).
  static constexpr int kStagesFor(bool aux) { return aux && kPingPong ? 3 : kStages; }
  static constexpr int kBarrierBytes = (2 * kStages + 2 * kConsumers) * 8;  // full, empty, mainloop_done, aux_full
  static constexpr int kAlign = 1024;  // swizzle atoms must start 1024-aligned (descriptor base offset 0)
  static constexpr size_t kSmemBytesFor(bool aux) {
    return kAlign + kStagesFor(aux) * kStageBytes + kConsumers * kStagingBytesFor(aux) + kExtraBytes(aux) +
           kBarrierBytes;
  }
  // After the staging: the aux tiles (kDGelu) or the bias slices' sums (the bias-gradient kernels), never
  // both (the bias gradient rides only on kernels without an epilogue).
  static constexpr int kExtraBytes(bool aux) {
    return aux ? kConsumers * kAuxBytes : (kPingPong ? kConsumers : 1) * kBiasBytes;
  }
  static constexpr size_t kSmemBytes = kSmemBytesFor(kAuxFits);
  static_assert(kBN == 128 || kBN == 256, "wgmma tiles are 128x128 or 128x256");
  static_assert(kBM == kWgRows * kRowBlocks * kUnitConsumers, "the consumers' row blocks cover the tile");
  static_assert(!kPingPong || kBN == 128, "ping-pong: 2 x 64 accumulators per thread is what fits in 168 registers");
  static_assert(kBM == kABoxes * kBox && kBN == kBBoxes * kBox && kBK == kBox, "whole boxes per operand tile");
  static_assert(kBN % kStageCols == 0, "whole staging passes");
  static_assert(kABytes % kAlign == 0 && kBBytes % kAlign == 0 && kBoxBytes % kAlign == 0, "1024-aligned boxes");
  static_assert(kStageCols == 128, "SwizzledStaging128");
  // The fused bias gradient (file comment): the unit's consumer threads, one column pair and one slice of
  // kBiasRows K rows each; their per-slice sums meet in kBiasBytes of shared memory per consumer that
  // takes a unit whole (ping-pong) or for the block (cooperative), on named barrier 3 (cooperative: both
  // consumers) or the consumer's own 1 + c.
  static constexpr int kBiasThreads = kUnitConsumers * kWarpgroupThreads;
  static constexpr int kBiasPairs = kBN / 2;
  static constexpr int kBiasGroups = kBiasThreads / kBiasPairs;
  static constexpr int kBiasRows = kBK / kBiasGroups;
  static constexpr int kBiasBytes = kBiasGroups * kBN * 4;
  static_assert(kBiasThreads % kBiasPairs == 0 && kBK % kBiasGroups == 0 && kBiasRows % 8 == 0,
                "whole slices of whole swizzle atoms (8 rows)");
  static_assert(kSmemBytes <= 227 * 1024 && kSmemBytesFor(false) <= 227 * 1024,
                "fits the sm_90 shared-memory limit per block");
};

// Shared memory of one kernel: the aux tiles only where the epilogue reads them (kDGelu) and they fit.
template <class Cfg, GemmEpilogue kEp>
constexpr bool kStagesAux = Cfg::kAuxFits && kEp == GemmEpilogue::kDGelu;
template <class Cfg, GemmEpilogue kEp>
constexpr size_t kSmemBytesOf = Cfg::kSmemBytesFor(kStagesAux<Cfg, kEp>);

struct WgmmaParams {
  int M, N, K;
  int k_per_split;  // a multiple of kBK
  int splits;
  // The output tiles of this launch: tile0 .. tile0 + tiles - 1 in tile_coords order (gemm_common.cuh).
  // All of them, or one part of a split tail (gemm_cuda.hpp GemmSplitPlan; gemm.cu gemm_hand).
  int tile0, tiles;
  float* partial;  // [splits][M][N] fp32 when splitting (only this launch's tiles written); nullptr otherwise
  EpilogueParams<bf16> ep;
  // The fused bias gradient (kernels with A transposed, B not and no epilogue; both nullptr otherwise):
  // dbias += column sums of B without split-K, dbias_partial [splits][N] with it (gemm_common.cuh
  // store_bias_grad).
  bf16* dbias;
  float* dbias_partial;
  // kDGelu without split-K, where the kernel has the room (kStagesAux): the consumers load their tiles
  // of ep.aux with TMA (tmap_aux) while their products run. False where TMA cannot describe ep.aux.
  bool aux_by_tma;
  // kDGelu without split-K and without aux_by_tma: the consumers prefetch their tiles of ep.aux into L2
  // (tmap_aux) as they start a unit, for the epilogue's loads.
  bool aux_prefetch;
  // The epilogue's bulk stores (wgmma_bulk_store_takes): each consumer finishes its 64 x kBN tile in
  // registers, stages it as bf16 rows and copies each row out with one cp.async.bulk, which drains while
  // the next unit's products run; otherwise its threads store 4-column vectors from the fp32 staging.
  bool bulk_store;
};

// Where the bulk-store epilogue applies: whole 16-byte rows of C (and of the pre-activations) from any
// column tile (N a multiple of 8, 16-byte aligned bases), no split-K partials, no C += (it would read C
// first) and not the GELU gradient (its pre-activations are read per element: the staged path).
bool wgmma_bulk_store_takes(const EpilogueParams<bf16>& ep, GemmEpilogue epilogue, const float* partial) {
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const bool kind = epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kBiasGelu ||
                    (epilogue == GemmEpilogue::kNone && !ep.accumulate);
  return kind && partial == nullptr && ep.vec4 && ep.N % 8 == 0 && aligned16(ep.c) &&
         (epilogue != GemmEpilogue::kBiasGelu || aligned16(ep.aux));
}

// A consumer's 64 x kBN tile of pre-activations as TMA leaves it: 64 x 64 boxes 8 KB apart, each row 128
// bytes whose 16-byte chunks are swizzled with the row (the same 128-byte swizzle as the operands).
struct AuxTileSmem {
  const unsigned char* tile;  // nullptr: read them from global memory
  __device__ __forceinline__ bool staged() const { return tile != nullptr; }
  __device__ __forceinline__ void load4(int r, int c, float x[4]) const {
    const unsigned char* box = tile + (c / kBox) * (kBox * kBox * 2);
    const int chunk = (c % kBox) / 8, byte = (c % 8) * 2;  // c % 4 == 0: 4 values in one chunk
    gemm_detail::load4(reinterpret_cast<const bf16*>(box + r * 128 + ((chunk ^ (r % 8)) * 16) + byte), x);
  }
};

// Unit -> output tile origin and K range (identical in producer and consumers).
struct Unit {
  int m0, n0, k_begin, k_tiles, split;
};
template <class Cfg>
__device__ __forceinline__ Unit decode_unit(const WgmmaParams& p, int unit, int tiles_m, int tiles_n) {
  Unit u;
  u.split = unit / p.tiles;
  int tile_m, tile_n;
  tile_coords(p.tile0 + unit % p.tiles, tiles_m, tiles_n, tile_m, tile_n);
  u.m0 = tile_m * Cfg::kBM;
  u.n0 = tile_n * Cfg::kBN;
  u.k_begin = u.split * p.k_per_split;
  const int k_end = min(p.K, u.k_begin + p.k_per_split);
  u.k_tiles = static_cast<int>(ceil_div(k_end - u.k_begin, Cfg::kBK));
  return u;
}

// Columns 2 pair and 2 pair + 1 of a stage's MN-major B tile (kTransB false) summed over its K rows
// [slice * kBiasRows, (slice + 1) * kBiasRows), in K order: box n / 64 holds 64 columns, each K row 128
// bytes of it whose 16-byte chunks are swizzled with the row (the TMA 128-byte swizzle: chunk XOR row % 8,
// boxes 1024-aligned, as the file comment says). A warp's 32 pairs are one 128-byte row: one wavefront per
// load. Even and odd rows in two chains per column: four independent chains of adds.
template <class Cfg>
__device__ __forceinline__ float2 b_pair_sum(const unsigned char* b_tile, int pair, int slice) {
  const int n = 2 * pair;
  const unsigned char* rows = b_tile + (n / kBox) * Cfg::kBoxBytes + slice * Cfg::kBiasRows * 128;
  const int chunk = (n % kBox) / 8, byte = (n % 8) * 2;
  float2 t[2] = {make_float2(0.0f, 0.0f), make_float2(0.0f, 0.0f)};
#pragma unroll
  for (int r = 0; r < Cfg::kBiasRows; ++r) {  // slices start on a swizzle atom: the row's swizzle is r % 8
    const float2 v =
        __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(rows + r * 128 + ((chunk ^ (r % 8)) * 16) + byte));
    t[r % 2].x += v.x;
    t[r % 2].y += v.y;
  }
  return make_float2(t[0].x + t[1].x, t[0].y + t[1].y);
}

template <class Cfg, bool kTransA, bool kTransB, GemmEpilogue kEp>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_bf16_wgmma_tma_persistent(const __grid_constant__ CUtensorMap tmap_a,
                                   const __grid_constant__ CUtensorMap tmap_b,
                                   const __grid_constant__ CUtensorMap tmap_aux, const WgmmaParams p) {
  cuda::griddep_launch_dependents_then_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((Cfg::kAlign - (cuda::smem_u32(smem_raw) % Cfg::kAlign)) % Cfg::kAlign);
  auto stage_a = [&](int s) { return smem + s * Cfg::kStageBytes; };
  auto stage_b = [&](int s) { return smem + s * Cfg::kStageBytes + Cfg::kABytes; };
  constexpr bool kAux = kStagesAux<Cfg, kEp>;
  // The bulk-store epilogue (WgmmaParams::bulk_store) is compiled where it may run: ping-pong already runs one
  // consumer's epilogue under the other's products, and with it its bias+GELU kernel spilled 24 bytes (ptxas,
  // 168 registers).
  constexpr bool kBulkable = kEp != GemmEpilogue::kDGelu && !Cfg::kPingPong;
  constexpr int kStages = Cfg::kStagesFor(kAux);
  float* staging = reinterpret_cast<float*>(smem + kStages * Cfg::kStageBytes);
  constexpr int kStagingBytes = Cfg::kStagingBytesFor(kAux);
  unsigned char* aux_tiles = smem + kStages * Cfg::kStageBytes + Cfg::kConsumers * kStagingBytes;
  float* bias_slices = reinterpret_cast<float*>(aux_tiles);  // the same room: the kernels without kAux
  uint64_t* full = reinterpret_cast<uint64_t*>(aux_tiles + Cfg::kExtraBytes(kAux));
  uint64_t* empty = full + kStages;
  // Ping-pong: mainloop_done[c] completes a phase when consumer c's warps have passed every full wait of
  // one of its units (4 arrivals, lane 0 of each warp).
  uint64_t* mainloop_done = empty + kStages;
  // aux_full[c]: consumer c's aux tile has landed (1 arrival, its thread 0's expect_tx, + the bytes).
  uint64_t* aux_full = mainloop_done + Cfg::kConsumers;

  const int wg = threadIdx.x / Cfg::kWarpgroupThreads;
  const int tid_wg = threadIdx.x % Cfg::kWarpgroupThreads;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      cuda::mbarrier_init(&full[s], 1);
      cuda::mbarrier_init(&empty[s], Cfg::kUnitConsumers * Cfg::kWarpgroupThreads / 32);
    }
    if (Cfg::kPingPong)
      for (int c = 0; c < Cfg::kConsumers; ++c) cuda::mbarrier_init(&mainloop_done[c], Cfg::kWarpgroupThreads / 32);
    if (kAux)
      for (int c = 0; c < Cfg::kConsumers; ++c) cuda::mbarrier_init(&aux_full[c], 1);
    cuda::fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on the roles run independently

  const int tiles_m = static_cast<int>(ceil_div(p.M, Cfg::kBM));
  const int tiles_n = static_cast<int>(ceil_div(p.N, Cfg::kBN));
  const int units = p.tiles * p.splits;

  if (wg == 0) {
    // ---- producer: one thread issues every copy ----
    if (tid_wg != 0) return;
    cuda::tma_prefetch_descriptor(&tmap_a);
    cuda::tma_prefetch_descriptor(&tmap_b);
    uint32_t it = 0;
    for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
      const Unit u = decode_unit<Cfg>(p, unit, tiles_m, tiles_n);
      for (int kt = 0; kt < u.k_tiles; ++kt, ++it) {
        const int s = static_cast<int>(it % kStages);
        cuda::mbarrier_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        cuda::mbarrier_arrive_expect_tx(&full[s], Cfg::kStageBytes);
        const int k0 = u.k_begin + kt * Cfg::kBK;
        // Coordinates are {inner, outer}: K-major operands have K inner, MN-major ones M or N.
#pragma unroll
        for (int j = 0; j < Cfg::kABoxes; ++j) {
          if constexpr (!kTransA)
            cuda::tma_load_2d(stage_a(s) + j * Cfg::kBoxBytes, &tmap_a, &full[s], k0, u.m0 + j * kBox);
          else
            cuda::tma_load_2d(stage_a(s) + j * Cfg::kBoxBytes, &tmap_a, &full[s], u.m0 + j * kBox, k0);
        }
#pragma unroll
        for (int j = 0; j < Cfg::kBBoxes; ++j) {
          if constexpr (kTransB)
            cuda::tma_load_2d(stage_b(s) + j * Cfg::kBoxBytes, &tmap_b, &full[s], k0, u.n0 + j * kBox);
          else
            cuda::tma_load_2d(stage_b(s) + j * Cfg::kBoxBytes, &tmap_b, &full[s], u.n0 + j * kBox, k0);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  // 0 or 1. Cooperative: rows [64c, 64c+64) of every unit. Ping-pong: the block's units c, c+2, ... whole.
  const int c = wg - 1;
  const int warp = tid_wg / 32, lane = tid_wg % 32;
  float* stg = staging + c * (kStagingBytes / 4);
  using Staging = std::conditional_t<kAux, SwizzledStaging128, PaddedStaging>;
  const Staging layout = [] {
    if constexpr (kAux) return SwizzledStaging128{};
    else return PaddedStaging{Cfg::kCStride};
  }();
  // This consumer's pre-activation tile (kAux and p.aux_by_tma; split-K defers the epilogue, so never then).
  const bool aux_by_tma = kAux && p.aux_by_tma && p.partial == nullptr;
  // Row block rb of it: kBN / 64 boxes.
  auto aux_tile_rows = [&](int rb) { return aux_tiles + c * Cfg::kAuxBytes + rb * (Cfg::kBN / kBox) * Cfg::kBoxBytes; };
  const bool aux_prefetch = kEp == GemmEpilogue::kDGelu && p.aux_prefetch && !aux_by_tma && p.partial == nullptr;
  if ((aux_by_tma || aux_prefetch) && tid_wg == 0) cuda::tma_prefetch_descriptor(&tmap_aux);
  // Descriptor pieces that do not depend on the stage (ptx.cuh wgmma_desc; facts in the file comment).
  constexpr uint32_t kSbo = 1024;
  constexpr uint32_t kLboA = kTransA ? Cfg::kBoxBytes : 16;  // K-major: unused (encodes as 1)
  constexpr uint32_t kLboB = kTransB ? 16 : Cfg::kBoxBytes;
  constexpr uint32_t kKStepA = kTransA ? Cfg::kWgmmaK * 128 : Cfg::kWgmmaK * 2;  // bytes per k16
  constexpr uint32_t kKStepB = kTransB ? Cfg::kWgmmaK * 2 : Cfg::kWgmmaK * 128;
  // Row block rb of this warpgroup is the tile's row block rb0 + rb: 64 rows of A, the next 64 rows of a
  // K-major tile (64 x 128 bytes) or the next box of an MN-major one, 8 KB in either case.
  const int rb0 = Cfg::kPingPong ? 0 : c;
  // The fused bias gradient (WgmmaParams::dbias): this thread sums column pair bias_pair of the unit's B
  // stages over K slice bias_slice.
  constexpr bool kCanBiasGrad = kTransA && !kTransB && kEp == GemmEpilogue::kNone;
  const int bias_thread = (Cfg::kPingPong ? 0 : c) * Cfg::kWarpgroupThreads + tid_wg;
  const int bias_pair = bias_thread % Cfg::kBiasPairs, bias_slice = bias_thread / Cfg::kBiasPairs;
  const bool bias_grad_wanted = kCanBiasGrad && (p.dbias != nullptr || p.dbias_partial != nullptr);
  float* my_bias_slices = bias_slices + (Cfg::kPingPong ? c * (Cfg::kBiasBytes / 4) : 0);
  const int bias_barrier = Cfg::kPingPong ? 1 + c : 3;

  float acc[Cfg::kRowBlocks][Cfg::kAcc];
#pragma unroll
  for (int rb = 0; rb < Cfg::kRowBlocks; ++rb)
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) acc[rb][i] = 0.0f;  // never read (scale-d 0 on a unit's first k16), but defined
  uint32_t it = 0;
  int nth = 0;  // this block's units, counted
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x, ++nth) {
    const Unit u = decode_unit<Cfg>(p, unit, tiles_m, tiles_n);
    if (Cfg::kPingPong) {
      if (nth % Cfg::kConsumers != c) {  // the other warpgroup's unit: its stages pass by
        it += static_cast<uint32_t>(u.k_tiles);
        continue;
      }
      // Wait until the other warpgroup has passed the full waits of the unit before this one (its
      // (nth-1)/2-th). Without it this warpgroup, having skipped that unit's stage uses, could wait for
      // use u + 2 of a stage while use u completes, and a parity wait cannot tell the two apart: it
      // would read the other unit's tiles (CUTLASS orders its ping-pong mainloops for this reason too).
      if (nth > 0) cuda::mbarrier_wait(&mainloop_done[1 - c], ((nth - 1) / Cfg::kConsumers) & 1);
    }
    // The unit's pre-activations, loaded while its products run. The tile is free again once every thread
    // of this warpgroup is past the previous unit's epilogue: each orders its reads of it before the
    // copy (generic then async proxy) and the barrier gathers them.
    // own: this warpgroup's units so far (ping-pong: every other unit of the block).
    const int own = Cfg::kPingPong ? nth / Cfg::kConsumers : nth;
    if (aux_by_tma) {
      if (own > 0) {
        cuda::fence_proxy_async_shared();
        cuda::named_barrier_sync(1 + c, Cfg::kWarpgroupThreads);
      }
      if (tid_wg == 0) {
        cuda::mbarrier_arrive_expect_tx(&aux_full[c], Cfg::kAuxBytes);
#pragma unroll
        for (int rb = 0; rb < Cfg::kAuxRowBlocks; ++rb)
#pragma unroll
          for (int j = 0; j < Cfg::kBN / kBox; ++j)
            cuda::tma_load_2d(aux_tile_rows(rb) + j * Cfg::kBoxBytes, &tmap_aux, &aux_full[c], u.n0 + j * kBox,
                              u.m0 + (rb0 + rb) * Cfg::kWgRows);
      }
      __syncwarp();  // warp 0 whole again before the wgmma (.aligned) that follow
    }
    if constexpr (kEp == GemmEpilogue::kDGelu) {
      // The epilogue reads the unit's pre-activations from global memory: into L2 with them now, under the
      // products. Boxes wholly past C's tails hold nothing to fetch.
      if (aux_prefetch && tid_wg == 0) {
#pragma unroll
        for (int rb = 0; rb < Cfg::kRowBlocks; ++rb) {
          const int row = u.m0 + (rb0 + rb) * Cfg::kWgRows;
#pragma unroll
          for (int j = 0; j < Cfg::kBN / kBox; ++j)
            if (row < p.M && u.n0 + j * kBox < p.N) cuda::tma_prefetch_l2_2d(&tmap_aux, u.n0 + j * kBox, row);
        }
      }
      __syncwarp();
    }
    const bool bias_grad = bias_grad_wanted && u.m0 == 0;  // the same for all of the unit's threads
    float2 bias_sum = make_float2(0.0f, 0.0f), bias_c = make_float2(0.0f, 0.0f);
    for (int kt = 0; kt < u.k_tiles; ++kt, ++it) {
      const int s = static_cast<int>(it % kStages);
      cuda::mbarrier_wait(&full[s], (it / kStages) & 1);
      const uint32_t a_base = cuda::smem_u32(stage_a(s)) + static_cast<uint32_t>(rb0 * Cfg::kBoxBytes);
      const uint32_t b_base = cuda::smem_u32(stage_b(s));
      cuda::wgmma_fence();  // the accumulators were last touched by ordinary instructions (the epilogue)
#pragma unroll
      for (int rb = 0; rb < Cfg::kRowBlocks; ++rb)
#pragma unroll
        for (int i = 0; i < Cfg::kAcc; ++i) cuda::wgmma_fence_operand(acc[rb][i]);
#pragma unroll
      for (int kk = 0; kk < Cfg::kBK / Cfg::kWgmmaK; ++kk) {
        const uint64_t db = cuda::wgmma_desc(b_base + kk * kKStepB, kLboB, kSbo, cuda::WgmmaSwizzle::k128B);
        // The immediates say "MN-major": A is when transposed (stored K x M), B when NOT transposed (a
        // row-major K x N has N contiguous). wgmma's default is K-major for both.
        const int scale_d = (kt > 0 || kk > 0) ? 1 : 0;
#pragma unroll
        for (int rb = 0; rb < Cfg::kRowBlocks; ++rb) {
          const uint64_t da = cuda::wgmma_desc(a_base + rb * Cfg::kBoxBytes + kk * kKStepA, kLboA, kSbo,
                                               cuda::WgmmaSwizzle::k128B);
          if constexpr (Cfg::kBN == 128)
            cuda::wgmma_m64n128k16_bf16<kTransA ? 1 : 0, kTransB ? 0 : 1>(acc[rb], da, db, scale_d);
          else
            cuda::wgmma_m64n256k16_bf16<kTransA ? 1 : 0, kTransB ? 0 : 1>(acc[rb], da, db, scale_d);
        }
      }
      cuda::wgmma_commit_group();
#pragma unroll
      for (int rb = 0; rb < Cfg::kRowBlocks; ++rb)
#pragma unroll
        for (int i = 0; i < Cfg::kAcc; ++i) cuda::wgmma_fence_operand(acc[rb][i]);
      // While the products run: this stage's column sums (the stage is released one k-step later).
      if constexpr (kCanBiasGrad) {
        if (bias_grad) {
          const float2 part = b_pair_sum<Cfg>(stage_b(s), bias_pair, bias_slice);
          kahan_add(bias_sum.x, bias_c.x, part.x);
          kahan_add(bias_sum.y, bias_c.y, part.y);
        }
      }
      // The previous k-step's group is complete: its stage can be refilled. (The column sums read it
      // with every lane: __syncwarp orders their loads before lane 0's release.)
      cuda::wgmma_wait_group<1>();
      if constexpr (kCanBiasGrad) {
        if (bias_grad) {  // this warp's reads of the stage, before TMA may refill it (as for the aux tile)
          cuda::fence_proxy_async_shared();
          __syncwarp();
        }
      }
      if (kt > 0 && lane == 0) cuda::mbarrier_arrive(&empty[(it - 1) % kStages]);
    }
    if (Cfg::kPingPong && lane == 0) cuda::mbarrier_arrive(&mainloop_done[c]);  // the other may start its unit
    cuda::wgmma_wait_group<0>();
#pragma unroll
    for (int rb = 0; rb < Cfg::kRowBlocks; ++rb)
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; ++i) cuda::wgmma_fence_operand(acc[rb][i]);
    if constexpr (kCanBiasGrad) {
      if (bias_grad) {
        cuda::fence_proxy_async_shared();
        __syncwarp();
      }
    }
    if (lane == 0) cuda::mbarrier_arrive(&empty[(it - 1) % kStages]);
    // The slices' sums, added in slice order by the threads of slice 0. The second barrier keeps the room
    // until they have read it (the next unit of row tile 0 writes it again).
    if constexpr (kCanBiasGrad) {
      if (bias_grad) {
        *reinterpret_cast<float2*>(my_bias_slices + bias_slice * Cfg::kBN + 2 * bias_pair) = bias_sum;
        cuda::named_barrier_sync(bias_barrier, Cfg::kBiasThreads);
        if (bias_slice == 0) {
          float2 total = make_float2(0.0f, 0.0f);
#pragma unroll
          for (int g = 0; g < Cfg::kBiasGroups; ++g) {
            const float2 v = *reinterpret_cast<const float2*>(my_bias_slices + g * Cfg::kBN + 2 * bias_pair);
            total.x += v.x;
            total.y += v.y;
          }
          store_bias_grad(p.dbias, p.dbias_partial, p.N, u.split, u.n0 + 2 * bias_pair, total.x);
          store_bias_grad(p.dbias, p.dbias_partial, p.N, u.split, u.n0 + 2 * bias_pair + 1, total.y);
        }
        cuda::named_barrier_sync(bias_barrier, Cfg::kBiasThreads);
      }
    }

    // Epilogue with bulk stores (p.bulk_store; cooperative kernels, never the GELU gradient's): the bias, GELU
    // and rounding in
    // registers, element by element as finish4 does them (the same bits), the bf16 results into the staging rows,
    // then thread r of the first two warps copies row r out with one cp.async.bulk and goes on. The
    // copies drain while the next unit's products run; the staging is written again only once each copier
    // has seen its copy read (wait_group.read) and the barrier has said so to the others. With the
    // pre-activations (kBiasGelu) the rows go out twice: those first, then C.
    if constexpr (kBulkable) {
      if (p.bulk_store) {
        bf16* rows = reinterpret_cast<bf16*>(stg);
        constexpr int kRow = Cfg::kBulkRowElems;
        constexpr int kOutputs = kEp == GemmEpilogue::kBiasGelu ? 2 : 1;
        const bool copier = tid_wg < Cfg::kWgRows;
        const uint32_t row_bytes = static_cast<uint32_t>(min(Cfg::kBN, p.N - u.n0)) * 2;  // N % 8 == 0
#pragma unroll
        for (int rb = 0; rb < Cfg::kRowBlocks; ++rb) {
#pragma unroll
          for (int o = 0; o < kOutputs; ++o) {
            if (copier) cuda::bulk_wait_group_read<0>();
            cuda::named_barrier_sync(1 + c, Cfg::kWarpgroupThreads);  // the rows' last copies have read them
#pragma unroll
            for (int i = 0; i < Cfg::kAcc; i += 4) {
              const int r = cuda::wgmma_acc_row(warp, lane, i), col = cuda::wgmma_acc_col(lane, i);
              float2 lo = make_float2(acc[rb][i], acc[rb][i + 1]), hi = make_float2(acc[rb][i + 2], acc[rb][i + 3]);
              if constexpr (kEp != GemmEpilogue::kNone) {
                const int n = u.n0 + col;  // a column pair inside N or wholly past it (N % 8 == 0): not copied
                const float2 b = n < p.N ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p.ep.bias + n))
                                         : make_float2(0.0f, 0.0f);
                lo.x += b.x, lo.y += b.y, hi.x += b.x, hi.y += b.y;
              }
              __nv_bfloat162 out_lo = __floats2bfloat162_rn(lo.x, lo.y), out_hi = __floats2bfloat162_rn(hi.x, hi.y);
              if constexpr (kEp == GemmEpilogue::kBiasGelu) {
                if (o == 1) {  // C: the GELU of the stored pre-activation
                  const float2 pl = __bfloat1622float2(out_lo), ph = __bfloat1622float2(out_hi);
                  out_lo = __floats2bfloat162_rn(cuda::gelu_f32(pl.x), cuda::gelu_f32(pl.y));
                  out_hi = __floats2bfloat162_rn(cuda::gelu_f32(ph.x), cuda::gelu_f32(ph.y));
                }
              }
              *reinterpret_cast<__nv_bfloat162*>(rows + r * kRow + col) = out_lo;
              *reinterpret_cast<__nv_bfloat162*>(rows + (r + 8) * kRow + col) = out_hi;
            }
            cuda::fence_proxy_async_shared();  // the rows' stores, before the copies (the async proxy) read them
            cuda::named_barrier_sync(1 + c, Cfg::kWarpgroupThreads);
            if (copier) {
              const int row = u.m0 + (rb0 + rb) * Cfg::kWgRows + tid_wg;
              if (row < p.M) {
                bf16* out = kEp == GemmEpilogue::kBiasGelu && o == 0 ? p.ep.aux : p.ep.c;
                cuda::bulk_store_global(out + static_cast<size_t>(row) * p.N + u.n0, rows + tid_wg * kRow, row_bytes);
              }
              cuda::bulk_commit_group();
            }
            __syncwarp();  // a row tail splits a copier warp: whole again before the barriers and wgmma that follow
          }
        }
        continue;
      }
    }

    // Epilogue: registers -> staging (fragment order) -> 4-column vectors along rows (coalesced), 64 rows
    // x 128 columns at a time. Accumulator registers 64h .. 64h+63 hold columns 128h .. 128h+127 (PTX:
    // register i of m64nN lies in column 8*(i/4) + ...), so the passes index acc with constants (unrolled).
    constexpr int kVecPerRow = Cfg::kStageCols / 4;
    // Ping-pong with the aux tiles: unrolled twice, its GELU-gradient epilogue spilled a register (ptxas,
    // 168); the pre-activations come from shared memory there, so the loop has little latency to hide.
    constexpr int kEpilogueUnroll = kAux && Cfg::kPingPong ? 1 : Cfg::kEpilogueUnroll;
    constexpr int kPassAcc = Cfg::kStageCols / 2;
    float* part = p.partial ? p.partial + static_cast<size_t>(u.split) * p.M * p.N : nullptr;
    if (aux_by_tma) cuda::mbarrier_wait(&aux_full[c], static_cast<uint32_t>(own) & 1);  // this unit's: phase own
#pragma unroll
    for (int rb = 0; rb < Cfg::kRowBlocks; ++rb) {
#pragma unroll
      for (int pass = 0; pass < Cfg::kBN / Cfg::kStageCols; ++pass) {
        cuda::named_barrier_sync(1 + c, Cfg::kWarpgroupThreads);  // the staging tile's last reads are done
#pragma unroll
        for (int j = 0; j < kPassAcc / 4; ++j) {
          const int i = pass * kPassAcc + 4 * j;
          const int r = cuda::wgmma_acc_row(warp, lane, i), col = cuda::wgmma_acc_col(lane, i) - pass * Cfg::kStageCols;
          *reinterpret_cast<float2*>(stg + layout.at(r, col)) = make_float2(acc[rb][i], acc[rb][i + 1]);
          *reinterpret_cast<float2*>(stg + layout.at(r + 8, col)) = make_float2(acc[rb][i + 2], acc[rb][i + 3]);
        }
        cuda::named_barrier_sync(1 + c, Cfg::kWarpgroupThreads);
        // kAux: one pass (kBN 128), so the staging tile's (r, c) are those of the aux tile's row block rb.
        finish_staged_tile<bf16, kEp, Cfg::kWgRows, kVecPerRow, Cfg::kWarpgroupThreads, kEpilogueUnroll, true>(
            stg, layout, u.m0 + (rb0 + rb) * Cfg::kWgRows, u.n0 + pass * Cfg::kStageCols, p.M, p.N, part, p.ep, tid_wg,
            AuxTileSmem{aux_by_tma ? aux_tile_rows(rb) : nullptr});
      }
    }
  }
  // The last copies out are complete before the block ends (their source is its shared memory).
  if (kBulkable && p.bulk_store && tid_wg < Cfg::kWgRows) cuda::bulk_wait_group<0>();
#else
  // Compiled for another architecture: this kernel is launched only where wgmma_device_ready() found
  // its sm_90a code, so this body never runs.
  (void)tmap_a, (void)tmap_b, (void)tmap_aux, (void)p;
  __trap();
#endif
}

// ---------------------------------------------------------------------------------------------------
// Host side.

// A row-major (outer, inner) bf16 matrix with leading dimension ld, read in 64 x 64 boxes with the
// 128-byte swizzle. Out-of-bounds box elements read as zero, which pads M, N and K tails.
CUtensorMap make_tensor_map(const bf16* base, int inner, int outer, int ld) {
  const uint64_t dims[2] = {static_cast<uint64_t>(inner), static_cast<uint64_t>(outer)};
  const uint64_t strides[1] = {static_cast<uint64_t>(ld) * sizeof(bf16)};
  const uint32_t box[2] = {kBox, kBox};
  return make_bf16_tensor_map(base, 2, dims, strides, box, "a GEMM operand");
}

template <class Cfg, bool kTransA, bool kTransB, GemmEpilogue kEp>
void launch_wgmma(const CUtensorMap& ta, const CUtensorMap& tb, const CUtensorMap& taux, WgmmaParams p,
                  int max_blocks, cudaStream_t stream) {
  auto kernel = gemm_bf16_wgmma_tma_persistent<Cfg, kTransA, kTransB, kEp>;
  constexpr size_t smem = kSmemBytesOf<Cfg, kEp>;
  cuda::allow_dynamic_smem(kernel, smem);
  constexpr bool kRoom = kStagesAux<Cfg, kEp>;
  GPT2_CHECK(!p.aux_by_tma || kRoom, "gemm_bf16_wgmma: pre-activations by TMA in a kernel without the room");
  const long units = static_cast<long>(p.tiles) * p.splits;
  const long blocks = max_blocks > 0 ? std::min(max_blocks, sm_count()) : sm_count();
  const unsigned grid = static_cast<unsigned>(units < blocks ? units : blocks);
  cuda::launch_kernel(kernel, grid, Cfg::kThreads, smem, stream, ta, tb, taux, p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool wgmma_device_ready() {
  static const bool ready = sm90a_kernel_runs_here(
      reinterpret_cast<const void*>(gemm_bf16_wgmma_tma_persistent<WgmmaTile<128>, false, false, GemmEpilogue::kNone>));
  return ready;
}

bool wgmma_takes(const bf16* a, const bf16* b, int lda, int ldb) {
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  return aligned16(a) && aligned16(b) && lda % 8 == 0 && ldb % 8 == 0;
}

WgmmaRan gemm_bf16_wgmma(GemmWgmmaKernel kernel, int max_blocks, bool aux_by_tma, bool aux_prefetch, bool bulk_store,
                         const bf16* a, const bf16* b, int M, int N, int K, bool trans_a, bool trans_b, int k_per_split,
                         int splits, int tile0, int tile_count, float* partial, const EpilogueParams<bf16>& ep,
                         GemmEpilogue epilogue, bf16* dbias, float* dbias_partial, cudaStream_t stream) {
  GPT2_CHECK(kernel != GemmWgmmaKernel::kDefault && kernel != GemmWgmmaKernel::kByShape,
             "gemm_bf16_wgmma needs a resolved kernel (gemm_wgmma_kernel_for)");
  GPT2_CHECK(k_per_split % kWgmmaBK == 0 && splits >= 1, "wgmma split-K range " << k_per_split << " x " << splits);
  // Every split has K to do: a unit without k-steps would release a stage it never waited for.
  GPT2_CHECK(K >= 1 && static_cast<long>(splits - 1) * k_per_split < K,
             "wgmma split-K: " << splits << " splits of " << k_per_split << " leave one empty for K=" << K);
  GPT2_CHECK(tile0 >= 0 && tile_count >= 1 && tile0 + tile_count <= wgmma_tiles(kernel, M, N),
             "wgmma tiles " << tile0 << " + " << tile_count << " of " << wgmma_tiles(kernel, M, N));
  const bool bias_grad = dbias != nullptr || dbias_partial != nullptr;
  GPT2_CHECK(!bias_grad || (trans_a && !trans_b && epilogue == GemmEpilogue::kNone),
             "wgmma fused bias gradient: A transposed, B not, no epilogue");
  GPT2_CHECK(!bias_grad || (splits > 1 ? dbias == nullptr && dbias_partial != nullptr : dbias_partial == nullptr),
             "wgmma fused bias gradient: dbias without split-K, dbias_partial with it");
  const int lda = trans_a ? M : K, ldb = trans_b ? K : N;
  GPT2_CHECK(wgmma_takes(a, b, lda, ldb), "the wgmma GEMM was given operands TMA cannot describe");
  // A is (M,K) [K-major] or, transposed, (K,M) [MN-major]; B is (K,N) [MN-major] or, transposed, (N,K).
  const CUtensorMap ta = trans_a ? make_tensor_map(a, M, K, lda) : make_tensor_map(a, K, M, lda);
  const CUtensorMap tb = trans_b ? make_tensor_map(b, K, N, ldb) : make_tensor_map(b, N, K, ldb);
  WgmmaParams p;
  p.M = M, p.N = N, p.K = K, p.k_per_split = k_per_split, p.splits = splits, p.partial = partial, p.ep = ep;
  p.tile0 = tile0, p.tiles = tile_count;
  p.dbias = dbias, p.dbias_partial = dbias_partial;
  // The GELU gradient's pre-activations by TMA: in the kernels that have the room (kAuxFits, the 128x128
  // ones), without split-K (which defers the epilogue), and when a tensor map can describe them (a
  // 16-byte aligned base, rows of a multiple of 8 elements).
  const bool room = kernel == GemmWgmmaKernel::k128x128 || kernel == GemmWgmmaKernel::k128x128PingPong;
  static_assert(WgmmaTile<128>::kAuxFits && WgmmaTile<128, true>::kAuxFits && !WgmmaTile<256>::kAuxFits, "room");
  const bool aux_tma_able = epilogue == GemmEpilogue::kDGelu && partial == nullptr && ep.vec4 && ep.aux != nullptr &&
                            wgmma_takes(ep.aux, ep.aux, N, N);
  p.aux_by_tma = aux_by_tma && room && aux_tma_able;
  // Where they do not come by TMA, into L2 while the products run (the epilogue reads them from global memory)
  p.aux_prefetch = aux_prefetch && !p.aux_by_tma && aux_tma_able;
  const CUtensorMap taux = p.aux_by_tma || p.aux_prefetch ? make_tensor_map(ep.aux, N, M, N) : ta;  // else never read
  p.bulk_store =
      bulk_store && kernel != GemmWgmmaKernel::k128x128PingPong && wgmma_bulk_store_takes(ep, epilogue, partial);
  // The configuration as a type, then the transposes and the epilogue as template arguments.
  auto with_cfg = [&](auto cfg) {
    using Cfg = decltype(cfg);
    dispatch_bool(trans_a, [&](auto tra) {
      dispatch_bool(trans_b, [&](auto trb) {
        constexpr bool kTa = decltype(tra)::value, kTb = decltype(trb)::value;
        dispatch_epilogue(epilogue, [&](auto e) {
          launch_wgmma<Cfg, kTa, kTb, decltype(e)::value>(ta, tb, taux, p, max_blocks, stream);
        });
      });
    });
  };
  switch (kernel) {
    case GemmWgmmaKernel::k128x256: with_cfg(WgmmaTile<256>{}); break;
    case GemmWgmmaKernel::k128x128PingPong: with_cfg(WgmmaTile<128, true>{}); break;
    default: with_cfg(WgmmaTile<128>{}); break;
  }
  return {p.aux_by_tma     ? WgmmaAuxRead::kTma
          : p.aux_prefetch ? WgmmaAuxRead::kPrefetchL2
                           : WgmmaAuxRead::kEpilogue,
          p.bulk_store};
}

}  // namespace gpt2::kernels::gemm_detail
