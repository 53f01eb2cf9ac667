// The Communicator on device buffers (CUDA builds): NCCL, created from an ncclUniqueId that rank 0
// broadcasts over MPI. Stream ordering, as the gradient buckets need it without a host synchronisation:
// each collective runs on a high-priority communication stream after an event recorded on the producer
// stream at the call (the data is complete once the work enqueued so far has run); when the host sees it
// complete, the producer stream is made to wait for it, so what is enqueued next reads the result.
// Waiting polls the event and ncclCommGetAsyncError (nccl-tests' testStreamSynchronize); on a timeout or an
// asynchronous error the NCCL communicator is aborted and the job ends with the Communicator's message.
// The host never blocks inside NCCL (a nonblocking NCCL communicator): its initialisation is a collective
// with the timeout like any other, and so is the background work of a call that returns ncclInProgress.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <memory>

#include "comm/communicator.hpp"

namespace gpt2 {

class NcclState;  // keeps nccl.h out of this header

class NcclCommunicator final : public Communicator {
 public:
  // Call after cudaSetDevice, on every rank of bootstrap. bootstrap: a host communicator over the same ranks
  // (the trainer's MPI one): the ranks meet on it and rank 0's ncclUniqueId travels on it, with its timeout.
  // producer: the stream whose work writes the buffers handed to collectives.
  NcclCommunicator(Communicator& bootstrap, double timeout_s, cudaStream_t producer);
  ~NcclCommunicator() override;
  const char* backend() const override { return "nccl"; }

  using Communicator::iallreduce;
  std::unique_ptr<CommRequest> iallreduce(void* buf, size_t n, DType t, ReduceOp op,
                                          const std::string& label) override;
  std::unique_ptr<CommRequest> ireduce_scatter(const void* send, void* recv, size_t n, DType t, ReduceOp op,
                                               const std::string& label) override;
  std::unique_ptr<CommRequest> iallgather(const void* send, void* recv, size_t n, DType t,
                                          const std::string& label) override;
  std::unique_ptr<CommRequest> igather(const void* send, void* recv, size_t n, DType t, int root,
                                       const std::string& label) override;
  std::unique_ptr<CommRequest> ibroadcast(void* buf, size_t bytes, int root, const std::string& label) override;
  std::unique_ptr<CommRequest> ibarrier(const std::string& label) override;

 protected:
  void abort_backend() override;
  std::string stuck_transport_hint() const override;

 private:
  void settle(int64_t seq);
  std::unique_ptr<NcclState> state_;
};

}  // namespace gpt2
