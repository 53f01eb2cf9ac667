#include "data/batch_loader.hpp"

#include <cstring>

#include "core/error.hpp"

namespace gpt2 {

void RankBatch::micro_batch(int64_t m, int B, int32_t* inputs, int32_t* targets) const {
  GPT2_CHECK(m >= 0 && (m + 1) * B <= seqs, "micro-batch " << m << " of " << B << " sequences is outside the "
                                                             << seqs << " sequences of step " << step);
  for (int b = 0; b < B; ++b) {
    const int32_t* row = tokens.data() + (static_cast<size_t>(m) * B + b) * (static_cast<size_t>(T) + 1);
    std::memcpy(inputs + static_cast<size_t>(b) * T, row, sizeof(int32_t) * T);
    std::memcpy(targets + static_cast<size_t>(b) * T, row + 1, sizeof(int32_t) * T);
  }
}

RankBatch read_windows(TokenDataset& ds, const std::vector<uint64_t>& windows, uint64_t step) {
  RankBatch b;
  b.step = step;
  b.seqs = static_cast<int64_t>(windows.size());
  b.T = ds.seq_len();
  const size_t row = static_cast<size_t>(b.T) + 1;
  b.tokens.resize(windows.size() * row);
  for (size_t i = 0; i < windows.size(); ++i) ds.read_window(windows[i], b.tokens.data() + i * row);
  return b;
}

BatchLoader::~BatchLoader() {
  if (pending_.valid()) pending_.wait();
}

std::future<RankBatch> BatchLoader::launch(uint64_t step) {
  // The sampler's permutation is computed here, on the caller's thread, so it is never shared.
  std::vector<uint64_t> windows = sampler_.rank_windows(step);
  return std::async(std::launch::async, [this, w = std::move(windows), step]() { return read_windows(ds_, w, step); });
}

void BatchLoader::start(uint64_t step) {
  if (pending_.valid()) pending_.wait();
  next_step_ = step;
  if (next_step_ < end_step_) pending_ = launch(next_step_);
}

RankBatch BatchLoader::next() {
  GPT2_CHECK(pending_.valid(), "BatchLoader::next() past the last step " << end_step_);
  RankBatch b = pending_.get();
  if (++next_step_ < end_step_) pending_ = launch(next_step_);
  return b;
}

RankBatch read_val_micro_batch(TokenDataset& ds, uint64_t index, int B) {
  std::vector<uint64_t> w(static_cast<size_t>(B));
  for (int i = 0; i < B; ++i) w[i] = index * static_cast<uint64_t>(B) + static_cast<uint64_t>(i);
  return read_windows(ds, w, index);
}

}  // namespace gpt2
