// gpt2-train: see --help.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

#include "app/train_options.hpp"
#include "comm/communicator.hpp"
#include "comm/mpi_env.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "train/stop_signal.hpp"

int main(int argc, char** argv) {
  // First, before MPI_Init (which can take seconds): a stop signal at any moment of start-up must end in
  // status 75 (requeue), never in the default 128+signal. See train/stop_signal.hpp.
  gpt2::install_stop_handlers();
  gpt2::install_terminate_handler();
  gpt2::MpiEnv env(&argc, &argv);
  gpt2::ParsedArgs args = gpt2::parse_train_args(argc, argv);
  // The ranks usually reach the same outcome, but not always (a config file readable on one node only),
  // so they agree first: if any rank failed, every rank exits 2 together and nobody is left waiting.
  // The message comes from rank 0 when it failed, else from each failing rank.
  // Through a Communicator, as every collective of the job: a rank that never gets here (stopped,
  // lost) ends the job after the timeout instead of hanging it.
  const int mine = static_cast<int>(args.outcome);  // kRun 0, kHelp 1, kError 2
  int worst = mine, rank0 = mine;
  {
    gpt2::MpiCommunicator comm(MPI_COMM_WORLD, args.outcome == gpt2::ParsedArgs::Outcome::kRun
                                                   ? args.config.comm_timeout_s : 600.0);
    comm.allreduce(&worst, 1, gpt2::ReduceOp::kMax, "option check");
    comm.broadcast(&rank0, sizeof(rank0), 0, "option check (rank 0)");
  }
  const int kError = static_cast<int>(gpt2::ParsedArgs::Outcome::kError);
  if (worst == kError) {
    if (mine == kError && (env.rank() == 0 || rank0 != kError))
      std::fprintf(stderr, "gpt2-train: error%s: %s\nRun 'gpt2-train --help' for the options.\n",
                   env.rank() == 0 ? "" : (" on rank " + std::to_string(env.rank())).c_str(), args.message.c_str());
    env.exit_all(2);
  }
  if (worst == static_cast<int>(gpt2::ParsedArgs::Outcome::kHelp)) {
    if (env.rank() == 0) std::fputs(args.message.c_str(), stdout);
    env.exit_all(0);
  }
  gpt2::log_set_async();  // a launcher that stops reading must not stop the step loop (core/log.hpp)
  const int status = gpt2::run_training(args.config, env);
  // After a stop signal the launcher may not read again before its SIGKILL (mpirun sleeps until then):
  // wait for the log writers only while this process still has time.
  gpt2::log_flush(gpt2::stop_signal() != 0 ? std::min(10.0, std::max(0.0, gpt2::seconds_until_kill() - 0.5))
                                           : std::numeric_limits<double>::infinity());
  env.exit_all(status);
}
