// The order in which the mma.sync attention kernels (attention.cu) hand their tiles to blocks: heaviest
// tiles first across groups of heads, not head after head. Host-safe (g++ compiles it: the unit tests
// check the mapping on the CPU).
//
// Why: a causal tile's work grows with its distance from the start of the sequence (the forward's query
// tile qt sees qt + 1 key tiles; the backward's key tile kt visits n - kt query tiles, its query tile qt
// qt + 1 key tiles). With a (tile, head, batch) grid each head's heaviest tile comes first, but the last
// heads' heaviest tiles start near the end and run alone while the other SMs idle; at the batch a 124M
// step uses, that tail costs the forward about a quarter of its time (tools/gpu/tile_order_schedule.py,
// docs/performance.md). Ranks across heads (every head's heaviest tile, then every head's next) leave
// the light tiles for the end, where they fill in.
//
// Why groups of heads (the forward; the backward runs one group, measured faster): a head's tiles read
// the same Q, K, V rows. In one rank order over every head, a head's next rank would start after the
// other heads' rows had evicted its own from L2 (at B = 16 the inputs are 72 MiB, L2 50 MB), so a group
// holds at most kTileGroupBytes of inputs and runs its ranks before the next group starts. Group sizes differ by at most one head: a much smaller last
// group would end in a tail of its own.
//
//   block b of TileOrder{heads, ranks, roles, groups} -> group, then rank r (0 = heaviest), then role
//   (0 .. roles-1), then head (0 .. heads-1; head = batch * NH + h)
#pragma once

#if defined(__CUDACC__)
#define GPT2_TILE_ORDER_FN __host__ __device__ inline
#else
#define GPT2_TILE_ORDER_FN inline
#endif

namespace gpt2::kernels::attention_order {

// Inputs a group of heads may read between them: most of the H100's and H200's 50 MB L2. Measured on the
// H200 (2026-11-27, docs/performance.md) at 16 MiB: one group over all 96 heads of B = 8 (36 MiB forward,
// 48 MiB backward) ran the forward 1.10x and the backward 1.01x faster than three groups; over all 768
// of B = 64, the forward 1% slower and the backward 2% faster. The tail a group ends in costs more than
// rows that L2 drops; 40 MiB keeps B = 8's forward in one group (then 1.10x faster than at 16 MiB).
constexpr long kTileGroupBytes = 40l << 20;

struct TileOrder {
  int heads;   // batch * NH
  int ranks;   // tiles per head and role, heaviest (rank 0) to lightest
  int roles;   // kinds of block per rank (the backward: dK/dV of a key tile, dQ of a query tile)
  int groups;  // 1 .. heads; the first heads % groups groups hold one head more than the others
};

struct TileSlot {
  int rank, role, head;
};

GPT2_TILE_ORDER_FN long tile_blocks(const TileOrder& o) { return static_cast<long>(o.heads) * o.ranks * o.roles; }

// The heads of group g: [first, first + count).
struct TileGroup {
  int first, count;
};
GPT2_TILE_ORDER_FN TileGroup tile_group(const TileOrder& o, int g) {
  const int small = o.heads / o.groups, larger = o.heads % o.groups;  // `larger` groups of small + 1
  return g < larger ? TileGroup{g * (small + 1), small + 1} : TileGroup{larger * (small + 1) + (g - larger) * small, small};
}

// Block `block` (0 .. tile_blocks - 1) -> its tile; a bijection.
GPT2_TILE_ORDER_FN TileSlot tile_slot(const TileOrder& o, int block) {
  const int per_head = o.ranks * o.roles;
  const int small = o.heads / o.groups, larger = o.heads % o.groups;
  const int larger_blocks = larger * (small + 1) * per_head;  // the larger groups come first
  const int g = block < larger_blocks ? block / ((small + 1) * per_head)
                                      : larger + (block - larger_blocks) / (small * per_head);
  const TileGroup group = tile_group(o, g);
  const int i = block - group.first * per_head;  // inside the group: rank-major, then role, then head
  const int rank = i / (group.count * o.roles);
  const int j = i - rank * group.count * o.roles;
  return {rank, j / group.count, group.first + j % group.count};
}

// Groups for `heads` heads that each read `head_bytes` of inputs: as few as hold at most kTileGroupBytes
// each (a head larger than that alone; head_bytes 0: one group). `max_heads` > 0 replaces that bound
// with at most `max_heads` heads a group (attention_set_tile_group_heads, for the benchmarks' comparison
// of orders).
GPT2_TILE_ORDER_FN int tile_groups(int heads, long head_bytes, int max_heads) {
  long cap = max_heads > 0 ? max_heads : (head_bytes > 0 ? kTileGroupBytes / head_bytes : heads);
  if (cap < 1) cap = 1;
  if (cap > heads) cap = heads;
  return static_cast<int>((heads + cap - 1) / cap);
}

}  // namespace gpt2::kernels::attention_order

#undef GPT2_TILE_ORDER_FN
