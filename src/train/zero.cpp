#include "train/zero.hpp"

#include <memory>

namespace gpt2 {

double sharded_sum_squares(Communicator& comm, const BucketPlan& plan,
                           const std::function<double(size_t, size_t)>& run_ss, const std::string& label) {
  double s = 0.0;
  for (size_t i = 0; i < plan.buckets().size(); ++i) {
    const BucketPlan::Split sp = plan.split(i);
    if (comm.rank() == 0 && sp.replicated.size() > 0) s += run_ss(sp.replicated.begin, sp.replicated.end);
    const FlatRange p = sp.piece(comm.rank());
    if (p.size() > 0) s += run_ss(p.begin, p.end);
  }
  if (comm.size() > 1) comm.allreduce(&s, 1, ReduceOp::kSum, label);
  return s;
}

void gather_pieces(Communicator& comm, const BucketPlan& plan, void* buf, DType dtype, const std::string& what) {
  if (comm.size() == 1) return;
  char* base = static_cast<char*>(buf);
  const size_t eb = dtype_bytes(dtype), n = plan.buckets().size();
  std::vector<std::unique_ptr<CommRequest>> inflight;
  for (size_t i = 0; i < n; ++i) {
    const BucketPlan::Split sp = plan.split(i);
    if (sp.chunk == 0) continue;
    inflight.push_back(comm.iallgather(base + sp.piece(comm.rank()).begin * eb, base + sp.scattered * eb, sp.chunk,
                                       dtype, what + " bucket " + std::to_string(i) + "/" + std::to_string(n)));
  }
  for (auto& r : inflight) r->wait();
}

void gather_moments(Communicator& comm, const BucketPlan& plan, const AdamW& opt, std::vector<float>& m_full,
                    std::vector<float>& v_full) {
  m_full.assign(plan.total(), 0.0f);
  v_full.assign(plan.total(), 0.0f);
  opt.export_moments(m_full.data(), v_full.data());
  gather_pieces(comm, plan, m_full.data(), DType::kF32, "Adam first moments (checkpoint)");
  gather_pieces(comm, plan, v_full.data(), DType::kF32, "Adam second moments (checkpoint)");
}

}  // namespace gpt2
