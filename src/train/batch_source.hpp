// Where each optimizer step's tokens come from, so the step loop does not care: the training files
// (a seeded permutation, prefetched on a thread: data/batch_loader.hpp) or, for --benchmark,
// synthetic tokens (no files, the same on every run).
#pragma once

#include <cstdint>
#include <memory>

#include "data/batch_loader.hpp"

namespace gpt2 {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // This rank's sequences of `step` (0-based; steps are asked for in order); valid until the next call.
  virtual const RankBatch& next(int64_t step) = 0;
};

// Ends the job with a message when `data` holds less than one global batch of seqs_per_step sequences.
void require_one_global_batch(const TokenDataset& data, int64_t seqs_per_step);
// The validation data's size, checked at start-up as the training data's is: at least one micro-batch of
// micro_batch windows (the validation set is the first --val-batches of them).
void require_one_val_micro_batch(const TokenDataset& data, int micro_batch);

// The training files. seqs_per_step: the global batch in sequences (all ranks). Ends the job with a
// message when the data holds less than one global batch; logs the data line. Prefetches from
// first_step on; never reads past end_step - 1.
std::unique_ptr<BatchSource> make_file_batches(TokenDataset& data, int64_t seqs_per_step, int rank, int world,
                                               uint64_t seed, int64_t first_step, int64_t end_step,
                                               HostAllocator alloc);

// --benchmark: seqs sequences of T+1 uniform tokens below vocab per step, from (seed, step, rank).
std::unique_ptr<BatchSource> make_synthetic_batches(int64_t seqs, int T, int vocab, uint64_t seed, int rank, int world);

}  // namespace gpt2
