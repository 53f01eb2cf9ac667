#include "comm/device_reducer.hpp"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "comm/mpi_env.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "kernels/common/device.hpp"
#include "kernels/common/cuda_check.cuh"

#define NCCL_CHECK(call)                                                                       \
  do {                                                                                         \
    ncclResult_t gpt2_nccl_rc_ = (call);                                                       \
    GPT2_CHECK_GEN(gpt2_nccl_rc_ == ncclSuccess,                                               \
                   (::gpt2::msg() << "NCCL: " #call " failed: " << ncclGetErrorString(gpt2_nccl_rc_)).str()); \
  } while (0)

namespace gpt2 {

DeviceComm parse_device_comm(const std::string& name) {
  if (name == "nccl") return DeviceComm::kNccl;
  if (name == "mpi") return DeviceComm::kMpi;
  fatal("--comm must be nccl or mpi (got '" + name + "')");
}

int select_device(int local_rank, int local_size, DeviceComm comm) {
  std::string why;
  const int n = gpu_count(&why);
  GPT2_REQUIRE(n > 0, "--device cuda: " << why << "; use --device cpu");
  GPT2_REQUIRE(comm == DeviceComm::kMpi || local_size <= n,
               local_size << " ranks on this node but only " << n << " GPU(s) visible: NCCL cannot share a GPU "
                          << "between ranks. Run one rank per GPU, or use --comm mpi to let ranks share GPUs.");
  const int device = local_rank % n;
  CUDA_CHECK(cudaSetDevice(device));
  set_error_context_device(device);
  return device;
}

// The NCCL communicator, created from an ncclUniqueId that rank 0 broadcasts over MPI.
class NcclComm {
 public:
  explicit NcclComm(MPI_Comm world) {
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(world, &rank));
    MPI_CHECK(MPI_Comm_size(world, &size));
    ncclUniqueId id;
    if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, world));
    NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
  }
  ~NcclComm() {
    if (comm_) ncclCommDestroy(comm_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return comm_; }
  // After a timeout or an asynchronous error: tear down without waiting for the peers.
  void abort() {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  ncclComm_t comm_ = nullptr;
};

DeviceGradReducer::DeviceGradReducer(DeviceComm kind, const BucketPlan& plan, void* grads, Precision dtype,
                                     cudaStream_t compute, double timeout_s, MPI_Comm world)
    : kind_(kind),
      plan_(plan),
      grads_(static_cast<char*>(grads)),
      dtype_(dtype),
      elem_bytes_(dtype == Precision::kBf16 ? sizeof(bf16) : sizeof(float)),
      compute_(compute),
      timeout_s_(timeout_s),
      world_(world) {
  MPI_CHECK(MPI_Comm_rank(world, &rank_));
  MPI_CHECK(MPI_Comm_size(world, &size_));
  // The highest priority: a bucket's all-reduce kernels should not queue behind backward's kernels.
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  comm_stream_ = std::make_unique<CudaStream>(greatest);
  for (size_t i = 0; i < plan.buckets().size(); ++i) ready_.push_back(std::make_unique<CudaEvent>());
  compute_done_ = std::make_unique<CudaEvent>(/*timing=*/true);
  comm_done_ = std::make_unique<CudaEvent>(/*timing=*/true);
  if (kind_ == DeviceComm::kNccl) nccl_ = std::make_unique<NcclComm>(world);
}

DeviceGradReducer::~DeviceGradReducer() = default;

void DeviceGradReducer::begin_step() { next_ = 0; }

void DeviceGradReducer::on_grads_ready(size_t ready_from) {
  const auto& buckets = plan_.buckets();
  while (next_ < buckets.size() && buckets[next_].begin >= ready_from) launch(next_++);
}

void DeviceGradReducer::launch(size_t i) {
  ready_[i]->record(compute_);
  if (kind_ != DeviceComm::kNccl) return;  // MPI: staged in finish()
  const Bucket& b = plan_.buckets()[i];
  CUDA_CHECK(cudaStreamWaitEvent(comm_stream_->get(), ready_[i]->get(), 0));
  void* p = grads_ + b.begin * elem_bytes_;
  // ncclAvg on floating point scales each contribution by 1/W before summing (exact for W a power of
  // two); the MPI path sums and then scales. Both are averages; their last bits may differ for other W.
  NCCL_CHECK(ncclAllReduce(p, p, b.size(), dtype_ == Precision::kBf16 ? ncclBfloat16 : ncclFloat, ncclAvg,
                           nccl_->get(), comm_stream_->get()));
}

double DeviceGradReducer::finish() {
  on_grads_ready(0);
  if (kind_ == DeviceComm::kMpi) return finish_mpi();
  compute_done_->record(compute_);
  comm_done_->record(comm_stream_->get());
  CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_done_->get(), 0));  // the optimizer runs after the last bucket
  wait_with_timeout(comm_done_->get());
  CUDA_CHECK(cudaEventSynchronize(compute_done_->get()));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, compute_done_->get(), comm_done_->get()));
  return ms > 0 ? ms : 0.0;
}

// nccl-tests' testStreamSynchronize: poll the event and the communicator's asynchronous error; a
// collective that cannot finish (a dead or hung peer) ends the job after the timeout, naming this rank.
void DeviceGradReducer::wait_with_timeout(cudaEvent_t done) {
  const auto start = std::chrono::steady_clock::now();
  for (long spins = 0;; ++spins) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(nccl_->get(), &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      nccl_->abort();
      fatal(msg() << "NCCL all-reduce failed asynchronously on rank " << rank_ << ": " << ncclGetErrorString(async)
                  << " (a peer may have died); aborting the job");
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s_) {
      nccl_->abort();
      fatal(msg() << "rank " << rank_ << ": the gradient all-reduce did not complete within --comm-timeout-s "
                  << timeout_s_ << " s: a peer is lost or hung; aborting the job");
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));  // stop burning a core
  }
}

// Host-staged: every bucket goes down to the host as fp32, through MPI_Allreduce, and back up.
double DeviceGradReducer::finish_mpi() {
  CUDA_CHECK(cudaStreamSynchronize(compute_));  // backward done: what follows is all communication
  Timer t;
  std::vector<bf16> tmp;
  for (const Bucket& b : plan_.buckets()) {
    const size_t n = b.size();
    host_.resize(n);
    void* dev = grads_ + b.begin * elem_bytes_;
    if (dtype_ == Precision::kBf16) {
      tmp.resize(n);
      CUDA_CHECK(cudaMemcpy(tmp.data(), dev, n * sizeof(bf16), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) host_[i] = to_float_host(tmp[i]);
    } else {
      CUDA_CHECK(cudaMemcpy(host_.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    }
    GPT2_CHECK(n <= static_cast<size_t>(INT32_MAX), "bucket of " << n << " elements");
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, host_.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, world_));
    const float scale = 1.0f / static_cast<float>(size_);
    for (size_t i = 0; i < n; ++i) host_[i] *= scale;
    if (dtype_ == Precision::kBf16) {
      for (size_t i = 0; i < n; ++i) tmp[i] = from_float_host<bf16>(host_[i]);
      CUDA_CHECK(cudaMemcpy(dev, tmp.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
    } else {
      CUDA_CHECK(cudaMemcpy(dev, host_.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    }
  }
  // A copy from pageable memory may return before its DMA lands, and the legacy stream it ran on does
  // not order the (non-blocking) compute stream: wait for it before the optimizer reads the gradients.
  CUDA_CHECK(cudaDeviceSynchronize());
  return t.ms();
}

}  // namespace gpt2
