#include "comm/fail_together.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"

namespace gpt2 {

namespace {

std::string where_else(int failed, int world) {
  if (world == 1) return "";
  if (failed == world) return " (on all " + std::to_string(world) + " ranks)";
  if (failed == 1) return " (on this rank only, of " + std::to_string(world) + ")";
  return " (on " + std::to_string(failed) + " of " + std::to_string(world) + " ranks; this is the lowest of them)";
}

}  // namespace

void fail_together(Communicator& comm, const std::string& label, const std::function<void()>& work) {
  std::optional<FatalError> error;
  {
    FatalAsException as_exception;
    try {
      work();
    } catch (...) {  // fatal()'s FatalError, or any other exception (out of memory, a filesystem_error)
      error = fatal_error_of(std::current_exception());
    }
  }
  // Under max: the lowest failing rank (negated) and the highest exit status.
  const int W = comm.size(), rank = comm.rank();
  double v[2] = {-static_cast<double>(error ? rank : W), error ? static_cast<double>(error->exit_code) : 0.0};
  comm.allreduce(v, 2, ReduceOp::kMax, label + " (errors)");
  if (static_cast<int>(-v[0]) == W) return;
  // Each rank's message hash (-1: none): of the ranks that hold one message, the lowest prints it.
  std::vector<double> hashes(static_cast<size_t>(W));
  const double mine = error ? text_hash(error->what) : -1.0;
  comm.iallgather(&mine, hashes.data(), 1, DType::kF64, label + " (error messages)")->wait();
  if (error) {
    int same = 0, lowest = W;
    for (int r = 0; r < W; ++r)
      if (hashes[static_cast<size_t>(r)] == mine) ++same, lowest = std::min(lowest, r);
    if (rank == lowest) print_error(error->what + where_else(same, W));
  }
  log_flush(2.0);
  std::fflush(stdout);
  std::fflush(stderr);
  // Every rank is here (the collectives above), so MPI_Finalize ends them together.
  MPI_Finalize();
  std::exit(static_cast<int>(v[1]));
}

void fatal_on_all_ranks(Communicator& comm, const std::string& what) {
  if (comm.rank() == 0) fatal(what);
  // Rank 0 is ending the job with the message (MPI_Abort): nothing here may end it first and cut it off.
  // Should rank 0 not have found it after all (a value thought shared that was not), this rank reports it
  // itself after kRankZeroWait. No collective meanwhile: rank 0 would be in its next one, which it would match.
  constexpr auto kRankZeroWait = std::chrono::seconds(30);
  std::this_thread::sleep_for(kRankZeroWait);
  fatal(what);
}

}  // namespace gpt2
