// Training-data throughput: the real sampler and prefetching loader over 100 HDF5 shards in a temporary
// directory, in tokens/s delivered to the step loop (inputs: seq_len tokens per sequence).
//
//   bench_loader [benchmark flags]
//
// For scale: GPT-2 124M on 8 H100s trains at about 4M tokens/s in all, 0.5M tokens/s per rank, and every
// rank runs its own loader over its slice. The counter `x_8h100_need` is this process's rate over that
// 4M tokens/s (the goal is >= 10): one loader alone against the whole job's appetite; `x_rank_need`
// is the same over one rank's 0.5M tokens/s.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "data/batch_loader.hpp"
#include "data/sampler.hpp"
#include "data/token_file.hpp"

namespace {

namespace fs = std::filesystem;

constexpr int kShards = 100;
constexpr size_t kTokensPerShard = size_t{1} << 18;  // 100 x 256 Ki tokens: 51 MB of uint16 on disk
constexpr double kTrainingNeed = 4e6;                // tokens/s, 124M on 8 H100s

// Writes the shards once per process; removed at exit.
struct Shards {
  fs::path dir;
  Shards() {
    dir = fs::temp_directory_path() / ("gpt2_bench_loader_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    gpt2::TokenFileWriteOptions o;
    o.vocab_size = 50257;
    o.tokenizer = "gpt2";
    std::vector<uint32_t> t(kTokensPerShard);
    for (int f = 0; f < kShards; ++f) {
      for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>((f * 7919 + i * 31) % 50257);
      char name[32];
      std::snprintf(name, sizeof(name), "train_%06d.h5", f);
      gpt2::write_token_file((dir / name).string(), t, o);
    }
  }
  ~Shards() { fs::remove_all(dir); }
  std::string pattern() const { return (dir / "train_*.h5").string(); }
};

const Shards& shards() {
  static Shards s;
  return s;
}

// Args: sequence length T, sequences per step on this rank (global batch / world size), world size.
void BM_LoaderTokensPerSecond(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  const int64_t per_rank = state.range(1);
  const int W = static_cast<int>(state.range(2));
  gpt2::TokenDataset ds(shards().pattern(), T);
  gpt2::DistributedSampler sampler(ds.num_windows(), per_rank * W, /*rank=*/W - 1, W, /*seed=*/1);
  const uint64_t end = uint64_t{1} << 40;  // never reached
  gpt2::BatchLoader loader(ds, sampler, end);
  loader.start(0);
  int64_t tokens = 0;
  uint64_t checksum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const gpt2::RankBatch& b = loader.next();
    checksum += static_cast<uint32_t>(b.tokens.data()[0]);
    tokens += b.seqs * b.T;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(checksum);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["x_8h100_need"] = static_cast<double>(tokens) / seconds / kTrainingNeed;
  state.counters["x_rank_need"] = static_cast<double>(tokens) / seconds / (kTrainingNeed / 8);
  state.counters["shards"] = static_cast<double>(ds.num_files());
}
// 124M's shapes: T = 1024, micro-batch 64 (one rank of a single-rank job, and rank 7 of 8 with the
// same per-rank slice); a short sequence stresses the per-window cost.
BENCHMARK(BM_LoaderTokensPerSecond)
    ->Args({1024, 64, 1})
    ->Args({1024, 64, 8})
    ->Args({256, 64, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
