#include "train/zero.hpp"

#include <algorithm>
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

std::vector<PendingGather> gather_pieces_async(Communicator& comm, const BucketPlan& plan, void* buf, DType dtype,
                                               const std::string& what) {
  std::vector<PendingGather> out;
  if (comm.size() == 1) return out;
  char* base = static_cast<char*>(buf);
  const size_t eb = dtype_bytes(dtype), n = plan.buckets().size();
  std::vector<size_t> order;  // buckets by where they start: backward made them last-layer first
  for (size_t i = 0; i < n; ++i)
    if (plan.split(i).chunk > 0) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return plan.buckets()[a].begin < plan.buckets()[b].begin; });
  for (const size_t i : order) {
    const BucketPlan::Split sp = plan.split(i);
    const FlatRange filled{sp.scattered, sp.scattered + sp.chunk * static_cast<size_t>(comm.size())};
    out.push_back({filled, comm.iallgather(base + sp.piece(comm.rank()).begin * eb, base + sp.scattered * eb,
                                           sp.chunk, dtype,
                                           what + " bucket " + std::to_string(i) + "/" + std::to_string(n))});
  }
  return out;
}

void gather_pieces(Communicator& comm, const BucketPlan& plan, void* buf, DType dtype, const std::string& what) {
  for (PendingGather& g : gather_pieces_async(comm, plan, buf, dtype, what)) g.request->wait();
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
