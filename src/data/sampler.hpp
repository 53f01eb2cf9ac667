// Which windows each rank trains on. The global order of windows is a seeded permutation that
// changes every epoch and does not depend on the world size; each global batch of G sequences is
// split into contiguous rank slices [r*G/W, (r+1)*G/W). So 1, 2 or 8 ranks see the same global
// batches, no two ranks share a window in an epoch, and the ragged tail of an epoch is dropped.
#pragma once

#include <cstdint>
#include <vector>

namespace gpt2 {

class DistributedSampler {
 public:
  DistributedSampler(uint64_t num_windows, int64_t global_batch_seqs, int rank, int world_size, uint64_t seed);

  uint64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t sequences_per_rank() const { return global_batch_ / world_size_; }
  // Windows of this rank for optimizer step `step` (counted from the start of training), in order.
  std::vector<uint64_t> rank_windows(uint64_t step);
  // All windows of global batch `step` (every rank's slices concatenated), for tests.
  std::vector<uint64_t> global_windows(uint64_t step);

 private:
  const std::vector<uint64_t>& permutation(uint64_t epoch);
  uint64_t num_windows_;
  int64_t global_batch_;  // 64-bit: a global batch of sequences may exceed 2^31
  int rank_, world_size_;
  uint64_t seed_;
  uint64_t steps_per_epoch_;
  uint64_t cached_epoch_ = UINT64_MAX;
  std::vector<uint64_t> perm_;
};

}  // namespace gpt2
