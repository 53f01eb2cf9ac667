#include "data/batch_loader.hpp"

#include <cstring>
#include <new>

#include "core/error.hpp"

namespace gpt2 {

void TokenBuffer::resize(size_t n) {
  if (n > capacity_) {
    free_storage();
    const size_t bytes = n * sizeof(int32_t);
    p_ = static_cast<int32_t*>(alloc_.allocate ? alloc_.allocate(bytes) : ::operator new(bytes));
    GPT2_CHECK(p_ != nullptr, "cannot allocate " << bytes << " bytes for batch tokens");
    capacity_ = n;
  }
  n_ = n;
}

void TokenBuffer::free_storage() {
  if (p_ != nullptr) {
    if (alloc_.release)
      alloc_.release(p_);
    else
      ::operator delete(p_);
  }
  p_ = nullptr;
  n_ = capacity_ = 0;
}

void RankBatch::micro_batch(int64_t m, int B, int32_t* inputs, int32_t* targets) const {
  GPT2_CHECK(m >= 0 && (m + 1) * B <= seqs, "micro-batch " << m << " of " << B << " sequences is outside the "
                                                             << seqs << " sequences of step " << step);
  for (int b = 0; b < B; ++b) {
    const int32_t* row = tokens.data() + (static_cast<size_t>(m) * B + b) * (static_cast<size_t>(T) + 1);
    std::memcpy(inputs + static_cast<size_t>(b) * T, row, sizeof(int32_t) * T);
    std::memcpy(targets + static_cast<size_t>(b) * T, row + 1, sizeof(int32_t) * T);
  }
}

BatchLoader::BatchLoader(TokenDataset& ds, const DistributedSampler& sampler, uint64_t end_step, HostAllocator alloc)
    : ds_(ds), sampler_(sampler), end_step_(end_step), slots_{RankBatch(alloc), RankBatch(alloc)} {
  // Both buffers are allocated here, on the caller's thread: a CUDA allocator must run where the
  // rank's device is current (on the worker it would open a context on device 0), and fill() never grows them.
  const size_t tokens = static_cast<size_t>(sampler.sequences_per_rank()) * (static_cast<size_t>(ds.seq_len()) + 1);
  for (RankBatch& b : slots_) b.tokens.resize(tokens);
  thread_ = std::thread([this] { worker(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // finishes the read in progress, if any: it writes into slots_
}

void BatchLoader::fill(RankBatch& b, uint64_t step) {
  b.step = step;
  b.seqs = sampler_.sequences_per_rank();
  b.T = ds_.seq_len();
  const size_t row = static_cast<size_t>(b.T) + 1;
  b.tokens.resize(static_cast<size_t>(b.seqs) * row);
  for (int64_t j = 0; j < b.seqs; ++j) ds_.read_window(sampler_.rank_window(step, j), b.tokens.data() + static_cast<size_t>(j) * row);
}

void BatchLoader::worker() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || job_pending_; });
    if (stop_) return;
    const uint64_t step = job_step_;
    RankBatch& slot = slots_[job_slot_];
    lock.unlock();
    fill(slot, step);  // errors end the job through fatal(), as on the caller's thread
    lock.lock();
    job_pending_ = false;
    cv_.notify_all();
  }
}

void BatchLoader::wait_idle(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [this] { return !job_pending_; });
}

void BatchLoader::start(uint64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_idle(lock);
  next_step_ = step;
  have_job_ = next_step_ < end_step_;
  if (have_job_) {
    job_step_ = next_step_;
    job_slot_ = ready_slot_;
    job_pending_ = true;
    cv_.notify_all();
  }
}

const RankBatch& BatchLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  GPT2_CHECK(have_job_, "BatchLoader::next() past the last step " << end_step_);
  wait_idle(lock);
  const int current = ready_slot_;
  // The other slot was returned by the previous next(): the caller is done with it now.
  ready_slot_ = 1 - ready_slot_;
  have_job_ = ++next_step_ < end_step_;
  if (have_job_) {
    job_step_ = next_step_;
    job_slot_ = ready_slot_;
    job_pending_ = true;
    cv_.notify_all();
  }
  return slots_[current];
}

void read_val_micro_batch(TokenDataset& ds, uint64_t index, int B, RankBatch& out) {
  out.step = index;
  out.seqs = B;
  out.T = ds.seq_len();
  const size_t row = static_cast<size_t>(out.T) + 1;
  out.tokens.resize(static_cast<size_t>(B) * row);
  for (int i = 0; i < B; ++i)
    ds.read_window(index * static_cast<uint64_t>(B) + static_cast<uint64_t>(i), out.tokens.data() + static_cast<size_t>(i) * row);
}

}  // namespace gpt2
