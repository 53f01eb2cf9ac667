#include "data/sampler.hpp"

#include <numeric>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace gpt2 {

DistributedSampler::DistributedSampler(uint64_t num_windows, int64_t global_batch_seqs, int rank, int world_size,
                                       uint64_t seed)
    : num_windows_(num_windows), global_batch_(global_batch_seqs), rank_(rank), world_size_(world_size), seed_(seed) {
  GPT2_REQUIRE(global_batch_seqs > 0, "global batch must hold at least one sequence");
  GPT2_REQUIRE(global_batch_seqs % world_size == 0, "the global batch of " << global_batch_seqs
                                                      << " sequences does not divide over " << world_size << " ranks");
  steps_per_epoch_ = num_windows / static_cast<uint64_t>(global_batch_seqs);
}

const std::vector<uint64_t>& DistributedSampler::permutation(uint64_t epoch) {
  if (epoch != cached_epoch_) {
    perm_.resize(num_windows_);
    std::iota(perm_.begin(), perm_.end(), uint64_t{0});
    Rng rng(seed_, 0xDA7A0000ULL + epoch);  // Fisher-Yates with our own generator: same on every platform
    for (uint64_t i = num_windows_; i > 1; --i) std::swap(perm_[i - 1], perm_[rng.below(i)]);
    cached_epoch_ = epoch;
  }
  return perm_;
}

std::vector<uint64_t> DistributedSampler::global_windows(uint64_t step) {
  GPT2_CHECK(steps_per_epoch_ > 0, "dataset shorter than one global batch");
  const uint64_t epoch = step / steps_per_epoch_;
  const uint64_t first = (step % steps_per_epoch_) * static_cast<uint64_t>(global_batch_);
  const auto& p = permutation(epoch);
  return std::vector<uint64_t>(p.begin() + static_cast<std::ptrdiff_t>(first),
                               p.begin() + static_cast<std::ptrdiff_t>(first + static_cast<uint64_t>(global_batch_)));
}

std::vector<uint64_t> DistributedSampler::rank_windows(uint64_t step) {
  std::vector<uint64_t> all = global_windows(step);
  const int64_t per_rank = global_batch_ / world_size_;
  return std::vector<uint64_t>(all.begin() + rank_ * per_rank, all.begin() + (rank_ + 1) * per_rank);
}

}  // namespace gpt2
