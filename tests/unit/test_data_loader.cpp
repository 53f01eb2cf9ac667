// The computed window permutation, the double-buffered loader and the bounded HDF5 chunk cache.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "data/batch_loader.hpp"
#include "data/sampler.hpp"
#include "data/token_file.hpp"

namespace {

namespace fs = std::filesystem;

// Every index maps into [0, n) and no two indices share an image.
void expect_bijection(uint64_t n, uint64_t seed, uint64_t stream) {
  gpt2::IndexPermutation p(n, seed, stream);
  std::vector<bool> hit(n, false);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t v = p(i);
    ASSERT_LT(v, n) << "n " << n << " index " << i;
    ASSERT_FALSE(hit[v]) << "n " << n << ": " << v << " is the image of two indices";
    hit[v] = true;
  }
}

TEST(IndexPermutation, IsABijectionOnEverySmallSize) {
  for (uint64_t n = 1; n <= 2000; ++n) expect_bijection(n, 7, n % 5);
}

TEST(IndexPermutation, IsABijectionAroundPowersOfTwo) {
  for (int b = 1; b <= 20; ++b) {
    const uint64_t p = uint64_t{1} << b;
    for (uint64_t n : {p - 1, p, p + 1}) expect_bijection(n, 123, 4);
  }
}

TEST(IndexPermutation, SeedsAndStreamsGiveDifferentOrders) {
  const uint64_t n = 1000;
  auto order = [&](uint64_t seed, uint64_t stream) {
    gpt2::IndexPermutation p(n, seed, stream);
    std::vector<uint64_t> o(n);
    for (uint64_t i = 0; i < n; ++i) o[i] = p(i);
    return o;
  };
  const auto base = order(1, 0);
  std::vector<uint64_t> identity(n);
  for (uint64_t i = 0; i < n; ++i) identity[i] = i;
  EXPECT_NE(base, identity);
  EXPECT_NE(base, order(2, 0));
  EXPECT_NE(base, order(1, 1));
  EXPECT_EQ(base, order(1, 0));  // deterministic
  // Shuffled, not shifted: few indices keep their place (a random permutation fixes about one).
  int fixed = 0;
  for (uint64_t i = 0; i < n; ++i) fixed += base[i] == i;
  EXPECT_LT(fixed, 10);
}

TEST(Sampler, EpochsReshuffleAndEachCoversDistinctWindows) {
  const uint64_t windows = 997;
  gpt2::DistributedSampler s(windows, 10, 0, 1, 5);
  const uint64_t spe = s.steps_per_epoch();
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<uint64_t> seen;
    for (uint64_t st = epoch * spe; st < (epoch + 1) * spe; ++st)
      for (uint64_t w : s.global_windows(st)) seen.insert(w);
    EXPECT_EQ(seen.size(), spe * 10) << "epoch " << epoch;
  }
  EXPECT_NE(s.global_windows(0), s.global_windows(spe));
}

TEST(Sampler, ResumeAtAnyStepIsAJump) {
  gpt2::DistributedSampler run(777, 8, 1, 4, 9);
  std::vector<std::vector<uint64_t>> seen;
  for (uint64_t st = 0; st < 300; ++st) seen.push_back(run.rank_windows(st));  // crosses 3 epochs
  for (uint64_t k : {0, 1, 96, 97, 250}) {
    gpt2::DistributedSampler resumed(777, 8, 1, 4, 9);  // a fresh process resuming at step k
    EXPECT_EQ(resumed.rank_windows(k), seen[k]) << "step " << k;
  }
}

TEST(Sampler, WorldSizesOneTwoFourSeeTheSameGlobalOrder) {
  gpt2::DistributedSampler one(1000, 16, 0, 1, 21);
  for (int W : {1, 2, 4})
    for (uint64_t st : {0, 5, 62, 63, 200}) {
      std::vector<uint64_t> joined;
      for (int r = 0; r < W; ++r) {
        auto w = gpt2::DistributedSampler(1000, 16, r, W, 21).rank_windows(st);
        joined.insert(joined.end(), w.begin(), w.end());
      }
      EXPECT_EQ(joined, one.global_windows(st)) << W << " ranks, step " << st;
    }
}

TEST(Sampler, MemoryDoesNotGrowWithTheDataset) {
  // No container inside: the object is a handful of integers whatever the dataset...
  static_assert(sizeof(gpt2::DistributedSampler) <= 64, "the sampler must not store per-window state");
  // ...and a dataset of 2^40 windows (a stored permutation: 8 TiB) works, with windows in range.
  const uint64_t n = uint64_t{1} << 40;
  gpt2::DistributedSampler s(n + 3, 512, 3, 8, 1);
  std::set<uint64_t> seen;
  for (uint64_t st : {uint64_t{0}, uint64_t{123456789}, s.steps_per_epoch() + 1})
    for (uint64_t w : s.rank_windows(st)) {
      EXPECT_LT(w, n + 3);
      seen.insert(w);
    }
  EXPECT_EQ(seen.size(), 3u * 64);
}

// Shards in a temporary directory; token t of shard f is (f * 1000 + t) % vocab.
class ShardDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gpt2_loader_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write_shards(int n, size_t tokens) {
    gpt2::TokenFileWriteOptions o;
    o.vocab_size = 50257;
    for (int f = 0; f < n; ++f) {
      std::vector<uint32_t> t(tokens);
      for (size_t i = 0; i < tokens; ++i) t[i] = static_cast<uint32_t>((f * 1000 + i) % 50257);
      char name[32];
      std::snprintf(name, sizeof(name), "train_%04d.h5", f);
      gpt2::write_token_file((dir_ / name).string(), t, o);
    }
    return (dir_ / "train_*.h5").string();
  }
  fs::path dir_;
};

int g_allocations = 0;
void* counting_allocate(size_t bytes) {
  ++g_allocations;
  return ::operator new(bytes);
}
void counting_release(void* p) { ::operator delete(p); }

TEST_F(ShardDir, LoaderReadsTheSamplersWindowsAndAllocatesOnlyAtStart) {
  gpt2::TokenDataset ds(write_shards(3, 700), 16);
  gpt2::DistributedSampler sampler(ds.num_windows(), 8, 1, 2, 3);
  const uint64_t steps = 3 * sampler.steps_per_epoch() + 2;
  g_allocations = 0;
  gpt2::BatchLoader loader(ds, sampler, steps, {counting_allocate, counting_release});
  EXPECT_EQ(g_allocations, 2);  // the two batches, once
  loader.start(0);
  std::set<const int32_t*> buffers;
  std::vector<int32_t> expect(17);
  for (uint64_t st = 0; st < steps; ++st) {
    const gpt2::RankBatch& b = loader.next();
    ASSERT_EQ(b.step, st);
    ASSERT_EQ(b.seqs, 4);
    buffers.insert(b.tokens.data());
    for (int64_t j = 0; j < b.seqs; ++j) {
      ds.read_window(sampler.rank_window(st, j), expect.data());
      ASSERT_EQ(std::vector<int32_t>(b.tokens.data() + j * 17, b.tokens.data() + (j + 1) * 17), expect)
          << "step " << st << " row " << j;
    }
  }
  EXPECT_EQ(g_allocations, 2) << "a step allocated";
  EXPECT_EQ(buffers.size(), 2u);  // the batches alternate between the two buffers
  // Resume: start(k) gives what the uninterrupted run gave at k.
  const uint64_t k = steps - 3;
  loader.start(k);
  const gpt2::RankBatch& b = loader.next();
  EXPECT_EQ(b.step, k);
  ds.read_window(sampler.rank_window(k, 0), expect.data());
  EXPECT_EQ(std::vector<int32_t>(b.tokens.data(), b.tokens.data() + 17), expect);
}

TEST_F(ShardDir, ChunkCacheIsBoundedWhateverTheShardCount) {
  gpt2::TokenDataset one(write_shards(1, 300), 16);
  EXPECT_EQ(one.chunk_cache_bytes(), gpt2::TokenFile::kDefaultChunkCacheBytes);
  gpt2::TokenDataset many(write_shards(100, 300), 16);
  EXPECT_EQ(many.num_files(), 100u);
  EXPECT_LE(many.chunk_cache_bytes(), gpt2::TokenDataset::kChunkCacheBudgetBytes);
  EXPECT_GT(many.chunk_cache_bytes(), gpt2::TokenDataset::kChunkCacheBudgetBytes / 2);
}

}  // namespace
