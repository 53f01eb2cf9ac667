#include "comm/device_reducer.hpp"

#include <cstring>
#include <string>

#include "comm/mpi_env.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "kernels/common/device.hpp"
#include "kernels/common/cuda_check.cuh"

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

DeviceGradReducer::DeviceGradReducer(Communicator& comm, const BucketPlan& plan, void* grads, Precision dtype,
                                     cudaStream_t compute)
    : comm_(comm),
      on_device_(std::string(comm.backend()) != "mpi"),
      plan_(plan),
      grads_(static_cast<char*>(grads)),
      dtype_(dtype),
      elem_bytes_(dtype == Precision::kBf16 ? sizeof(bf16) : sizeof(float)),
      compute_(compute) {
  compute_done_ = std::make_unique<CudaEvent>(/*timing=*/true);
  comm_done_ = std::make_unique<CudaEvent>(/*timing=*/true);
}

DeviceGradReducer::~DeviceGradReducer() = default;

std::string DeviceGradReducer::label(size_t bucket) const {
  return "grad bucket " + std::to_string(bucket) + "/" + std::to_string(plan_.buckets().size());
}

void DeviceGradReducer::begin_step() {
  next_ = 0;
  inflight_.clear();
}

void DeviceGradReducer::on_grads_ready(size_t ready_from) {
  const auto& buckets = plan_.buckets();
  while (next_ < buckets.size() && buckets[next_].begin >= ready_from) launch(next_++);
}

// NCCL: the communicator records an event on the compute stream (the blocks covering the bucket are
// enqueued) and its stream waits on it, so nothing here blocks the host. MPI: staged in finish().
void DeviceGradReducer::launch(size_t i) {
  if (!on_device_) return;
  const Bucket& b = plan_.buckets()[i];
  inflight_.push_back(comm_.iallreduce(grads_ + b.begin * elem_bytes_, b.size(),
                                       dtype_ == Precision::kBf16 ? DType::kBf16 : DType::kF32, ReduceOp::kAvg,
                                       label(i)));
}

double DeviceGradReducer::finish() {
  on_grads_ready(0);
  if (!on_device_) return finish_mpi();
  compute_done_->record(compute_);
  // Each wait polls with the timeout; on completion the compute stream is made to wait for the bucket,
  // so the optimizer enqueued next runs after the last one.
  for (auto& r : inflight_) r->wait();
  inflight_.clear();
  comm_done_->record(compute_);
  CUDA_CHECK(cudaEventSynchronize(comm_done_->get()));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, compute_done_->get(), comm_done_->get()));
  return ms > 0 ? ms : 0.0;
}

// Host-staged: every bucket goes down to the host as fp32, through the MPI communicator (with its
// timeout), and back up.
double DeviceGradReducer::finish_mpi() {
  CUDA_CHECK(cudaStreamSynchronize(compute_));  // backward done: what follows is all communication
  Timer t;
  std::vector<bf16> tmp;
  for (size_t bi = 0; bi < plan_.buckets().size(); ++bi) {
    const Bucket& b = plan_.buckets()[bi];
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
    comm_.allreduce(host_.data(), n, ReduceOp::kAvg, label(bi));
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
