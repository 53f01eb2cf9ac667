#include "train/batch_source.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/rng.hpp"
#include "data/sampler.hpp"

namespace gpt2 {

void require_one_global_batch(const TokenDataset& data, int64_t seqs_per_step) {
  GPT2_REQUIRE(data.num_windows() >= static_cast<uint64_t>(seqs_per_step),
               "training data " << data.pattern() << " holds " << data.num_windows() << " windows of "
                                << data.seq_len() + 1 << " tokens, fewer than one global batch of " << seqs_per_step
                                << " sequences: use more data or a smaller --global-batch-tokens");
}

void require_one_val_micro_batch(const TokenDataset& data, int micro_batch) {
  GPT2_REQUIRE(data.num_windows() >= static_cast<uint64_t>(micro_batch),
               "validation data " << data.pattern() << " holds " << data.num_windows() << " windows of "
                                  << data.seq_len() + 1 << " tokens, fewer than one micro-batch of " << micro_batch
                                  << " sequences: use more validation data (gpt2-data prepare --val-fraction) or a "
                                     "smaller --micro-batch");
}

namespace {

class FileBatches final : public BatchSource {
 public:
  FileBatches(TokenDataset& data, int64_t seqs_per_step, int rank, int world, uint64_t seed, int64_t first_step,
              int64_t end_step, HostAllocator alloc)
      : sampler_(data.num_windows(), seqs_per_step, rank, world, seed) {
    require_one_global_batch(data, seqs_per_step);
    log_info("data: %s tokens in %zu file(s), %llu steps per epoch\n",
             format_count(static_cast<double>(data.num_tokens())).c_str(), data.num_files(),
             static_cast<unsigned long long>(sampler_.steps_per_epoch()));
    loader_ = std::make_unique<BatchLoader>(data, sampler_, static_cast<uint64_t>(end_step), alloc);
    loader_->start(static_cast<uint64_t>(first_step));
  }
  const RankBatch& next(int64_t /*step: the loader runs in order from first_step*/) override {
    return loader_->next();
  }

 private:
  DistributedSampler sampler_;
  std::unique_ptr<BatchLoader> loader_;  // after sampler_, which it reads
};

class SyntheticBatches final : public BatchSource {
 public:
  SyntheticBatches(int64_t seqs, int T, int vocab, uint64_t seed, int rank, int world)
      : vocab_(vocab), seed_(seed), rank_(rank), world_(world) {
    batch_.T = T;
    batch_.seqs = seqs;
    batch_.tokens.resize(static_cast<size_t>(seqs) * (static_cast<size_t>(T) + 1));
  }
  const RankBatch& next(int64_t step) override {
    Rng rng(seed_, 0xBE7C0000ULL + static_cast<uint64_t>(step) * static_cast<uint64_t>(world_) +
                       static_cast<uint64_t>(rank_));
    for (auto& t : batch_.tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_)));
    batch_.step = static_cast<uint64_t>(step);
    return batch_;
  }

 private:
  RankBatch batch_;
  int vocab_;
  uint64_t seed_;
  int rank_, world_;
};

}  // namespace

std::unique_ptr<BatchSource> make_file_batches(TokenDataset& data, int64_t seqs_per_step, int rank, int world,
                                               uint64_t seed, int64_t first_step, int64_t end_step,
                                               HostAllocator alloc) {
  return std::make_unique<FileBatches>(data, seqs_per_step, rank, world, seed, first_step, end_step, alloc);
}

std::unique_ptr<BatchSource> make_synthetic_batches(int64_t seqs, int T, int vocab, uint64_t seed, int rank,
                                                    int world) {
  return std::make_unique<SyntheticBatches>(seqs, T, vocab, seed, rank, world);
}

}  // namespace gpt2
