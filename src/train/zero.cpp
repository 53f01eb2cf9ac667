#include "train/zero.hpp"

#include <algorithm>
#include <memory>

#include "core/error.hpp"

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

void gather_moments(Communicator& comm, const BucketPlan& plan, const AdamW& opt, int root,
                    std::vector<float>& m_full, std::vector<float>& v_full) {
  const bool is_root = comm.rank() == root;
  m_full.clear();
  v_full.clear();
  if (is_root) {
    m_full.assign(plan.total(), 0.0f);
    v_full.assign(plan.total(), 0.0f);
    opt.export_moments(m_full.data(), v_full.data());
  }
  if (comm.size() == 1) return;
  // Where a flat index of this rank's runs sits in its compact moment buffers (the runs concatenated).
  const std::vector<FlatRange>& runs = opt.owned();
  auto local = [&](size_t flat) {
    size_t before = 0;
    for (const FlatRange& r : runs) {
      if (flat >= r.begin && flat < r.end) return before + (flat - r.begin);
      before += r.size();
    }
    fatal(msg() << "gather_moments: element " << flat << " is not in this rank's runs");
  };
  const size_t n = plan.buckets().size();
  std::vector<std::unique_ptr<CommRequest>> inflight;
  for (size_t i = 0; i < n; ++i) {
    const BucketPlan::Split sp = plan.split(i);
    if (sp.chunk == 0) continue;
    const size_t mine = sp.piece(comm.rank()).begin;
    const std::string where = " bucket " + std::to_string(i) + "/" + std::to_string(n);
    for (int k = 0; k < 2; ++k) {  // first moments, then second
      std::vector<float>& full = k == 0 ? m_full : v_full;
      const float* compact = (k == 0 ? opt.m() : opt.v()).data();
      float* recv = is_root ? full.data() + sp.scattered : nullptr;
      const float* send = is_root ? full.data() + mine : compact + local(mine);
      inflight.push_back(comm.igather(send, recv, sp.chunk, DType::kF32, root,
                                      std::string(k == 0 ? "Adam first" : "Adam second") + " moments (checkpoint)" +
                                          where));
    }
  }
  for (auto& r : inflight) r->wait();
}

}  // namespace gpt2
