#include "comm/bucket_scheduler.hpp"

#include "core/error.hpp"
#include "core/timer.hpp"

namespace gpt2 {

BucketScheduler::BucketScheduler(Communicator& comm, const BucketPlan& plan, void* grads, DType dtype,
                                 BucketMode mode)
    : comm_(comm),
      plan_(plan),
      grads_(static_cast<char*>(grads)),
      dtype_(dtype),
      elem_bytes_(dtype_bytes(dtype)),
      mode_(mode) {
  GPT2_CHECK(mode != BucketMode::kReduceScatter || plan.shards() == comm.size(),
             "a reduce-scatter plan must be cut for " << comm.size() << " ranks (it has " << plan.shards() << ")");
}

void BucketScheduler::begin_step() {
  next_ = 0;
  inflight_.clear();
}

void BucketScheduler::launch(size_t i) {
  const Bucket& b = plan_.buckets()[i];
  const std::string label = "grad bucket " + std::to_string(i) + "/" + std::to_string(plan_.buckets().size());
  if (mode_ == BucketMode::kAllReduce) {
    inflight_.push_back(comm_.iallreduce(grads_ + b.begin * elem_bytes_, b.size(), dtype_, ReduceOp::kAvg, label));
    return;
  }
  const BucketPlan::Split s = plan_.split(i);
  if (s.replicated.size() > 0)
    inflight_.push_back(comm_.iallreduce(grads_ + s.replicated.begin * elem_bytes_, s.replicated.size(), dtype_,
                                         ReduceOp::kAvg, label + " (replicated head)"));
  if (s.chunk > 0)
    inflight_.push_back(comm_.ireduce_scatter(grads_ + s.scattered * elem_bytes_,
                                              grads_ + s.piece(comm_.rank()).begin * elem_bytes_, s.chunk, dtype_,
                                              ReduceOp::kAvg, label));
}

void BucketScheduler::on_grads_ready(size_t ready_from) {
  const auto& buckets = plan_.buckets();
  while (next_ < buckets.size() && buckets[next_].begin >= ready_from) launch(next_++);
  for (auto& r : inflight_) r->test();
}

void BucketScheduler::wait() {
  for (auto& r : inflight_) r->wait();
  inflight_.clear();
}

double BucketScheduler::finish() {
  Timer t;
  on_grads_ready(0);
  wait();
  return t.ms();
}

}  // namespace gpt2
