// The order in which the mma.sync attention kernels (attention.cu) hand their tiles to blocks: heaviest
// tiles first across groups of heads, not head after head. Host-safe (g++ compiles it: the unit tests
// check the mapping on the CPU).
//
// Why: a causal tile's work grows with its distance from the start of the sequence (the forward's query
// tile qt sees qt + 1 key tiles; the backward's key tile kt sees n - kt query tiles, its query tile qt
// sees qt + 1 key tiles). With a (tile, head, batch) grid, each head's heaviest tile comes first, but the
// last heads' heaviest tiles still start near the end and run alone: a wave model (tools/gpu/
// tile_order_schedule.py, 264 resident blocks on 132 SMs) puts the SMs at 73% busy in the forward at
// B*T = 8192 and 95% at 65536. The H100 measured the same gap (600 against 805 GB/s, 0.75; the model
// says 0.76) and 0.92 in the backward (the model: 0.91). Ranks across heads (every head's heaviest tile,
// then every head's next) let the light tiles fill in at the end.
//
// Why groups of heads: a head's tiles read the same Q, K, V (and dO) rows. In one rank order over all
// heads a block would find its head's rows evicted by the time the next rank of that head starts (at
// B = 16 the inputs are 100 MB, L2 is 50 MB), so each group holds at most kTileGroupBytes of inputs and
// runs its ranks before the next group starts. The groups are made equal in size (a small last group
// would end in a tail of its own).
//
//   block b of TileOrder{heads, ranks, roles, group_heads}, with g = b / (group_heads' blocks):
//     group g, rank r (0 = heaviest), role (0 .. roles-1), head (0 .. heads-1; head = batch * NH + h)
#pragma once

#if defined(__CUDACC__)
#define GPT2_TILE_ORDER_FN __host__ __device__ inline
#else
#define GPT2_TILE_ORDER_FN inline
#endif

namespace gpt2::kernels::attention_order {

// Inputs a group of heads may read between them: a third of the H100's 50 MB L2 (two 25 MB halves; a
// line read from the far half may be held in both), so the group's rows stay while its ranks run.
constexpr long kTileGroupBytes = 16l << 20;

struct TileOrder {
  int heads;        // batch * NH
  int ranks;        // tiles per head and role, heaviest (rank 0) to lightest
  int roles;        // kinds of block per rank (the backward: dK/dV of a key tile, dQ of a query tile)
  int group_heads;  // heads a group (the last group may have fewer), >= 1
};

struct TileSlot {
  int rank, role, head;
};

GPT2_TILE_ORDER_FN long tile_blocks(const TileOrder& o) { return static_cast<long>(o.heads) * o.ranks * o.roles; }

// Block `block` (0 .. tile_blocks - 1) -> its tile; a bijection.
GPT2_TILE_ORDER_FN TileSlot tile_slot(const TileOrder& o, int block) {
  const int per_head = o.ranks * o.roles;
  const int group = block / (o.group_heads * per_head);
  const int first_head = group * o.group_heads;
  const int rest = o.heads - first_head;
  const int heads_here = rest < o.group_heads ? rest : o.group_heads;
  const int i = block - first_head * per_head;  // inside the group: rank-major, then role, then head
  const int rank = i / (heads_here * o.roles);
  const int j = i - rank * heads_here * o.roles;
  return {rank, j / heads_here, first_head + j % heads_here};
}

// Heads a group for `heads` heads that each read `head_bytes` of inputs: at most kTileGroupBytes a group
// (at least one head), spread evenly over as many groups as that takes. `forced` > 0 replaces that cap
// (attention_set_tile_group_heads, for the benchmarks' comparison: 1 is each head alone, as the order was
// before 2026-11-27; `heads` or more is one group, every head's rank r before any head's rank r + 1).
GPT2_TILE_ORDER_FN int tile_group_heads(int heads, long head_bytes, int forced) {
  long cap = forced > 0 ? forced : (head_bytes > 0 ? kTileGroupBytes / head_bytes : heads);
  if (cap < 1) cap = 1;
  if (cap > heads) cap = heads;
  const long groups = (heads + cap - 1) / cap;
  return static_cast<int>((heads + groups - 1) / groups);
}

}  // namespace gpt2::kernels::attention_order

#undef GPT2_TILE_ORDER_FN
