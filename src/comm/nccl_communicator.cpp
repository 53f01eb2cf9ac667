#include "comm/nccl_communicator.hpp"

#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <thread>

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

// NCCL's communicator is made nonblocking (config.blocking = 0) so that the host never blocks inside NCCL,
// whatever its peers do: a peer that is hung or cannot be reached would otherwise hold this rank forever in
// ncclCommInitRankConfig, or inside a collective's call while NCCL connects its channels on first use. With
// it, any call may return ncclInProgress and finish in the background; until ncclCommGetAsyncError says
// ncclSuccess nothing of it is on the stream yet and no other NCCL call may be made on the communicator
// (NCCL's user guide, "Fault Tolerance"). The Communicator's timed wait covers that wait too.
// The price (NCCL 2.28's source, group.cc): every call outside a group is launched by a thread of its own,
// so each returns ncclInProgress and the host waits for that thread's launch, tens of microseconds a
// gradient bucket, while the GPU runs what is already queued.
class NcclState {
 public:
  NcclState(cudaStream_t producer, double timeout_s) : producer_(producer), timeout_s_(timeout_s) {
    // The highest priority: a bucket's kernels should not queue behind backward's kernels.
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    stream_ = std::make_unique<CudaStream>(greatest);
  }
  // Finalizing (this rank's work flushed, then the peers let go) is nonblocking as well: polled for at most
  // the timeout, after which a communicator that has not settled (a peer gone by now) is aborted instead of
  // holding the exit.
  ~NcclState() {
    if (!comm_) return;
    ncclResult_t state = ncclCommFinalize(comm_);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < until) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      std::fprintf(stderr, "[gpt2] warning: NCCL's communicator did not finalize (%s): aborted it\n",
                   ncclGetErrorString(state));
      ncclCommAbort(comm_);
    }
  }
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  // Starts the initialisation; settled() says when it has finished.
  void start_init(const ncclUniqueId& id, int size, int rank) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    in_progress(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
  }
  // A call's result: true when it goes on in the background (ncclInProgress: settled() must be true before
  // the next call), false when it is done; anything else is an error in the call itself.
  bool in_progress(ncclResult_t rc, const char* call) {
    GPT2_CHECK_GEN(rc == ncclSuccess || rc == ncclInProgress,
                   (msg() << "NCCL: " << call << " failed: " << ncclGetErrorString(rc) << last_error()).str());
    return rc == ncclInProgress;
  }
  // True once the communicator's last call has finished (ncclSuccess); false while it is ncclInProgress.
  // An error aborts the communicator and ends the job with NCCL's reason.
  bool settled(int rank) {
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm(), &async));
    if (async == ncclSuccess) return true;
    if (async == ncclInProgress) return false;
    const std::string why = std::string(ncclGetErrorString(async)) + last_error();
    abort();
    fatal(msg() << "NCCL failed asynchronously on rank " << rank << ": " << why << " (a peer may have died, or "
                << "the ranks cannot reach each other); aborting the job");
  }
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
  // NCCL keeps one last-error text per process, never cleared: it may be older than this error.
  std::string last_error() const {
    const char* e = ncclGetLastError(comm_);
    return e != nullptr && *e ? std::string(" (NCCL's last error message: ") + e + ")" : std::string();
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t producer_;
  double timeout_s_;
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
  // After the collective's call has settled (NcclCommunicator::settle): it is on the stream now.
  void enqueued() { done_.record(state_.stream()); }
  void* device_event() const override { return done_.get(); }

 private:
  bool poll() override {
    const cudaError_t q = cudaEventQuery(done_.get());
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    state_.settled(rank_);  // an asynchronous error (a peer gone) ends the job here
    return false;
  }
  // What the producer enqueues from now on (the optimizer) reads the result.
  void on_complete() override { CUDA_CHECK(cudaStreamWaitEvent(state_.producer(), done_.get(), 0)); }

  NcclState& state_;
  int rank_;
  CudaEvent ready_, done_;
};

// NCCL's initialisation as a request: complete when the communicator has settled.
class InitRequest final : public CommRequest {
 public:
  InitRequest(Communicator& comm, int64_t seq, NcclState& state, int rank)
      : CommRequest(comm, seq), state_(state), rank_(rank) {}

 private:
  bool poll() override { return state_.settled(rank_); }
  NcclState& state_;
  int rank_;
};

// Every rank is at this point once the barrier returns (with the bootstrap's timeout): the MPI calls that
// make this communicator (MPI_Comm_dup) block until every rank makes them.
MPI_Comm all_arrived(Communicator& bootstrap) {
  bootstrap.barrier("nccl setup");
  return bootstrap.group();
}

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, double timeout_s, cudaStream_t producer)
    : Communicator(all_arrived(bootstrap), timeout_s), state_(std::make_unique<NcclState>(producer, timeout_s)) {
  ncclUniqueId id;
  if (rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap.broadcast(&id, sizeof(id), 0, "nccl unique id");
  // A collective of its own: a peer that never joins, or ranks that cannot connect, end the job after the
  // timeout with the usual diagnosis (who did not arrive, or that the transport is stuck) and flight record.
  const int64_t seq = begin_collective("init", "nccl init", 0, msg() << "init nranks=" << size());
  InitRequest init(*this, seq, *state_, rank());
  state_->start_init(id, size(), rank());
  init.wait();
}

NcclCommunicator::~NcclCommunicator() = default;

void NcclCommunicator::abort_backend() { state_->abort(); }

std::string NcclCommunicator::stuck_transport_hint() const {
  return " (NCCL: NCCL_SOCKET_IFNAME must name an interface by which every node reaches the others, and "
         "NCCL_DEBUG=WARN prints NCCL's own reason)";
}

// A call that returned ncclInProgress: NCCL may still be connecting to the peers in the background. Nothing
// of it is on the stream yet, so the request's event waits (timed) until it is.
void NcclCommunicator::settle(int64_t seq) {
  wait_until(seq, [this] { return state_->settled(rank()); });
}

std::unique_ptr<CommRequest> NcclCommunicator::iallreduce(void* buf, size_t n, DType t, ReduceOp op,
                                                          const std::string& label) {
  const int64_t seq =
      begin_collective("allreduce", label, n * dtype_bytes(t),
                       msg() << "allreduce " << dtype_name(t) << " n=" << n << " op=" << reduce_op_name(op));
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  const ncclResult_t rc = ncclAllReduce(buf, buf, n, nccl_type(t), nccl_op(op), state_->comm(), state_->stream());
  if (state_->in_progress(rc, "ncclAllReduce")) settle(seq);
  req->enqueued();
  return req;
}

std::unique_ptr<CommRequest> NcclCommunicator::ireduce_scatter(const void* send, void* recv, size_t n, DType t,
                                                               ReduceOp op, const std::string& label) {
  const int64_t seq =
      begin_collective("reduce_scatter", label, n * dtype_bytes(t) * static_cast<size_t>(size()),
                       msg() << "reduce_scatter " << dtype_name(t) << " n=" << n << " op=" << reduce_op_name(op));
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  const ncclResult_t rc =
      ncclReduceScatter(send, recv, n, nccl_type(t), nccl_op(op), state_->comm(), state_->stream());
  if (state_->in_progress(rc, "ncclReduceScatter")) settle(seq);
  req->enqueued();
  return req;
}

std::unique_ptr<CommRequest> NcclCommunicator::iallgather(const void* send, void* recv, size_t n, DType t,
                                                          const std::string& label) {
  const int64_t seq = begin_collective("allgather", label, n * dtype_bytes(t) * static_cast<size_t>(size()),
                                       msg() << "allgather " << dtype_name(t) << " n=" << n);
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  // In place is allowed.
  const ncclResult_t rc = ncclAllGather(send, recv, n, nccl_type(t), state_->comm(), state_->stream());
  if (state_->in_progress(rc, "ncclAllGather")) settle(seq);
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
  // The group is ended whatever its calls returned: a group left open would swallow every later NCCL call,
  // the abort too.
  NCCL_CHECK(ncclGroupStart());
  ncclResult_t queued = ncclSuccess;
  auto keep = [&queued](ncclResult_t rc) {
    if (queued == ncclSuccess || queued == ncclInProgress) queued = rc;
  };
  if (rank() == root) {
    char* out = static_cast<char*>(recv);
    for (int r = 0; r < size(); ++r) {
      if (r == root) continue;
      keep(ncclRecv(out + static_cast<size_t>(r) * bytes, n, nccl_type(t), r, state_->comm(), state_->stream()));
    }
  } else {
    keep(ncclSend(send, n, nccl_type(t), root, state_->comm(), state_->stream()));
  }
  const ncclResult_t rc = ncclGroupEnd();
  if (state_->in_progress(rc, "ncclGroupEnd")) settle(seq);
  state_->in_progress(queued, rank() == root ? "ncclRecv" : "ncclSend");
  if (rank() == root && send != static_cast<const char*>(recv) + static_cast<size_t>(root) * bytes)
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(recv) + static_cast<size_t>(root) * bytes, send, bytes,
                               cudaMemcpyDeviceToDevice, state_->stream()));
  req->enqueued();
  return req;
}

std::unique_ptr<CommRequest> NcclCommunicator::ibroadcast(void* buf, size_t bytes, int root, const std::string& label) {
  const int64_t seq = begin_collective("broadcast", label, bytes, msg() << "broadcast bytes=" << bytes << " root=" << root);
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  const ncclResult_t rc = ncclBroadcast(buf, buf, bytes, ncclUint8, root, state_->comm(), state_->stream());
  if (state_->in_progress(rc, "ncclBroadcast")) settle(seq);
  req->enqueued();
  return req;
}

// NCCL has no barrier: an all-reduce of one int completes on no rank before every rank has joined it.
std::unique_ptr<CommRequest> NcclCommunicator::ibarrier(const std::string& label) {
  const int64_t seq = begin_collective("barrier", label, 0, "barrier");
  auto req = std::make_unique<NcclRequest>(*this, seq, *state_, rank());
  int* one = state_->scratch();
  const ncclResult_t rc = ncclAllReduce(one, one, 1, ncclInt32, ncclSum, state_->comm(), state_->stream());
  if (state_->in_progress(rc, "ncclAllReduce")) settle(seq);
  req->enqueued();
  return req;
}

}  // namespace gpt2
