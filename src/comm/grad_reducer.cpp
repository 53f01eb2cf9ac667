#include "comm/grad_reducer.hpp"

#include <string>

#include "core/timer.hpp"

namespace gpt2 {

GradReducer::GradReducer(Communicator& comm, const BucketPlan& plan, float* grads)
    : comm_(comm), plan_(plan), grads_(grads) {}

void GradReducer::begin_step() {
  next_ = 0;
  inflight_.clear();
}

void GradReducer::on_grads_ready(size_t ready_from) {
  const auto& buckets = plan_.buckets();
  while (next_ < buckets.size() && buckets[next_].begin >= ready_from) {
    const Bucket& b = buckets[next_];
    inflight_.push_back(comm_.iallreduce(grads_ + b.begin, b.size(), ReduceOp::kAvg,
                                         "grad bucket " + std::to_string(next_) + "/" + std::to_string(buckets.size())));
    ++next_;
  }
  for (auto& r : inflight_) r->test();
}

double GradReducer::finish() {
  Timer t;
  on_grads_ready(0);
  for (auto& r : inflight_) r->wait();
  inflight_.clear();
  return t.ms();
}

}  // namespace gpt2
