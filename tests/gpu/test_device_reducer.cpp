// The CUDA backend's bucketed gradient all-reduce, exact by construction (nccl-tests' "verifiable"
// idea): rank r fills element i with (r+1) * k_i, k_i a small integer, so the average k_i * (W+1)/2 is
// exact in fp32 and bf16 for W = 1, 2, 4 and must come back bit for bit, for every bucket size, both
// element types and both transports (NCCL where every rank has its own GPU, MPI host-staged always).
// Run under mpiexec with 1 and 2 ranks; exits 77 ("skipped: no GPU") without a GPU on every rank.
#include <mpi.h>

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
  int failures = 0;
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
