#include "comm/communicator.hpp"

#include <climits>

#include "comm/mpi_env.hpp"

namespace gpt2 {

namespace {

const char* op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "avg"; }

int checked_count(size_t n) {
  GPT2_CHECK(n <= static_cast<size_t>(INT_MAX), "collective of " << n << " elements exceeds MPI's int count");
  return static_cast<int>(n);
}

// MPI has no average: sum, then scale by 1/size once the data has arrived.
class MpiRequest : public CommRequest {
 public:
  MpiRequest(float* buf, size_t n, float scale) : buf_(buf), n_(n), scale_(scale) {}
  MPI_Request* handle() { return &req_; }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag) finish();
    return done_;
  }
  void wait() override {
    if (done_) return;
    MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
    finish();
  }

 private:
  void finish() {
    if (scale_ != 1.0f)
      for (size_t i = 0; i < n_; ++i) buf_[i] *= scale_;
    done_ = true;
  }
  MPI_Request req_ = MPI_REQUEST_NULL;
  float* buf_;
  size_t n_;
  float scale_;
  bool done_ = false;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::allreduce(float* buf, size_t n, ReduceOp op) {
  record(std::string("allreduce f32 n=") + std::to_string(n) + " op=" + op_name(op));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, checked_count(n), MPI_FLOAT, MPI_SUM, comm_));
  if (op == ReduceOp::kAvg) {
    const float s = 1.0f / static_cast<float>(size_);
    for (size_t i = 0; i < n; ++i) buf[i] *= s;
  }
}

void MpiCommunicator::allreduce(double* buf, size_t n, ReduceOp op) {
  record(std::string("allreduce f64 n=") + std::to_string(n) + " op=" + op_name(op));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, checked_count(n), MPI_DOUBLE, MPI_SUM, comm_));
  if (op == ReduceOp::kAvg)
    for (size_t i = 0; i < n; ++i) buf[i] /= size_;
}

std::unique_ptr<CommRequest> MpiCommunicator::iallreduce(float* buf, size_t n, ReduceOp op) {
  record(std::string("iallreduce f32 n=") + std::to_string(n) + " op=" + op_name(op));
  const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(size_) : 1.0f;
  auto req = std::make_unique<MpiRequest>(buf, n, scale);
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, checked_count(n), MPI_FLOAT, MPI_SUM, comm_, req->handle()));
  return req;
}

void MpiCommunicator::broadcast(void* buf, size_t bytes, int root) {
  record("broadcast bytes=" + std::to_string(bytes) + " root=" + std::to_string(root));
  MPI_CHECK(MPI_Bcast(buf, checked_count(bytes), MPI_BYTE, root, comm_));
}

void MpiCommunicator::barrier() {
  record("barrier");
  MPI_CHECK(MPI_Barrier(comm_));
}

}  // namespace gpt2
