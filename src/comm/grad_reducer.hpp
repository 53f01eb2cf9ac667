// Averages the flat gradient buffer across ranks, bucket by bucket, while backward is still running.
// Runtime state is only which buckets are launched; the plan itself is immutable.
#pragma once

#include <memory>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/communicator.hpp"

namespace gpt2 {

class GradReducer {
 public:
  GradReducer(Communicator& comm, const BucketPlan& plan, float* grads);

  // Call before the backward of the step's last micro-step.
  void begin_step();
  // Backward reports that every gradient at offset >= ready_from is final: launch, in plan order,
  // every bucket that is now complete, and poll the ones in flight so MPI makes progress.
  void on_grads_ready(size_t ready_from);
  // Launches anything left and waits for every bucket. Returns the milliseconds spent waiting here:
  // the communication that backward did not hide (comm_exposed_ms).
  double finish();

 private:
  Communicator& comm_;
  const BucketPlan& plan_;
  float* grads_;
  size_t next_ = 0;  // next bucket to launch, in plan order
  std::vector<std::unique_ptr<CommRequest>> inflight_;
};

}  // namespace gpt2
