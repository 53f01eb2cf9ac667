// The dQ turns of the accumulate-dq attention backward, shared by its two kernels (attention.cu's
// mma.sync attention_bwd_tc_accumulate_dq and attention_bwd_sm90.cu's wgmma kernel): one block per (key
// tile, head, batch) computes dK and dV and adds its share of dQ, dS K, into the fp32 accumulator dq_acc
// of every query tile it visits. Deterministic without float atomics: the key tiles of one query tile
// take turns, highest key tile first. dq_turns[(b*NH + h)*n_qt + qt] counts the key tiles done with
// query tile qt; key tile kt waits until it reaches dq_turn(kt, qt), writes (its turn is 0: no key tile
// above it sees qt, so dq_acc needs no clearing) or adds, and counts itself.
//
// Why highest first: a block starts at its first (diagonal) query tile and walks to the last, so key
// tile kt + 1, which has two fewer query tiles in front of it (at 128 keys and 64 queries a tile), is
// always past the query tile that key tile kt is about to add to. In key order (lowest first, as it was
// until 2026-11-26) key tile kt waited at every query tile for kt - 1, which had more tiles in front of
// it: the eight key tiles of a head at T = 1024 held their SMs for about as long as key tile 0's sixteen
// query tiles while doing 72 tiles of work in 128 tile slots, and tools/gpu/dq_turn_schedule.py's wave
// model puts the SMs at 52% busy that way against 92% now (B = 16, one block per SM).
//
// Why it cannot deadlock: blocks take (key tile, head, batch) from a ticket in dq_turn_work's order, the
// highest key tile of a head first, so when key tile kt starts, the key tiles above it have started
// (resident or finished), and its waits go only to them; the highest never waits. The wait graph has
// no cycle, whatever order the hardware starts blocks in.
//
// Internal to kernels/attention/ (.cu files only).
#pragma once

namespace gpt2::kernels::attention_detail {

struct DqTurnWork {
  int kt, h, b;  // key tile, head, batch
};

// Ticket t -> (key tile, head, batch): the key tiles of one head together (their Q, dO and dq_acc rows
// stay in L2 while they run), highest key tile first; then the head, then the batch.
__device__ __forceinline__ DqTurnWork dq_turn_work(int ticket, int n_kv, int NH) {
  return {n_kv - 1 - ticket % n_kv, (ticket / n_kv) % NH, ticket / (n_kv * NH)};
}

// The highest key tile (of block_n keys) whose causal range holds query tile qt (of block_m queries):
// the first to add to it. Key tile kt visits qt when kt * block_n <= the last query of qt.
__device__ __forceinline__ int dq_first_key_tile(int qt, int block_m, int block_n, int n_kv) {
  const int kt = (qt * block_m + block_m - 1) / block_n;
  return kt < n_kv - 1 ? kt : n_kv - 1;
}

// What dq_turns of query tile qt reads when it is key tile kt's turn: the key tiles above kt that add.
__device__ __forceinline__ int dq_turn(int kt, int qt, int block_m, int block_n, int n_kv) {
  return dq_first_key_tile(qt, block_m, block_n, n_kv) - kt;
}

}  // namespace gpt2::kernels::attention_detail
