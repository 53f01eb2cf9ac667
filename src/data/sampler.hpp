// Which windows each rank trains on. The global order of windows is a seeded permutation that
// changes every epoch and does not depend on the world size; each global batch of G sequences is
// split into contiguous rank slices [r*G/W, (r+1)*G/W). So 1, 2 or 8 ranks see the same global
// batches, no two ranks share a window in an epoch, and the ragged tail of an epoch is dropped.
//
// The permutation is computed, not stored: window_at(epoch, i) runs a keyed Feistel network over the
// smallest even-bit power of two >= the window count and cycle-walks until the value lands below it
// (a bijection on [0, 2^bits) restricted that way stays a bijection on [0, n)). The domain is < 4n, so
// a lookup takes under 4 network evaluations on average. Memory is O(1) whatever the dataset (a stored
// permutation took 8 bytes per window and was rebuilt each epoch), and resuming at step k is a jump:
// global index i of an epoch is window_at(epoch, i), nothing is replayed.
// This order differs from the Fisher-Yates order of earlier builds for the same seed: a run started
// before this change and resumed after it sees other windows for the rest of its epoch (every window
// still once per epoch).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace gpt2 {

// A seeded bijection of [0, n), evaluated per index.
class IndexPermutation {
 public:
  IndexPermutation(uint64_t n, uint64_t seed, uint64_t stream);
  uint64_t size() const { return n_; }
  uint64_t operator()(uint64_t i) const;  // i < size()

 private:
  static constexpr int kRounds = 6;  // >= 4 (Luby-Rackoff); extra rounds mix small domains better
  uint64_t feistel(uint64_t x) const;
  uint64_t n_;
  int half_bits_;  // each Feistel half; the domain is 2^(2*half_bits_)
  uint64_t half_mask_;
  std::array<uint64_t, kRounds> keys_;
};

class DistributedSampler {
 public:
  DistributedSampler(uint64_t num_windows, int64_t global_batch_seqs, int rank, int world_size, uint64_t seed);

  uint64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t sequences_per_rank() const { return global_batch_ / world_size_; }
  // Window j (< sequences_per_rank()) of this rank for optimizer step `step` (counted from the start of
  // training). Const and allocation-free: the prefetch thread calls it while the caller trains.
  uint64_t rank_window(uint64_t step, int64_t j) const;
  // Windows of this rank for optimizer step `step`, in order.
  std::vector<uint64_t> rank_windows(uint64_t step) const;
  // All windows of global batch `step` (every rank's slices concatenated), for tests.
  std::vector<uint64_t> global_windows(uint64_t step) const;

 private:
  uint64_t global_window(uint64_t step, uint64_t index_in_batch) const;
  uint64_t num_windows_;
  int64_t global_batch_;  // 64-bit: a global batch of sequences may exceed 2^31
  int rank_, world_size_;
  uint64_t seed_;
  uint64_t steps_per_epoch_;
};

}  // namespace gpt2
