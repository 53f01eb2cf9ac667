#include "comm/device_reducer.hpp"

#include <cstring>
#include <string>

#include "comm/mpi_env.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "kernels/common/device.hpp"
#include "kernels/common/cuda_check.cuh"

namespace gpt2 {

int select_device(int local_rank, int local_size, Comm comm) {
  std::string why;
  const int n = gpu_count(&why);
  GPT2_REQUIRE(n > 0, "--device cuda: " << why << "; use --device cpu");
  GPT2_REQUIRE(comm == Comm::kMpi || local_size <= n,
               local_size << " ranks on this node but only " << n << " GPU(s) visible: NCCL cannot share a GPU "
                          << "between ranks. Run one rank per GPU, or use --comm mpi to let ranks share GPUs.");
  const int device = local_rank % n;
  CUDA_CHECK(cudaSetDevice(device));
  set_error_context_device(device);
  return device;
}

namespace {
bool is_host_comm(const Communicator& c) { return std::string(c.backend()) == "mpi"; }
}  // namespace

DeviceGradReducer::DeviceGradReducer(Communicator& comm, const BucketPlan& plan, void* grads, Precision dtype,
                                     cudaStream_t compute, BucketMode mode)
    : comm_(comm),
      on_device_(!is_host_comm(comm)),
      plan_(plan),
      grads_(grads),
      dtype_(dtype),
      compute_(compute),
      host_(on_device_ ? 0 : plan.total()),
      scheduler_(comm, plan, on_device_ ? grads : static_cast<void*>(host_.data()),
                 on_device_ ? (dtype == Precision::kBf16 ? DType::kBf16 : DType::kF32) : DType::kF32,
                 mode) {
  GPT2_REQUIRE(on_device_ || mode == BucketMode::kAllReduce,
               "--zero 1 on GPUs needs --comm nccl (the host-staged --comm mpi path all-reduces)");
  compute_done_ = std::make_unique<CudaEvent>(/*timing=*/true);
  comm_done_ = std::make_unique<CudaEvent>(/*timing=*/true);
}

DeviceGradReducer::~DeviceGradReducer() = default;

void DeviceGradReducer::begin_step() { scheduler_.begin_step(); }

// NCCL: the communicator records an event on the compute stream (the blocks covering the bucket are
// enqueued) and its stream waits on it, so nothing here blocks the host. MPI: staged in finish().
void DeviceGradReducer::on_grads_ready(size_t ready_from) {
  if (on_device_) scheduler_.on_grads_ready(ready_from);
}

double DeviceGradReducer::finish() {
  if (!on_device_) return finish_mpi();
  scheduler_.on_grads_ready(0);
  compute_done_->record(compute_);
  // Each wait polls with the timeout; on completion the compute stream is made to wait for the bucket,
  // so the optimizer enqueued next runs after the last one.
  scheduler_.wait();
  comm_done_->record(compute_);
  CUDA_CHECK(cudaEventSynchronize(comm_done_->get()));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, compute_done_->get(), comm_done_->get()));
  return ms > 0 ? ms : 0.0;
}

// Host-staged: the buffer goes down to the host as fp32, the scheduler averages it bucket by bucket
// through the MPI communicator (with its timeout), and it goes back up.
double DeviceGradReducer::finish_mpi() {
  CUDA_CHECK(cudaStreamSynchronize(compute_));  // backward done: what follows is all communication
  Timer t;
  const size_t n = plan_.total();
  std::vector<bf16> tmp;
  if (dtype_ == Precision::kBf16) {
    tmp.resize(n);
    CUDA_CHECK(cudaMemcpy(tmp.data(), grads_, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) host_[i] = to_float_host(tmp[i]);
  } else {
    CUDA_CHECK(cudaMemcpy(host_.data(), grads_, n * sizeof(float), cudaMemcpyDeviceToHost));
  }
  scheduler_.finish();
  if (dtype_ == Precision::kBf16) {
    for (size_t i = 0; i < n; ++i) tmp[i] = from_float_host<bf16>(host_[i]);
    CUDA_CHECK(cudaMemcpy(grads_, tmp.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  } else {
    CUDA_CHECK(cudaMemcpy(grads_, host_.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  // A copy from pageable memory may return before its DMA lands, and the legacy stream it ran on does
  // not order the (non-blocking) compute stream: wait for it before the optimizer reads the gradients.
  CUDA_CHECK(cudaDeviceSynchronize());
  return t.ms();
}

}  // namespace gpt2
