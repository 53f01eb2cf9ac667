// The distributed sampler (sharding) and the learning-rate schedules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "data/sampler.hpp"
#include "optim/adamw.hpp"
#include "optim/schedule.hpp"

namespace {

TEST(Sampler, RanksAreDisjointAndCompleteUpToTheTail) {
  const uint64_t windows = 1003;  // not a multiple of the global batch: a ragged tail is dropped
  for (int W : {1, 2, 3, 4}) {
    const int G = 12;
    std::vector<gpt2::DistributedSampler> ranks;
    for (int r = 0; r < W; ++r) ranks.emplace_back(windows, G, r, W, 7);
    const uint64_t spe = ranks[0].steps_per_epoch();
    EXPECT_EQ(spe, windows / G);
    std::multiset<uint64_t> seen;
    for (uint64_t s = 0; s < spe; ++s)
      for (int r = 0; r < W; ++r)
        for (uint64_t w : ranks[r].rank_windows(s)) {
          EXPECT_LT(w, windows);
          seen.insert(w);
        }
    EXPECT_EQ(seen.size(), spe * G) << W << " ranks";
    EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), seen.size()) << "a window was seen twice";
  }
}

TEST(Sampler, GlobalBatchesDoNotDependOnWorldSize) {
  gpt2::DistributedSampler one(500, 12, 0, 1, 3);
  for (int W : {2, 3, 4}) {
    for (uint64_t s : {0, 1, 40, 41, 95}) {  // crosses epochs (41 steps per epoch)
      std::vector<uint64_t> joined;
      for (int r = 0; r < W; ++r) {
        gpt2::DistributedSampler rs(500, 12, r, W, 3);
        auto w = rs.rank_windows(s);
        joined.insert(joined.end(), w.begin(), w.end());
      }
      EXPECT_EQ(joined, one.rank_windows(s)) << W << " ranks, step " << s;
    }
  }
}

TEST(Sampler, SameAfterRestartAndNewOrderEachEpoch) {
  gpt2::DistributedSampler a(500, 10, 1, 2, 11);
  std::vector<std::vector<uint64_t>> first;
  for (uint64_t s = 0; s < 120; ++s) first.push_back(a.rank_windows(s));
  gpt2::DistributedSampler restarted(500, 10, 1, 2, 11);  // a restart at step 77 sees what the first run saw
  for (uint64_t s = 77; s < 120; ++s) EXPECT_EQ(restarted.rank_windows(s), first[s]);
  EXPECT_NE(a.global_windows(0), a.global_windows(50));  // epoch 1 is reshuffled
  gpt2::DistributedSampler other_seed(500, 10, 1, 2, 12);
  EXPECT_NE(other_seed.rank_windows(0), first[0]);
}

TEST(Schedule, WarmupCosineLinearConstantWsd) {
  gpt2::LrSchedule s;
  s.lr = 1.0f;
  s.warmup_steps = 10;
  s.max_steps = 110;
  s.min_lr_frac = 0.1f;
  s.kind = gpt2::ScheduleKind::kCosine;
  EXPECT_FLOAT_EQ(s.at(0), 0.1f);
  EXPECT_FLOAT_EQ(s.at(9), 1.0f);
  EXPECT_FLOAT_EQ(s.at(10), 1.0f);
  EXPECT_NEAR(s.at(60), 0.55f, 1e-6);  // halfway: (1 + 0.1) / 2
  EXPECT_NEAR(s.at(110), 0.1f, 1e-6);
  s.kind = gpt2::ScheduleKind::kLinear;
  EXPECT_NEAR(s.at(60), 0.55f, 1e-6);
  EXPECT_NEAR(s.at(35), 1.0f - 0.9f * 0.25f, 1e-6);
  s.kind = gpt2::ScheduleKind::kConstant;
  EXPECT_FLOAT_EQ(s.at(100), 1.0f);
  s.kind = gpt2::ScheduleKind::kWsd;
  s.decay_frac = 0.2f;  // decay over the last 22 steps: from step 88
  EXPECT_FLOAT_EQ(s.at(87), 1.0f);
  EXPECT_NEAR(s.at(99), 1.0f - 0.9f * 0.5f, 1e-6);
  EXPECT_NEAR(s.at(110), 0.1f, 1e-6);
  gpt2::ScheduleKind k;
  EXPECT_TRUE(gpt2::parse_schedule_kind("wsd", &k));
  EXPECT_FALSE(gpt2::parse_schedule_kind("cosinus", &k));
}

TEST(Clip, MatchesTorchClipGradNorm) {
  EXPECT_FLOAT_EQ(gpt2::clip_factor(0.5, 1.0f), 1.0f);
  EXPECT_NEAR(gpt2::clip_factor(4.0, 1.0f), 1.0 / (4.0 + 1e-6), 1e-7);  // returned as float
  EXPECT_FLOAT_EQ(gpt2::clip_factor(100.0, 0.0f), 1.0f);  // 0 disables clipping
}

}  // namespace
