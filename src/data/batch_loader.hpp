// Reads each step's token windows on a background thread while the current step computes.
#pragma once

#include <cstdint>
#include <future>
#include <vector>

#include "data/sampler.hpp"
#include "data/token_file.hpp"

namespace gpt2 {

// This rank's sequences of one optimizer step: (seqs, T+1) tokens, row i = window i.
// Counts and indices are 64-bit: a step's sequences (accumulation x micro-batch) may exceed 2^31.
struct RankBatch {
  uint64_t step = 0;
  int64_t seqs = 0;
  int T = 0;
  std::vector<int32_t> tokens;

  // Micro-batch m of size B: inputs (B,T) = tokens[:, :T], targets (B,T) = tokens[:, 1:].
  void micro_batch(int64_t m, int B, int32_t* inputs, int32_t* targets) const;
};

RankBatch read_windows(TokenDataset& ds, const std::vector<uint64_t>& windows, uint64_t step);

class BatchLoader {
 public:
  // Reads steps up to end_step - 1 only: nothing past the run's last step is ever read.
  BatchLoader(TokenDataset& ds, DistributedSampler& sampler, uint64_t end_step)
      : ds_(ds), sampler_(sampler), end_step_(end_step) {}
  ~BatchLoader();
  // Begins prefetching `step`; next() then returns step, step+1, ...
  void start(uint64_t step);
  RankBatch next();

 private:
  std::future<RankBatch> launch(uint64_t step);
  TokenDataset& ds_;
  DistributedSampler& sampler_;
  uint64_t end_step_;
  uint64_t next_step_ = 0;
  std::future<RankBatch> pending_;
};

// Validation micro-batch `index`: windows [index * B, (index + 1) * B) in file order (no shuffling), so
// every evaluation sees the same tokens and a micro-batch holds the same windows on any world size.
RankBatch read_val_micro_batch(TokenDataset& ds, uint64_t index, int B);

}  // namespace gpt2
