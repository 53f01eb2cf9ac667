#include "comm/nccl_communicator.hpp"

#include <nccl.h>

#include "comm/mpi_env.hpp"
#include "core/error.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"

#define NCCL_CHECK(call)                                                                       \
  do {                                                                                         \
    ncclResult_t gpt2_nccl_rc_ = (call);                                                       \
    GPT2_CHECK_GEN(gpt2_nccl_rc_ == ncclSuccess,                                               \
                   (::gpt2::msg() << "NCCL: " #call " failed: " << ncclGetErrorString(gpt2_nccl_rc_)).str()); \
  } while (0)

namespace gpt2 {

class NcclState {
 public:
  NcclState(MPI_Comm control, cudaStream_t producer) : producer_(producer) {
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(control, &rank));
    MPI_CHECK(MPI_Comm_size(control, &size));
    ncclUniqueId id;
    if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, control));
    NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
    // The highest priority: a bucket's kernels should not queue behind backward's kernels.
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    stream_ = std::make_unique<CudaStream>(greatest);
  }
  ~NcclState() {
    if (comm_) ncclCommDestroy(comm_);
  }
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  // Tear down without waiting for the peers (after a timeout or an asynchronous error).
  void abort() {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  ncclComm_t comm() const {
    GPT2_CHECK(comm_ != nullptr, "the NCCL communicator was aborted");
    return comm_;
  }
  cudaStream_t stream() const { return stream_->get(); }
  cudaStream_t producer() const { return producer_; }
  int* scratch() {  // one int for the barrier
    if (!scratch_) scratch_ = std::make_unique<DeviceBuffer<int>>(1);
    return scratch_->data();
  }

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t producer_;
  std::unique_ptr<CudaStream> stream_;
  std::unique_ptr<DeviceBuffer<int>> scratch_;
};

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat;
    case DType::kBf16: return ncclBfloat16;
    case DType::kF64: return ncclDouble;
    case DType::kI32: return ncclInt32;
  }
  return ncclFloat;
}

// ncclAvg on floating point scales each contribution by 1/W before summing (exact for W a power of two);
// the MPI communicator sums and then scales. Both are averages; their last bits may differ for other W.
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

class NcclRequest final : public CommRequest {
 public:
  NcclRequest(Communicator& comm, int64_t seq, NcclState& state, int rank)
      : CommRequest(comm, seq), state_(state), rank_(rank) {
    // The collective may start once the producer's work enqueued so far has run.
    ready_.record(state_.producer());
    CUDA_CHECK(cudaStreamWaitEvent(state_.stream(), ready_.get(), 0));
  }
  void enqueued() { done_.record(state_.stream()); }
  void* device_event() const override { return done_.get(); }

 private:
  bool poll() override {
    const cudaError_t q = cudaEventQuery(done_.get());
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(state_.comm(), &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      state_.abort();
      fatal(msg() << "NCCL collective failed asynchronously on rank " << rank_ << ": " << ncclGetErrorString(async)
                  << " (a peer may have died); aborting the job");
    }
    return false;
  }
  // What the producer enqueues from now on (the optimizer) reads the result.
  void on_complete() override { CUDA_CHECK(cudaStreamWaitEvent(state_.producer(), done_.get(), 0)); }

  NcclState& state_;
  int rank_;
  CudaEvent ready_, done_;
};

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm control, double timeout_s, cudaStream_t producer)
    : Communicator(control, timeout_s), state_(std::make_unique<NcclState>(control, producer)) {}

NcclCommunicator::~NcclCommunicator() = default;

void NcclCommunicator::abort_backend() { state_->abort(); }

std::unique_ptr<CommRequest> NcclCommunicator::iallreduce(void* buf, size_t n, DType t, ReduceOp op,
                                                          const std::string& label) {
  const int64_t seq =
      begin_collective("allreduce", label, n * dtype_bytes(t),
                       msg() << "allreduce " << dtype_name(t) << " n=" << n << " op=" << reduce_op_name(op));
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  NCCL_CHECK(ncclAllReduce(buf, buf, n, nccl_type(t), nccl_op(op), state_->comm(), state_->stream()));
  req->enqueued();
  return req;
}

std::unique_ptr<CommRequest> NcclCommunicator::ireduce_scatter(const void* send, void* recv, size_t n, DType t,
                                                               ReduceOp op, const std::string& label) {
  const int64_t seq =
      begin_collective("reduce_scatter", label, n * dtype_bytes(t) * static_cast<size_t>(size()),
                       msg() << "reduce_scatter " << dtype_name(t) << " n=" << n << " op=" << reduce_op_name(op));
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  NCCL_CHECK(ncclReduceScatter(send, recv, n, nccl_type(t), nccl_op(op), state_->comm(), state_->stream()));
  req->enqueued();
  return req;
}

std::unique_ptr<CommRequest> NcclCommunicator::iallgather(const void* send, void* recv, size_t n, DType t,
                                                          const std::string& label) {
  const int64_t seq = begin_collective("allgather", label, n * dtype_bytes(t) * static_cast<size_t>(size()),
                                       msg() << "allgather " << dtype_name(t) << " n=" << n);
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  NCCL_CHECK(ncclAllGather(send, recv, n, nccl_type(t), state_->comm(), state_->stream()));  // in place allowed
  req->enqueued();
  return req;
}

// NCCL has no gather: root receives every rank's block by point-to-point in one group (its own block
// copied on the device unless in place).
std::unique_ptr<CommRequest> NcclCommunicator::igather(const void* send, void* recv, size_t n, DType t, int root,
                                                       const std::string& label) {
  const size_t bytes = n * dtype_bytes(t);
  const int64_t seq = begin_collective("gather", label, bytes * static_cast<size_t>(size()),
                                       msg() << "gather " << dtype_name(t) << " n=" << n << " root=" << root);
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  NCCL_CHECK(ncclGroupStart());
  if (rank() == root) {
    char* out = static_cast<char*>(recv);
    for (int r = 0; r < size(); ++r) {
      if (r == root) continue;
      NCCL_CHECK(ncclRecv(out + static_cast<size_t>(r) * bytes, n, nccl_type(t), r, state_->comm(), state_->stream()));
    }
  } else {
    NCCL_CHECK(ncclSend(send, n, nccl_type(t), root, state_->comm(), state_->stream()));
  }
  NCCL_CHECK(ncclGroupEnd());
  if (rank() == root && send != static_cast<const char*>(recv) + static_cast<size_t>(root) * bytes)
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(recv) + static_cast<size_t>(root) * bytes, send, bytes,
                               cudaMemcpyDeviceToDevice, state_->stream()));
  req->enqueued();
  return req;
}

std::unique_ptr<CommRequest> NcclCommunicator::ibroadcast(void* buf, size_t bytes, int root, const std::string& label) {
  const int64_t seq = begin_collective("broadcast", label, bytes, msg() << "broadcast bytes=" << bytes << " root=" << root);
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, state_->comm(), state_->stream()));
  req->enqueued();
  return req;
}

// NCCL has no barrier: an all-reduce of one int completes on no rank before every rank has joined it.
std::unique_ptr<CommRequest> NcclCommunicator::ibarrier(const std::string& label) {
  const int64_t seq = begin_collective("barrier", label, 0, "barrier");
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  int* one = state_->scratch();
  NCCL_CHECK(ncclAllReduce(one, one, 1, ncclInt32, ncclSum, state_->comm(), state_->stream()));
  req->enqueued();
  return req;
}

}  // namespace gpt2
