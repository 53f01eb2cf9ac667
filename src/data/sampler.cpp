#include "data/sampler.hpp"

#include "core/error.hpp"
#include "core/rng.hpp"

namespace gpt2 {

namespace {

// SplitMix64's finaliser: a strong 64-bit mix, the round function of the Feistel network.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

IndexPermutation::IndexPermutation(uint64_t n, uint64_t seed, uint64_t stream) : n_(n) {
  int bits = 2;  // at least one bit per half, so n = 1 and n = 2 work like any other size
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  if (bits % 2) ++bits;
  half_bits_ = bits / 2;
  half_mask_ = half_bits_ >= 64 ? ~uint64_t{0} : (uint64_t{1} << half_bits_) - 1;
  Rng rng(seed, stream);  // our own generator: the same order on every platform
  for (uint64_t& k : keys_) k = rng.next_u64();
}

uint64_t IndexPermutation::feistel(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (uint64_t k : keys_) {
    const uint64_t next = left ^ (mix64(right ^ k) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t IndexPermutation::operator()(uint64_t i) const {
  GPT2_CHECK(i < n_, "index " << i << " outside a permutation of " << n_);
  // Cycle walking: x's orbit under the network returns to [0, n) before it returns to i.
  uint64_t x = feistel(i);
  while (x >= n_) x = feistel(x);
  return x;
}

DistributedSampler::DistributedSampler(uint64_t num_windows, int64_t global_batch_seqs, int rank, int world_size,
                                       uint64_t seed)
    : num_windows_(num_windows), global_batch_(global_batch_seqs), rank_(rank), world_size_(world_size), seed_(seed) {
  GPT2_REQUIRE(global_batch_seqs > 0, "global batch must hold at least one sequence");
  GPT2_REQUIRE(global_batch_seqs % world_size == 0, "the global batch of " << global_batch_seqs
                                                      << " sequences does not divide over " << world_size << " ranks");
  steps_per_epoch_ = num_windows / static_cast<uint64_t>(global_batch_seqs);
}

uint64_t DistributedSampler::global_window(uint64_t step, uint64_t index_in_batch) const {
  GPT2_CHECK(steps_per_epoch_ > 0, "dataset shorter than one global batch");
  const uint64_t epoch = step / steps_per_epoch_;
  const uint64_t i = (step % steps_per_epoch_) * static_cast<uint64_t>(global_batch_) + index_in_batch;
  // Building the permutation is a few key draws: cheaper than caching it across threads.
  return IndexPermutation(num_windows_, seed_, 0xDA7A0000ULL + epoch)(i);
}

uint64_t DistributedSampler::rank_window(uint64_t step, int64_t j) const {
  const int64_t per_rank = sequences_per_rank();
  GPT2_CHECK(j >= 0 && j < per_rank, "window " << j << " of a rank slice of " << per_rank);
  return global_window(step, static_cast<uint64_t>(rank_ * per_rank + j));
}

std::vector<uint64_t> DistributedSampler::rank_windows(uint64_t step) const {
  std::vector<uint64_t> out(static_cast<size_t>(sequences_per_rank()));
  for (size_t j = 0; j < out.size(); ++j) out[j] = rank_window(step, static_cast<int64_t>(j));
  return out;
}

std::vector<uint64_t> DistributedSampler::global_windows(uint64_t step) const {
  std::vector<uint64_t> out(static_cast<size_t>(global_batch_));
  for (size_t i = 0; i < out.size(); ++i) out[i] = global_window(step, i);
  return out;
}

}  // namespace gpt2
