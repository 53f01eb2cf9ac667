// Bucketed gradient all-reduce, in the manner of nccl-tests: for each message size, the time of one
// all-reduce (max across ranks), algbw = bytes / time and busbw = algbw * 2(n-1)/n, through the path
// training takes on this machine:
//   GPT2_BENCH_DEVICE=cuda: the CUDA backend's DeviceGradReducer over NCCL, on a device buffer in the
//     training's precision (GPT2_BENCH_DTYPE, default bf16), the buckets launched as backward launches them;
//   GPT2_BENCH_DEVICE=cpu: the CPU backend's BucketScheduler over MPI, on a host buffer of fp32;
//   auto (default): cuda when every rank has a GPU of its own (NCCL cannot share one), else cpu.
// Every result is checked, so a fast but wrong run cannot pass. The JSON's label names the path.
//   mpirun -np 4 build/bin/bench_allreduce --benchmark_out=allreduce.json --benchmark_out_format=json
// GPT2_BENCH_MAX_MB (default 64) caps the largest message; GPT2_BENCH_BUCKET_MB (default 25) sets
// the bucket size in bytes of the elements sent, as --bucket-mb does for training.
// BM_ReduceScatter/<bytes>/<how> times one reduce-scatter of a bucket (ZeRO-1): how 0 is MPI's own
// MPI_Ireduce_scatter_block, 1 is MPI_Iallreduce of the same bytes, 2 is Communicator::ireduce_scatter
// (which is 1, see src/comm/communicator.cpp: Open MPI 4.1's nonblocking reduce-scatter is far slower).
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/communicator.hpp"
#include "comm/bucket_scheduler.hpp"
#include "comm/fail_together.hpp"
#include "comm/mpi_env.hpp"
#include "core/error.hpp"
#ifdef GPT2_HAVE_CUDA
#include <memory>

#include "comm/device_reducer.hpp"
#include "comm/nccl_communicator.hpp"
#include "kernels/common/device.hpp"
#include "kernels/common/device_buffer.hpp"
#endif

namespace {

double env_or(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v ? std::atof(v) : fallback;
}

std::string env_str(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// A wrong result is an error row in the JSON and, at the end, exit status 1 on every rank: a sweep's
// done.json and a GPU phase's step see it, not only a reader of the table.
bool g_wrong = false;
void wrong(benchmark::State& state, const char* what) {
  g_wrong = true;
  state.SkipWithError(what);
}

// Every rank's verdict joined (a wrong result anywhere is an error row), then nccl-tests' figures:
// algbw = bytes / time, busbw = algbw x 2(W-1)/W; the label names the path measured.
void report_allreduce(benchmark::State& state, bool correct, const std::string& path, size_t bytes, int W,
                      size_t buckets) {
  int ok = correct ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) wrong(state, "all-reduce result is wrong");
  state.SetLabel(path);
  state.counters["ranks"] = W;
  state.counters["buckets"] = static_cast<double>(buckets);
  state.counters["algbw_GBps"] =
      benchmark::Counter(static_cast<double>(bytes) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["busbw_GBps"] = benchmark::Counter(
      static_cast<double>(bytes) * state.iterations() / 1e9 * (W > 1 ? 2.0 * (W - 1) / W : 1.0),
      benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

size_t bench_bucket_bytes() { return static_cast<size_t>(env_or("GPT2_BENCH_BUCKET_MB", 25.0) * (1 << 20)); }

void BM_BucketedAllreduce(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / sizeof(float);
  gpt2::MpiCommunicator comm;
  const int W = comm.size(), rank = comm.rank();
  std::vector<float> buf(n);
  gpt2::BucketPlan plan(n, bench_bucket_bytes());
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
  report_allreduce(state, correct, "mpi fp32 host", bytes, W, plan.buckets().size());
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
  if (!ok) wrong(state, "reduce-scatter result is wrong");
  state.counters["ranks"] = W;
  state.SetLabel(how == 0 ? "MPI_Ireduce_scatter_block" : how == 1 ? "MPI_Iallreduce" : how == 2 ? "Communicator" : "Communicator, in place");
}

#ifdef GPT2_HAVE_CUDA
// The average each element must come back as: rank r puts 3 in element i when r is i mod W, 1 when r is
// (i+1) mod W, else 0, so every element sums two unequal contributions (W >= 2) to 4, whatever the order;
// the partial sums are at most 4, exact in bf16 at any W. No rank holds the average 4/W before the
// reduction (at W = 2 each holds 3 or 1 of an average 2), so a bucket lost or reduced over the wrong range
// is off by half or more, and so is a contribution lost or counted twice. The average is rounded once to
// the element type. (At W = 1 an all-reduce changes nothing, and nothing can be checked.)
float pattern_value(size_t i, int rank, int W) {
  const size_t w = static_cast<size_t>(W), r = static_cast<size_t>(rank);
  if (W == 1) return 4.0f;
  return r == i % w ? 3.0f : r == (i + 1) % w ? 1.0f : 0.0f;
}
double pattern_average(int W) { return 4.0 / W; }

// The CUDA path, made once: NCCL's communicator is the expensive part, and every size shares it.
struct DevicePath {
  gpt2::Communicator* host = nullptr;  // main's, NCCL's bootstrap
  std::unique_ptr<gpt2::CudaStream> stream;
  std::unique_ptr<gpt2::NcclCommunicator> nccl;
  bool bf16 = true;
};
DevicePath* g_device = nullptr;

template <class T>
void BM_DeviceAllreduce(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / sizeof(T);
  const int W = g_device->host->size(), rank = g_device->host->rank();
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = pattern_value(i, rank, W);
  gpt2::DeviceBuffer<T> pattern, grads(n);
  pattern.upload(host);
  const cudaStream_t s = g_device->stream->get();
  const gpt2::BucketPlan plan = gpt2::BucketPlan::in_bytes(n, sizeof(T), bench_bucket_bytes());
  gpt2::DeviceGradReducer reducer(*g_device->nccl, plan, grads.data(),
                                  g_device->bf16 ? gpt2::Precision::kBf16 : gpt2::Precision::kFp32, s);
  // One all-reduce: the buffer refilled (not timed), then every bucket launched as backward launches
  // them and finish() waiting for the last, as a training step's end does.
  auto one = [&]() {
    CUDA_CHECK(cudaMemcpyAsync(grads.data(), pattern.data(), n * sizeof(T), cudaMemcpyDeviceToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    reducer.begin_step();
    reducer.on_grads_ready(0);
    reducer.finish();
    double dt = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank's time
    return dt;
  };
  one();  // NCCL connects its peers on the first collective of a size: not part of the figure
  for (auto _ : state) state.SetIterationTime(one());
  const std::vector<float> out = grads.download();
  const double want = pattern_average(W), tol = want * (g_device->bf16 ? 1.0 / 128 : 1e-6);
  size_t bad = std::abs(out[n - 1] - want) > tol ? 1 : 0;  // the last element: the first bucket's end
  for (size_t i = 0; i < n; i += 997) bad += std::abs(out[i] - want) > tol ? 1 : 0;
  report_allreduce(state, bad == 0, std::string("nccl ") + (g_device->bf16 ? "bf16" : "fp32") + " device", bytes, W,
                   plan.buckets().size());
}
#endif

// The path to measure: the device when GPT2_BENCH_DEVICE says cuda, or (auto) when every rank has a GPU of its
// own, the same on every rank; and the device's precision (GPT2_BENCH_DTYPE). A wrong setting is one error
// line for all ranks (fail_together).
struct BenchPath {
  bool device = false, bf16 = true;
};
BenchPath choose_path(gpt2::Communicator& comm, const gpt2::MpiEnv& env) {
  int own_gpu = 0;
  bool want_cpu = false;
  BenchPath path;
  gpt2::fail_together(comm, "GPT2_BENCH_DEVICE", [&] {
    const std::string want = env_str("GPT2_BENCH_DEVICE", "auto"), dtype = env_str("GPT2_BENCH_DTYPE", "bf16");
    GPT2_REQUIRE(want == "auto" || want == "cuda" || want == "cpu",
                 "GPT2_BENCH_DEVICE=" << want << ": use auto, cuda or cpu");
    GPT2_REQUIRE(dtype == "bf16" || dtype == "fp32", "GPT2_BENCH_DTYPE=" << dtype << ": use bf16 or fp32");
    path.bf16 = dtype == "bf16";
    want_cpu = want == "cpu";
    if (want_cpu) return;
#ifdef GPT2_HAVE_CUDA
    std::string why;
    const int gpus = gpt2::gpu_count(&why);
    own_gpu = gpus > 0 && env.local_size() <= gpus ? 1 : 0;
    GPT2_REQUIRE(want != "cuda" || gpus > 0, "GPT2_BENCH_DEVICE=cuda: " << why);
    GPT2_REQUIRE(want != "cuda" || own_gpu, "GPT2_BENCH_DEVICE=cuda: " << env.local_size() << " ranks on this node but "
                                                                        << gpus << " GPU(s): NCCL cannot share a GPU");
#else
    (void)env;
    GPT2_REQUIRE(want != "cuda", "GPT2_BENCH_DEVICE=cuda: this build has no CUDA backend");
#endif
  });
  MPI_Allreduce(MPI_IN_PLACE, &own_gpu, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  path.device = !want_cpu && own_gpu == 1;
  return path;
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
  gpt2::MpiCommunicator control(MPI_COMM_WORLD, 300.0);
  const BenchPath chosen = choose_path(control, env);
  void (*allreduce)(benchmark::State&) = BM_BucketedAllreduce;
#ifdef GPT2_HAVE_CUDA
  std::unique_ptr<DevicePath> path;
  if (chosen.device) {
    gpt2::select_device(env.local_rank(), env.local_size(), gpt2::Comm::kNccl);
    path = std::make_unique<DevicePath>();
    path->host = &control;
    path->stream = std::make_unique<gpt2::CudaStream>();
    path->nccl = std::make_unique<gpt2::NcclCommunicator>(control, 300.0, path->stream->get());
    path->bf16 = chosen.bf16;
    g_device = path.get();
    allreduce = path->bf16 ? BM_DeviceAllreduce<gpt2::bf16> : BM_DeviceAllreduce<float>;
  }
#else
  (void)chosen;
#endif
  // Fixed iteration counts (a function of the size only): every rank must run the same collectives,
  // which Google Benchmark's adaptive iteration count would not guarantee.
  for (size_t bytes = 1024; bytes <= static_cast<size_t>(max_mb * (1 << 20)); bytes *= 4) {
    const int iters = static_cast<int>(std::max<size_t>(5, std::min<size_t>(200, (size_t{256} << 20) / bytes / 4)));
    benchmark::RegisterBenchmark("BM_BucketedAllreduce", allreduce)
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
#ifdef GPT2_HAVE_CUDA
  path.reset();  // NCCL's communicator ends here, on every rank, before MPI does
#endif
  int any_wrong = g_wrong ? 1 : 0;  // every rank found the same (each check ends in an all-reduce)
  MPI_Allreduce(MPI_IN_PLACE, &any_wrong, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_wrong && env.rank() == 0) std::fprintf(stderr, "bench_allreduce: error: a result was wrong (the ERROR rows)\n");
  env.exit_all(any_wrong ? 1 : 0);
}
