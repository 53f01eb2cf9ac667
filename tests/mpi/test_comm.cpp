// Multi-rank tests of the communication layer, run by ctest under mpiexec with 1, 2, 3 and 4 ranks.
// Exact by construction: gradients are small integers, which fp32 sums without rounding.
#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/communicator.hpp"
#include "comm/bucket_scheduler.hpp"
#include "comm/mpi_env.hpp"
#include "model/params.hpp"
#include "train/verify_data.hpp"

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

float fill_value(size_t i, int rank) { return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 17) - 8); }

// Drives the reducer as backward does: frontiers from the end of the buffer to 0.
void fake_backward(gpt2::BucketScheduler& reducer, const std::vector<size_t>& frontiers) {
  for (size_t f : frontiers) reducer.on_grads_ready(f);
}

std::vector<size_t> frontiers_of(const gpt2::ParamTable& table) {
  std::vector<size_t> f;
  for (int l = table.config().n_layer; l >= 0; --l) f.push_back(table.block_begin(l));
  f.push_back(0);
  return f;
}

TEST(BucketPlan, CoversTheBufferFromItsEnd) {
  for (size_t total : {size_t{1}, size_t{1000}, size_t{262144}, size_t{262145}, size_t{10000019}}) {
    for (size_t mb : {size_t{1}, size_t{4}, size_t{25}}) {
      gpt2::BucketPlan plan(total, mb << 20);
      const auto& b = plan.buckets();
      ASSERT_FALSE(b.empty());
      EXPECT_EQ(b.front().end, total);
      EXPECT_EQ(b.back().begin, 0u);  // the bucket holding wte (offset 0) goes last
      EXPECT_LE(b.front().size(), (size_t{1} << 20) / sizeof(float));
      for (size_t i = 1; i < b.size(); ++i) {
        EXPECT_EQ(b[i].end, b[i - 1].begin);  // contiguous, no gaps or overlaps
        EXPECT_LE(b[i].size(), (mb << 20) / sizeof(float));
        EXPECT_GT(b[i].size(), 0u);
      }
    }
  }
}


// --bucket-mb counts bytes on the wire: a bf16 plan's buckets hold twice the elements of an fp32 one, and
// each is at most bucket_bytes of bf16 (the first, 1 MiB of it).
TEST(BucketPlan, InBytesOfTheElementsSent) {
  const size_t total = 40000003;  // 80 MB of bf16: 1 MiB, three of 25 MiB, then the rest
  const gpt2::BucketPlan fp32 = gpt2::BucketPlan::in_bytes(total, 4, size_t{25} << 20);
  const gpt2::BucketPlan bf16 = gpt2::BucketPlan::in_bytes(total, 2, size_t{25} << 20);
  const gpt2::BucketPlan plain(total, size_t{25} << 20);
  ASSERT_EQ(fp32.buckets().size(), plain.buckets().size());
  for (size_t i = 0; i < fp32.buckets().size(); ++i) EXPECT_EQ(fp32.buckets()[i].begin, plain.buckets()[i].begin);
  ASSERT_GE(bf16.buckets().size(), 2u);
  EXPECT_EQ(bf16.buckets()[0].size() * 2, size_t{1} << 20);   // the first bucket: 1 MiB of bf16
  EXPECT_EQ(bf16.buckets()[1].size() * 2, size_t{25} << 20);  // then 25 MiB of bf16
  EXPECT_EQ(bf16.buckets()[2].size() * 2, size_t{25} << 20);
  EXPECT_EQ(bf16.buckets().size(), 5u);
  EXPECT_EQ(fp32.buckets().size(), 1 + (total * 4 - (size_t{1} << 20) + (size_t{25} << 20) - 1) / (size_t{25} << 20));
}
// ZeRO-1 geometry: every bucket but the last splits evenly over the ranks; over all ranks the owned
// runs cover the buffer, each element once, except the replicated head (< W elements), which all own.
TEST(BucketPlan, ShardsCoverTheBufferOnce) {
  for (int W : {1, 2, 3, 4, 8}) {
    for (size_t total : {size_t{1}, size_t{7}, size_t{1000}, size_t{262147}, size_t{1000003}}) {
      gpt2::BucketPlan plan(total, 65536, 16384, W);
      std::vector<int> owners(total, 0);
      for (int r = 0; r < W; ++r)
        for (const gpt2::FlatRange& run : plan.owned_by(r)) {
          ASSERT_LE(run.end, total);
          for (size_t i = run.begin; i < run.end; ++i) ++owners[i];
        }
      const auto& b = plan.buckets();
      for (size_t i = 0; i + 1 < b.size(); ++i) EXPECT_EQ(b[i].size() % static_cast<size_t>(W), 0u) << "bucket " << i;
      const gpt2::BucketPlan::Split last = plan.split(b.size() - 1);
      EXPECT_LT(last.replicated.size(), static_cast<size_t>(W));
      EXPECT_EQ(last.replicated.begin, 0u);
      size_t bad = 0;
      for (size_t i = 0; i < total; ++i) bad += owners[i] != (i < last.replicated.end ? W : 1);
      EXPECT_EQ(bad, 0u) << W << " ranks, " << total << " elements";
    }
  }
}

class ReducerExact : public ::testing::TestWithParam<size_t> {};

TEST_P(ReducerExact, AveragesSmallIntegersBitForBit) {
  const int rank = world_rank(), W = world_size();
  gpt2::GPT2Config cfg;
  cfg.n_layer = 3;
  cfg.n_head = 2;
  cfg.n_embd = 48;
  cfg.vocab_size = 300;
  cfg.max_seq_len = 40;
  gpt2::ParamTable table(cfg);
  std::vector<float> grads(table.total());
  gpt2::MpiCommunicator comm;
  gpt2::BucketPlan plan(grads.size(), GetParam(), std::min<size_t>(GetParam(), 1 << 20));
  gpt2::BucketScheduler reducer(comm, plan, grads.data(), gpt2::DType::kF32, gpt2::BucketMode::kAllReduce);
  for (int step = 0; step < 2; ++step) {  // the reducer is reusable across steps
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = fill_value(i + step, rank);
    reducer.begin_step();
    fake_backward(reducer, frontiers_of(table));
    reducer.finish();
    const float inv = 1.0f / static_cast<float>(W);
    size_t bad = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      float sum = 0.0f;
      for (int r = 0; r < W; ++r) sum += fill_value(i + step, r);  // exact: small integers
      const float want = sum * inv;
      uint32_t a, b;
      std::memcpy(&a, &grads[i], 4);
      std::memcpy(&b, &want, 4);
      bad += a != b;
    }
    EXPECT_EQ(bad, 0u) << "bucket bytes " << GetParam() << ", " << W << " ranks, step " << step;
  }
}

// --zero 1: each rank's pieces (and the replicated head) hold the exact average; a second step
// reuses the scheduler.
TEST_P(ReducerExact, ReduceScatterGivesEachRankItsPiecesExactly) {
  const int rank = world_rank(), W = world_size();
  gpt2::GPT2Config cfg;
  cfg.n_layer = 3;
  cfg.n_head = 2;
  cfg.n_embd = 48;
  cfg.vocab_size = 300;
  cfg.max_seq_len = 40;
  gpt2::ParamTable table(cfg);
  std::vector<float> grads(table.total());
  gpt2::MpiCommunicator comm;
  gpt2::BucketPlan plan(grads.size(), GetParam(), std::min<size_t>(GetParam(), 1 << 20), W);
  gpt2::BucketScheduler reducer(comm, plan, grads.data(), gpt2::DType::kF32, gpt2::BucketMode::kReduceScatter);
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = fill_value(i + step, rank);
    reducer.begin_step();
    fake_backward(reducer, frontiers_of(table));
    reducer.finish();
    const float inv = 1.0f / static_cast<float>(W);
    size_t bad = 0, checked = 0;
    for (const gpt2::FlatRange& run : plan.owned_by(rank)) {
      for (size_t i = run.begin; i < run.end; ++i, ++checked) {
        float sum = 0.0f;
        for (int r = 0; r < W; ++r) sum += fill_value(i + step, r);
        bad += grads[i] != sum * inv;
      }
    }
    EXPECT_EQ(bad, 0u) << "bucket bytes " << GetParam() << ", " << W << " ranks, step " << step;
    EXPECT_GE(checked, grads.size() / static_cast<size_t>(W));
  }
}

INSTANTIATE_TEST_SUITE_P(BucketSizes, ReducerExact,
                         ::testing::Values(size_t{256}, size_t{4096}, size_t{65536}, size_t{1} << 20,
                                           size_t{25} << 20));

TEST(Communicator, SumAndAverageAreExact) {
  const int rank = world_rank(), W = world_size();
  gpt2::MpiCommunicator comm;
  std::vector<float> x(1001);
  for (size_t i = 0; i < x.size(); ++i) x[i] = fill_value(i, rank);
  comm.allreduce(x.data(), x.size(), gpt2::ReduceOp::kSum);
  for (size_t i = 0; i < x.size(); ++i) {
    float sum = 0.0f;
    for (int r = 0; r < W; ++r) sum += fill_value(i, r);
    ASSERT_EQ(x[i], sum) << i;
  }
  double d = rank + 1;
  comm.allreduce(&d, 1, gpt2::ReduceOp::kAvg);
  EXPECT_DOUBLE_EQ(d, (W + 1) / 2.0);
  int root_value = rank == 0 ? 12345 : -1;
  comm.broadcast(&root_value, sizeof(root_value), 0);
  EXPECT_EQ(root_value, 12345);
}

// Reduce-scatter then all-gather of small integers: exact, and together an all-reduce. The expected
// values are summed here element by element, not by the collective's own formula.
// Gather: every rank's block lands on the root in rank order, copied from a separate buffer or in place
// (the ZeRO-1 checkpoint gathers each bucket's pieces onto the writer); nothing is written elsewhere.
TEST(Communicator, GatherReachesTheRootOnly) {
  const int rank = world_rank(), W = world_size();
  gpt2::MpiCommunicator comm;
  for (int root : {0, W - 1}) {
    for (size_t n : {size_t{1}, size_t{1000}}) {
      std::vector<int> mine(n), all(n * W, -1);
      for (size_t i = 0; i < n; ++i) mine[i] = rank * 1000 + static_cast<int>(i);
      comm.igather(mine.data(), all.data(), n, gpt2::DType::kI32, root, "gather")->wait();
      for (int r = 0; r < W; ++r)
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(all[r * n + i], rank == root ? r * 1000 + static_cast<int>(i) : -1)
              << "root " << root << " n=" << n << " block " << r;
      std::vector<int> in_place(n * W, -1);
      for (size_t i = 0; i < n; ++i) in_place[rank * n + i] = rank * 1000 + static_cast<int>(i);
      comm.igather(in_place.data() + rank * n, in_place.data(), n, gpt2::DType::kI32, root, "gather in place")->wait();
      for (int r = 0; r < W; ++r)
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(in_place[r * n + i], rank == root || r == rank ? r * 1000 + static_cast<int>(i) : -1)
              << "in place, root " << root << " n=" << n << " block " << r;
    }
  }
}

TEST(Communicator, ReduceScatterAndAllGatherAreExact) {
  const int rank = world_rank(), W = world_size();
  gpt2::MpiCommunicator comm;
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}}) {
    std::vector<float> send(n * W), block(n), all(n * W, -99.0f);
    for (size_t i = 0; i < send.size(); ++i) send[i] = fill_value(i, rank);
    comm.ireduce_scatter(send.data(), block.data(), n, gpt2::DType::kF32, gpt2::ReduceOp::kSum, "rs")->wait();
    for (size_t i = 0; i < n; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < W; ++r) sum += fill_value(rank * n + i, r);
      ASSERT_EQ(block[i], sum) << "reduce-scatter n=" << n << " element " << i;
    }
    comm.iallgather(block.data(), all.data(), n, gpt2::DType::kF32, "ag")->wait();
    for (size_t i = 0; i < all.size(); ++i) {
      float sum = 0.0f;
      for (int r = 0; r < W; ++r) sum += fill_value(i, r);
      ASSERT_EQ(all[i], sum) << "all-gather n=" << n << " element " << i;
    }
    // In place: this rank's block already sits in the output (the ZeRO parameter all-gather).
    std::vector<int> ints(n * W, -1);
    for (size_t i = 0; i < n; ++i) ints[rank * n + i] = rank * 1000 + static_cast<int>(i);
    comm.iallgather(ints.data() + rank * n, ints.data(), n, gpt2::DType::kI32, "ag in place")->wait();
    for (int r = 0; r < W; ++r)
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(ints[r * n + i], r * 1000 + static_cast<int>(i)) << "n=" << n;
    // An average is the exact sum scaled by 1/W in fp32, as the gradient buckets do.
    std::vector<float> avg(n);
    comm.ireduce_scatter(send.data(), avg.data(), n, gpt2::DType::kF32, gpt2::ReduceOp::kAvg, "rs avg")->wait();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(avg[i], block[i] * (1.0f / static_cast<float>(W))) << i;
  }
  int mx = rank * 3 - 1, mn = rank * 3 - 1;
  comm.allreduce(&mx, 1, gpt2::ReduceOp::kMax);
  comm.allreduce(&mn, 1, gpt2::ReduceOp::kMin);
  EXPECT_EQ(mx, (W - 1) * 3 - 1);
  EXPECT_EQ(mn, -1);
  comm.barrier();
}

// The flight recorder keeps every collective with its label and size, completed ones with an end time.
TEST(Communicator, FlightRecordListsTheLastCollectives) {
  const int rank = world_rank();
  char dir[] = "/tmp/gpt2_flight_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  gpt2::MpiCommunicator comm;
  comm.set_flight_dir(dir);
  comm.set_step(3);
  float x[5] = {1, 2, 3, 4, 5};
  for (size_t i = 0; i < gpt2::Communicator::kFlightEntries + 10; ++i)
    comm.allreduce(x, 5, gpt2::ReduceOp::kMax, "bucket " + std::to_string(i));
  const std::string path = comm.write_flight_record("test");
  ASSERT_EQ(path, std::string(dir) + "/flight_rank" + std::to_string(rank) + ".json");
  FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string text;
  char buf[4096];
  for (size_t got; (got = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, got);
  std::fclose(f);
  const size_t last = gpt2::Communicator::kFlightEntries + 9;
  EXPECT_NE(text.find("\"label\":\"bucket " + std::to_string(last) + "\",\"bytes\":20"), std::string::npos);
  EXPECT_EQ(text.find("\"label\":\"bucket 9\""), std::string::npos) << "older than the ring: dropped";
  EXPECT_NE(text.find("\"label\":\"bucket 10\""), std::string::npos);
  EXPECT_EQ(text.find("\"end\":null"), std::string::npos) << "every collective completed";
  std::remove(path.c_str());
  rmdir(dir);
}

// Every rank must issue the same collectives in the same order, or the job hangs: record the trace
// of a reducer step on each rank and compare them all with rank 0's.
TEST(Communicator, EveryRankIssuesTheSameCollectivesInTheSameOrder) {
  const int rank = world_rank(), W = world_size();
  gpt2::GPT2Config cfg;
  cfg.n_layer = 4;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.vocab_size = 256;
  cfg.max_seq_len = 64;
  gpt2::ParamTable table(cfg);
  std::vector<float> grads(table.total(), 1.0f);
  gpt2::MpiCommunicator comm;
  gpt2::BucketPlan plan(grads.size(), 16384);
  gpt2::BucketScheduler reducer(comm, plan, grads.data(), gpt2::DType::kF32, gpt2::BucketMode::kAllReduce);
  comm.set_tracing(true);
  for (int step = 0; step < 3; ++step) {
    reducer.begin_step();
    fake_backward(reducer, frontiers_of(table));
    reducer.finish();
  }
  std::string trace;
  for (const auto& line : comm.trace()) trace += line + "\n";
  EXPECT_EQ(comm.trace().size(), 3 * plan.buckets().size());
  // Gather every rank's trace on rank 0 (the comparison itself uses a separate communicator).
  int len = static_cast<int>(trace.size());
  std::vector<int> lens(W);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> displs(W, 0);
  for (int r = 1; r < W; ++r) displs[r] = displs[r - 1] + lens[r - 1];
  std::string all(rank == 0 ? std::accumulate(lens.begin(), lens.end(), 0) : 0, '\0');
  MPI_Gatherv(trace.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    for (int r = 1; r < W; ++r) {
      EXPECT_EQ(all.substr(displs[r], lens[r]), trace) << "rank " << r << " differs";
    }
  }
}

// --verify-data's pieces: each rank reads every W-th piece, and the CRC-32 joined from all of them must be
// each file's whole CRC-32 (gpt2-data's attribute), for uint16 and uint32 files, pieces that do not divide the
// file, a file shorter than a piece, and more ranks than pieces. A wrong join ends the run (fail_together),
// naming the file: the test fails through the exit status.
TEST(VerifyData, PiecesReadByEveryRankJoinToEachFilesCrc32) {
  const int rank = world_rank();
  const std::string dir = "/tmp/gpt2_test_verify_" + std::to_string(getppid());
  if (rank == 0) {
    std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
    // Two uint16 shards, the second shorter than a piece, and one uint32 file.
    for (const char* name : {"shard_0.h5", "shard_1.h5", "wide.h5"}) {
      gpt2::TokenFileWriteOptions o;
      const bool wide = name[0] == 'w', short_one = name[6] == '1';
      o.vocab_size = wide ? 70000 : 50257;
      std::vector<uint32_t> tokens(short_one ? 500 : 100003);
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7919 + name[6]) % o.vocab_size);
      gpt2::write_token_file(dir + "/" + name, tokens, o);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  gpt2::MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  for (const char* pattern : {"/shard_0.h5", "/shard_*.h5", "/wide.h5"}) {
    gpt2::TokenDataset data(dir + pattern, 64);
    for (size_t f = 0; f < data.num_files(); ++f) ASSERT_TRUE(data.file(f).has_crc32()) << data.file(f).path();
    for (const bool each_copy : {false, true})
      for (uint64_t piece : {uint64_t{997}, uint64_t{1} << 20})
        gpt2::verify_token_crcs(comm, data, "test", each_copy, piece);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::system(("rm -rf " + dir).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  gpt2::MpiEnv env(&argc, &argv);
  // Only rank 0 reports; a failure on any rank fails the run through the exit status.
  if (env.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed && env.rank() == 0) std::fprintf(stderr, "a test failed on at least one rank\n");
  env.exit_all(failed);
}
