// Bucketed gradient all-reduce over MPI, in the manner of nccl-tests: for each message size, the
// time of one all-reduce (max across ranks), algbw = bytes / time and busbw = algbw * 2(n-1)/n.
// Every result is checked (small integers reduce exactly), so a fast but wrong run cannot pass.
//   mpirun -np 4 build/bin/bench_allreduce --benchmark_out=allreduce.json --benchmark_out_format=json
// GPT2_BENCH_MAX_MB (default 64) caps the largest message; GPT2_BENCH_BUCKET_MB (default 25) sets
// the bucket size, as --bucket-mb does for training.
// BM_ReduceScatter/<bytes>/<how> times one reduce-scatter of a bucket (ZeRO-1): how 0 is MPI's own
// MPI_Ireduce_scatter_block, 1 is MPI_Iallreduce of the same bytes, 2 is Communicator::ireduce_scatter
// (which is 1, see src/comm/communicator.cpp: Open MPI 4.1's nonblocking reduce-scatter is far slower).
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/communicator.hpp"
#include "comm/bucket_scheduler.hpp"
#include "comm/mpi_env.hpp"

namespace {

double env_or(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v ? std::atof(v) : fallback;
}

void BM_BucketedAllreduce(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / sizeof(float);
  gpt2::MpiCommunicator comm;
  const int W = comm.size(), rank = comm.rank();
  std::vector<float> buf(n);
  const size_t bucket_bytes = static_cast<size_t>(env_or("GPT2_BENCH_BUCKET_MB", 25.0) * (1 << 20));
  gpt2::BucketPlan plan(n, bucket_bytes);
  gpt2::BucketScheduler reducer(comm, plan, buf.data(), gpt2::DType::kF32, gpt2::BucketMode::kAllReduce);
  bool correct = true;
  for (auto _ : state) {
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>((i + rank) % 7);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    reducer.begin_step();
    reducer.finish();  // launches every bucket in plan order and waits for all
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank's time
    state.SetIterationTime(dt);
    state.PauseTiming();
    for (size_t i = 0; i < n && correct; i += 997) {
      float sum = 0.0f;
      for (int r = 0; r < W; ++r) sum += static_cast<float>((i + r) % 7);
      correct = buf[i] == sum * (1.0f / static_cast<float>(W));
    }
    state.ResumeTiming();
  }
  int ok = correct ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) state.SkipWithError("all-reduce result is wrong");
  state.counters["ranks"] = W;
  state.counters["buckets"] = static_cast<double>(plan.buckets().size());
  state.counters["algbw_GBps"] =
      benchmark::Counter(static_cast<double>(bytes) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["busbw_GBps"] = benchmark::Counter(
      static_cast<double>(bytes) * state.iterations() / 1e9 * (W > 1 ? 2.0 * (W - 1) / W : 1.0),
      benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

void BM_ReduceScatter(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const int how = static_cast<int>(state.range(1));
  gpt2::MpiCommunicator comm;
  const int W = comm.size(), rank = comm.rank();
  const size_t n = bytes / sizeof(float) / static_cast<size_t>(W);  // per rank
  std::vector<float> buf(n * static_cast<size_t>(W)), out(n);
  bool correct = true;
  for (auto _ : state) {
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>((i + rank) % 7);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    MPI_Request req;
    if (how == 0) {
      MPI_Ireduce_scatter_block(buf.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    } else if (how == 1) {
      MPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
      MPI_Wait(&req, MPI_STATUS_IGNORE);
      std::copy(buf.begin() + static_cast<long>(n) * rank, buf.begin() + static_cast<long>(n) * (rank + 1), out.begin());
    } else if (how == 2) {
      comm.ireduce_scatter(buf.data(), out.data(), n, gpt2::DType::kF32, gpt2::ReduceOp::kSum, "bench")->wait();
    } else {  // in place, as ZeRO-1 runs it: recv is this rank's block of the send buffer
      float* block = buf.data() + n * static_cast<size_t>(rank);
      comm.ireduce_scatter(buf.data(), block, n, gpt2::DType::kF32, gpt2::ReduceOp::kSum, "bench")->wait();
      std::copy(block, block + n, out.begin());
    }
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    state.SetIterationTime(dt);
    for (size_t i = 0; i < n && correct; i += 997) {
      float sum = 0.0f;
      for (int r = 0; r < W; ++r) sum += static_cast<float>((n * static_cast<size_t>(rank) + i + r) % 7);
      correct = out[i] == sum;
    }
  }
  int ok = correct ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) state.SkipWithError("reduce-scatter result is wrong");
  state.counters["ranks"] = W;
  state.SetLabel(how == 0 ? "MPI_Ireduce_scatter_block" : how == 1 ? "MPI_Iallreduce" : how == 2 ? "Communicator" : "Communicator, in place");
}

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  gpt2::MpiEnv env(&argc, &argv);
  const double max_mb = env_or("GPT2_BENCH_MAX_MB", 64.0);
  // Fixed iteration counts (a function of the size only): every rank must run the same collectives,
  // which Google Benchmark's adaptive iteration count would not guarantee.
  for (size_t bytes = 1024; bytes <= static_cast<size_t>(max_mb * (1 << 20)); bytes *= 4) {
    const int iters = static_cast<int>(std::max<size_t>(5, std::min<size_t>(200, (size_t{256} << 20) / bytes / 4)));
    benchmark::RegisterBenchmark("BM_BucketedAllreduce", BM_BucketedAllreduce)
        ->Arg(static_cast<int64_t>(bytes))
        ->Iterations(iters)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (size_t mb : {size_t{1}, size_t{25}})
    for (int how : {0, 1, 2, 3})
      benchmark::RegisterBenchmark("BM_ReduceScatter", BM_ReduceScatter)
          ->Args({static_cast<int64_t>(mb << 20), how})
          ->Iterations(10)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
  // Only rank 0 writes --benchmark_out: the other ranks drop the flag.
  if (env.rank() != 0) {
    int kept = 1;
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]).rfind("--benchmark_out", 0) != 0) argv[kept++] = argv[i];
    argc = kept;
  }
  benchmark::Initialize(&argc, argv);
  if (env.rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    // The other ranks run the same collectives and report nothing.
    NullReporter display;
    benchmark::RunSpecifiedBenchmarks(&display);
  }
  env.exit_all(0);
}
