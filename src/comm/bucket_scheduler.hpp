// The one bucket scheduler, for both backends: launches a collective per bucket of the flat gradient
// buffer as soon as backward has made the bucket final, in BucketPlan order (the same on every rank),
// and waits for them at the end of backward. The Communicator decides where the data is (host memory
// for MPI, device memory for NCCL), the scheduler only when and what:
//   kAllReduce       every rank gets the average of every bucket (data parallel, --zero 0);
//   kReduceScatter   rank r gets the average of its piece of every bucket, in place (--zero 1): the
//                    rest of the buffer keeps this rank's own local gradients (BucketPlan::split).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/communicator.hpp"

namespace gpt2 {

enum class BucketMode { kAllReduce, kReduceScatter };

class BucketScheduler {
 public:
  // grads: the flat buffer the plan covers, elements of `dtype`.
  BucketScheduler(Communicator& comm, const BucketPlan& plan, void* grads, DType dtype, BucketMode mode);

  // Call before the backward of the step's last micro-step.
  void begin_step();
  // Backward reports that every gradient at offset >= ready_from is final: launch, in plan order,
  // every bucket that is now complete, and poll the ones in flight so MPI makes progress.
  void on_grads_ready(size_t ready_from);
  // Waits for every launched bucket (each wait has the communicator's timeout).
  void wait();
  // Launches anything left and waits for every bucket. Returns the milliseconds spent here: the
  // communication backward did not hide (comm_exposed_ms) on a host backend.
  double finish();
  BucketMode mode() const { return mode_; }

 private:
  void launch(size_t bucket);

  Communicator& comm_;
  const BucketPlan& plan_;
  char* grads_;
  DType dtype_;
  size_t elem_bytes_;
  BucketMode mode_;
  size_t next_ = 0;  // next bucket to launch, in plan order
  std::vector<std::unique_ptr<CommRequest>> inflight_;
};

}  // namespace gpt2
