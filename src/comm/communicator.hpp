// Collective communication behind one device-neutral interface. The MPI implementation works on
// host buffers; the NCCL one (CUDA backend) implements the same interface on device buffers.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace gpt2 {

enum class ReduceOp { kSum, kAvg };

// A collective in flight.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual bool test() = 0;  // true once complete (drives progress)
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void allreduce(float* buf, size_t n, ReduceOp op) = 0;  // in place
  virtual void allreduce(double* buf, size_t n, ReduceOp op) = 0;
  virtual std::unique_ptr<CommRequest> iallreduce(float* buf, size_t n, ReduceOp op) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // When on, every collective appends a line ("iallreduce f32 n=... op=avg") to trace(): tests
  // compare the traces of all ranks to prove they issue the same collectives in the same order.
  void set_tracing(bool on) { tracing_ = on; }
  const std::vector<std::string>& trace() const { return trace_; }

 protected:
  void record(const std::string& what) {
    if (tracing_) trace_.push_back(what);
  }

 private:
  bool tracing_ = false;
  std::vector<std::string> trace_;
};

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce(float* buf, size_t n, ReduceOp op) override;
  void allreduce(double* buf, size_t n, ReduceOp op) override;
  std::unique_ptr<CommRequest> iallreduce(float* buf, size_t n, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace gpt2
