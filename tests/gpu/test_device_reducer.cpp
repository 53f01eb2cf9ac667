// The CUDA backend's bucketed gradient all-reduce, exact by construction (nccl-tests' "verifiable"
// idea): rank r fills element i with (r+1) * k_i, k_i a small integer, so the average k_i * (W+1)/2 is
// exact in fp32 and bf16 for W = 1, 2, 4 and must come back bit for bit, for every bucket size, both
// element types and both transports (NCCL where every rank has its own GPU, MPI host-staged always).
// Then every collective of the NCCL communicator, the ones the training does not use too (gather, broadcast,
// barrier), each through the nonblocking communicator's wait for a call in progress.
// Run under mpiexec with 1 and 2 ranks; exits 77 ("skipped: no GPU") without a GPU on every rank.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/device_reducer.hpp"
#include "comm/nccl_communicator.hpp"
#include "comm/mpi_env.hpp"
#include "kernels/common/device.hpp"
#include "kernels/common/device_buffer.hpp"
#include "kernels/reduce/reduce_cuda.hpp"

using namespace gpt2;

namespace {

template <class T>
int run_case(Comm kind, size_t bucket_bytes, int rank, int world) {
  const size_t n = 100003;  // not a multiple of any bucket
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
  DeviceBuffer<T> grads;
  grads.upload(host);
  CudaStream stream;
  const BucketPlan plan(n, bucket_bytes);  // sizes in elements of 4 bytes, whatever T is
  const Precision dt = std::is_same_v<T, bf16> ? Precision::kBf16 : Precision::kFp32;
  MpiCommunicator on_host(MPI_COMM_WORLD, /*timeout_s=*/120);
  std::unique_ptr<NcclCommunicator> nccl;
  if (kind == Comm::kNccl) nccl = std::make_unique<NcclCommunicator>(on_host, /*timeout_s=*/120, stream.get());
  Communicator* comm = nccl ? static_cast<Communicator*>(nccl.get()) : &on_host;
  DeviceGradReducer reducer(*comm, plan, grads.data(), dt, stream.get());
  for (int step = 0; step < 2; ++step) {  // twice: the reducer is reused across steps
    if (step == 1) grads.upload(host);
    reducer.begin_step();
    // Backward reports readiness from the end of the buffer towards its start, as the model does.
    for (size_t ready = n; ready > 0;) {
      ready = ready > n / 5 ? ready - n / 5 : 0;
      reducer.on_grads_ready(ready);
    }
    reducer.finish();
    // The compute stream must wait for the last bucket: work enqueued on it now (here, doubling every
    // gradient, as the optimizer would read them) must see the averaged values, never the local ones.
    kernels::scale_cuda<T>(grads.data(), 2.0f, static_cast<long>(n), stream.get());
    CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  }
  const std::vector<float> out = grads.download();
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double want = static_cast<double>(i % 7 + 1) * (world + 1);  // the average, doubled
    const double tol = (world == 3) ? std::fabs(want) * 8e-3 : 0.0;  // 1/3 is inexact: allow rounding
    if (std::fabs(out[i] - want) > tol) ++bad;
  }
  if (rank == 0)
    std::printf("%s  %-4s %-4s buckets of %7zu elements, %zu bucket(s): %zu wrong element(s)\n",
                bad ? "FAIL" : "ok  ",
                kind == Comm::kNccl ? "nccl" : "mpi", std::is_same_v<T, bf16> ? "bf16" : "fp32",
                bucket_bytes / 4, plan.buckets().size(), bad);
  return bad ? 1 : 0;
}

// Each of NcclCommunicator's collectives on device buffers, with small integers in fp32 (exact whatever
// the order of the sums): rank r's element i is r * n + i where each rank sends its own block.
int nccl_collectives(int rank, int world) {
  const size_t n = 1000, all = n * static_cast<size_t>(world);
  const int root = world - 1;  // not rank 0, so a root argument that is ignored shows
  MpiCommunicator on_host(MPI_COMM_WORLD, /*timeout_s=*/120);
  CudaStream stream;
  NcclCommunicator comm(on_host, /*timeout_s=*/120, stream.get());
  std::vector<std::string> wrong;
  auto expect = [&](const char* what, const DeviceBuffer<float>& buf, size_t count, auto want) {
    CUDA_CHECK(cudaStreamSynchronize(stream.get()));  // the request's wait ordered this stream after it
    const std::vector<float> got = buf.download(count);
    for (size_t i = 0; i < count; ++i)
      if (got[i] != static_cast<float>(want(i))) {
        wrong.push_back(std::string(what) + " element " + std::to_string(i) + ": " + std::to_string(got[i]) +
                        ", not " + std::to_string(want(i)));
        return;
      }
  };
  auto mine = [&](size_t i) { return static_cast<double>(rank) * n + i; };
  std::vector<float> h(all);
  const double ranks_sum = world * (world - 1) / 2.0;  // sum of r over the ranks

  DeviceBuffer<float> a;
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>(mine(i));
  a.upload(h.data(), n);
  comm.iallreduce(a.data(), n, DType::kF32, ReduceOp::kSum, "test sum")->wait();
  expect("all-reduce sum", a, n, [&](size_t i) { return ranks_sum * n + world * static_cast<double>(i); });
  a.upload(h.data(), n);
  comm.iallreduce(a.data(), n, DType::kF32, ReduceOp::kMax, "test max")->wait();
  expect("all-reduce max", a, n, [&](size_t i) { return (world - 1.0) * n + i; });

  // reduce-scatter: rank q sends q * n + j at position j of the whole; block r of the sum comes to rank r
  DeviceBuffer<float> whole, block(n);
  for (size_t j = 0; j < all; ++j) h[j] = static_cast<float>(rank * static_cast<double>(n) + j);
  whole.upload(h);
  comm.ireduce_scatter(whole.data(), block.data(), n, DType::kF32, ReduceOp::kSum, "test reduce-scatter")->wait();
  expect("reduce-scatter", block, n,
         [&](size_t i) { return ranks_sum * n + world * (static_cast<double>(rank) * n + i); });

  // all-gather in place: rank r's block r of the output is its input (the other blocks -1 until it arrives)
  std::fill(h.begin(), h.end(), -1.0f);
  for (size_t i = 0; i < n; ++i) h[static_cast<size_t>(rank) * n + i] = static_cast<float>(mine(i));
  whole.upload(h);
  comm.iallgather(whole.data() + static_cast<size_t>(rank) * n, whole.data(), n, DType::kF32, "test all-gather")
      ->wait();
  expect("all-gather (in place)", whole, all, [](size_t j) { return static_cast<double>(j); });

  // gather to root: from a buffer of its own, then in place on the root
  for (int in_place = 0; in_place < 2; ++in_place) {
    DeviceBuffer<float> out(all), own;
    out.zero(stream.get());
    for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>(mine(i));
    own.upload(h.data(), n);
    const float* send = own.data();
    if (in_place && rank == root) {
      std::vector<float> seeded(all, 0.0f);
      for (size_t i = 0; i < n; ++i) seeded[static_cast<size_t>(root) * n + i] = static_cast<float>(mine(i));
      out.upload(seeded);
      send = out.data() + static_cast<size_t>(root) * n;
    }
    comm.igather(send, rank == root ? out.data() : nullptr, n, DType::kF32, root, "test gather")->wait();
    if (rank == root)
      expect(in_place ? "gather (in place on the root)" : "gather", out, all,
             [](size_t j) { return static_cast<double>(j); });
  }

  // broadcast from the root, then a barrier
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>(rank == root ? 7.0 * i : -1.0);
  a.upload(h.data(), n);
  comm.ibroadcast(a.data(), n * sizeof(float), root, "test broadcast")->wait();
  expect("broadcast", a, n, [](size_t i) { return 7.0 * i; });
  comm.barrier("test barrier");

  for (const std::string& w : wrong) std::printf("rank %d: %s\n", rank, w.c_str());
  int bad = static_cast<int>(wrong.size());
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("%s  nccl every collective (all-reduce sum and max, reduce-scatter, all-gather, gather, broadcast, "
                "barrier), %d rank(s)\n", bad ? "FAIL" : "ok  ", world);
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnv env(&argc, &argv);
  std::string why;
  if (gpu_count(&why) == 0) {  // the same answer on every rank of a node
    if (env.rank() == 0) std::printf("skipped: %s\n", why.c_str());
    env.exit_all(77);
  }
  const bool nccl_ok = env.local_size() <= gpu_count();
  select_device(env.local_rank(), env.local_size(), nccl_ok ? Comm::kNccl : Comm::kMpi);
  int failures = nccl_ok ? nccl_collectives(env.rank(), env.world_size()) : 0;
  for (size_t bucket : {size_t{4096}, size_t{65536}, size_t{1} << 20}) {
    if (nccl_ok) {
      failures += run_case<float>(Comm::kNccl, bucket, env.rank(), env.world_size());
      failures += run_case<bf16>(Comm::kNccl, bucket, env.rank(), env.world_size());
    }
    failures += run_case<float>(Comm::kMpi, bucket, env.rank(), env.world_size());
    failures += run_case<bf16>(Comm::kMpi, bucket, env.rank(), env.world_size());
  }
  if (!nccl_ok && env.rank() == 0)
    std::printf("note: %d ranks share %d GPU(s) on this node: NCCL cases need one GPU per rank, skipped\n",
                env.local_size(), gpu_count());
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (env.rank() == 0) std::printf("%d failure(s)\n", failures);
  env.exit_all(failures ? 1 : 0);
}
