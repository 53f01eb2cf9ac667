// ZeRO-1's collectives, the same for both backends (the Communicator decides where the data is: host
// buffers for MPI, device buffers for NCCL). The geometry is BucketPlan's: rank r owns its piece of
// every bucket, and every rank owns the replicated head of the last bucket.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/communicator.hpp"
#include "optim/adamw.hpp"

namespace gpt2 {

// The whole buffer's sum of squares on every rank, from this rank's pieces: run_ss(begin, end) sums
// one run of it; the replicated head is counted by rank 0 only; the partial sums are all-reduced.
double sharded_sum_squares(Communicator& comm, const BucketPlan& plan,
                           const std::function<double(size_t, size_t)>& run_ss, const std::string& label);

// Every rank's piece of every bucket of buf (elements of dtype) all-gathered in place, so every rank
// holds all of buf. The replicated head is alike on every rank already.
void gather_pieces(Communicator& comm, const BucketPlan& plan, void* buf, DType dtype, const std::string& what);

// The same, not waited for: one all-gather per bucket, issued in ascending order of the buffer (the
// order a forward reads the parameters in), each with the run of the buffer it fills. The caller waits
// for every request (wait(): the timeout holds) before it reads or writes those runs on the host, or
// on a device stream that did not wait for the request's device_event().
struct PendingGather {
  FlatRange range;
  std::unique_ptr<CommRequest> request;
};
std::vector<PendingGather> gather_pieces_async(Communicator& comm, const BucketPlan& plan, void* buf, DType dtype,
                                               const std::string& what);

// Every rank's moments (opt's runs) in the flat layout on `root` only, for a checkpoint that root
// writes: root exports its runs into m_full and v_full (resized to plan.total()) and receives the other
// ranks' pieces bucket by bucket; the others send their pieces straight from opt's compact buffers and
// leave m_full and v_full empty, so no rank but the writer ever holds the unsharded optimizer state.
void gather_moments(Communicator& comm, const BucketPlan& plan, const AdamW& opt, int root,
                    std::vector<float>& m_full, std::vector<float>& v_full);

}  // namespace gpt2
