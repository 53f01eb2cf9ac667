// Reads each step's token windows on a background thread while the current step computes.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

#include "data/sampler.hpp"
#include "data/token_file.hpp"

namespace gpt2 {

// Where batch tokens live. The default is the heap; the CUDA runner installs page-locked memory
// (cudaHostAlloc, ModelRunner::host_allocator()) so host-to-device copies of a batch need no staging
// copy by the driver. A plain function pair keeps the data library free of CUDA.
struct HostAllocator {
  void* (*allocate)(size_t bytes) = nullptr;  // nullptr: operator new
  void (*release)(void* p) = nullptr;
};

// int32 tokens in memory from a HostAllocator. Grows only: a buffer reused step after step allocates once.
class TokenBuffer {
 public:
  explicit TokenBuffer(HostAllocator alloc = {}) : alloc_(alloc) {}
  ~TokenBuffer() { free_storage(); }
  TokenBuffer(const TokenBuffer&) = delete;
  TokenBuffer& operator=(const TokenBuffer&) = delete;
  void resize(size_t n);  // contents lost when it grows
  int32_t* data() { return p_; }
  const int32_t* data() const { return p_; }
  size_t size() const { return n_; }
  int32_t* begin() { return p_; }
  int32_t* end() { return p_ + n_; }

 private:
  void free_storage();
  HostAllocator alloc_;
  int32_t* p_ = nullptr;
  size_t n_ = 0, capacity_ = 0;
};

// This rank's sequences of one optimizer step: (seqs, T+1) tokens, row i = window i.
// Counts and indices are 64-bit: a step's sequences (accumulation x micro-batch) may exceed 2^31.
struct RankBatch {
  explicit RankBatch(HostAllocator alloc = {}) : tokens(alloc) {}
  uint64_t step = 0;
  int64_t seqs = 0;
  int T = 0;
  TokenBuffer tokens;

  // Micro-batch m of size B: inputs (B,T) = tokens[:, :T], targets (B,T) = tokens[:, 1:].
  void micro_batch(int64_t m, int B, int32_t* inputs, int32_t* targets) const;
};

// Double-buffered prefetch: one worker thread fills one of two batches while the caller trains on the
// other. Both batches are allocated once, in the constructor; no step allocates on our side after that
// (HDF5 makes small allocations of its own inside each read).
class BatchLoader {
 public:
  // Reads steps up to end_step - 1 only: nothing past the run's last step is ever read.
  BatchLoader(TokenDataset& ds, const DistributedSampler& sampler, uint64_t end_step, HostAllocator alloc = {});
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;
  // Begins prefetching `step`; next() then returns step, step+1, ...
  void start(uint64_t step);
  // The next step's batch; valid until the following call to next() or start().
  const RankBatch& next();

 private:
  void worker();
  void fill(RankBatch& b, uint64_t step);
  void wait_idle(std::unique_lock<std::mutex>& lock);
  TokenDataset& ds_;
  const DistributedSampler& sampler_;
  uint64_t end_step_;
  uint64_t next_step_ = 0;
  RankBatch slots_[2];
  int ready_slot_ = 0;  // the slot holding (or being filled with) next_step_
  // Worker hand-off, under mu_: the caller posts (job_step_, job_slot_); the worker clears job_pending_.
  std::mutex mu_;
  std::condition_variable cv_;
  bool job_pending_ = false, stop_ = false, have_job_ = false;
  uint64_t job_step_ = 0;
  int job_slot_ = 0;
  std::thread thread_;
};

// Validation micro-batch `index`: windows [index * B, (index + 1) * B) in file order (no shuffling), so
// every evaluation sees the same tokens and a micro-batch holds the same windows on any world size.
// Fills `out` (reused across calls).
void read_val_micro_batch(TokenDataset& ds, uint64_t index, int B, RankBatch& out);

}  // namespace gpt2
