// One message for an error that every rank finds alike. Startup work runs the same on every rank (the
// backends, the batch geometry, opening the data, loading a checkpoint), so a missing file or a batch the
// ranks cannot share failed on all of them at once, and each printed it: W copies of one line, 1024 for a
// 1024-rank job, ahead of the launcher's abort banner.
#pragma once

#include <functional>
#include <string>

#include "comm/communicator.hpp"

namespace gpt2 {

// Runs `work` with fatal() as an exception (core/error.hpp, FatalAsException), then the ranks agree in
// one all-reduce whether it failed anywhere. If it did, they gather a hash of each rank's message, and
// each message is printed once, by the lowest rank that holds it, saying on how many of the W ranks it
// happened ("on all 8 ranks", "on 2 of 8 ranks", "on this rank only"): a missing file is one line, and a
// file missing on some nodes and damaged on others is two.
// Then every rank ends together, MPI_Finalize and exit with status 2 when the failure was fatal_usage()'s
// (options that cannot work together), else 1: no MPI_Abort, so the message is out before the job ends.
// `work` must run no collective: a rank that failed before it would leave the others waiting there. Any
// exception out of `work` counts as its error (out of memory: fatal()'s message for it). Use it before the
// job starts threads of its own or device communicators: it ends the process without unwinding.
void fail_together(Communicator& comm, const std::string& label, const std::function<void()>& work);

// A failure that every rank has found alike from values they share (a reduced loss that is NaN, weights
// that differ between ranks): rank 0 reports it through fatal(), and the others wait for its abort instead
// of each printing it too (up to 30 s: then, rank 0 having not found it, they report it themselves).
[[noreturn]] void fatal_on_all_ranks(Communicator& comm, const std::string& what);

}  // namespace gpt2

// GPT2_REQUIRE for a condition on values every rank shares: fatal_on_all_ranks() when it does not hold.
#define GPT2_REQUIRE_ON_ALL_RANKS(comm, cond, ...)                                         \
  do {                                                                                     \
    if (!(cond)) ::gpt2::fatal_on_all_ranks((comm), (::gpt2::msg() << __VA_ARGS__).str()); \
  } while (0)
