// gpt2-train: see --help.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "app/train_options.hpp"
#include "comm/communicator.hpp"
#include "comm/mpi_env.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "train/stop_signal.hpp"

namespace {

// The options that not every rank was given the same value of (ParsedArgs::option_values), each as this rank
// has it; empty when they agree. One all-reduce of (h, -h) under max gives each option's highest and lowest
// hash. Ranks started with different options run different jobs that meet in the same collectives: a rank
// told --max-steps 5 left the others in their next all-reduce (a segfault inside Open MPI), one told another
// --micro-batch or --lr trained something else without a word.
std::vector<std::string> options_that_differ(const std::vector<std::string>& values, gpt2::Communicator& comm) {
  int count[2] = {static_cast<int>(values.size()), -static_cast<int>(values.size())};
  comm.allreduce(count, 2, gpt2::ReduceOp::kMax, "option check (count)");
  if (count[0] != -count[1]) return {"(the ranks run different builds of gpt2-train: their options differ)"};
  std::vector<double> h(2 * values.size());
  for (size_t i = 0; i < values.size(); ++i) h[i] = gpt2::text_hash(values[i]), h[values.size() + i] = -h[i];
  comm.allreduce(h.data(), h.size(), gpt2::ReduceOp::kMax, "option check (values)");
  std::vector<std::string> differ;
  for (size_t i = 0; i < values.size(); ++i)
    if (h[i] != -h[values.size() + i]) differ.push_back(values[i]);
  return differ;
}

}  // namespace

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
  std::vector<std::string> differ;
  {
    gpt2::MpiCommunicator comm(MPI_COMM_WORLD, args.outcome == gpt2::ParsedArgs::Outcome::kRun
                                                   ? args.config.comm_timeout_s : 600.0);
    comm.allreduce(&worst, 1, gpt2::ReduceOp::kMax, "option check");
    comm.broadcast(&rank0, sizeof(rank0), 0, "option check (rank 0)");
    if (worst == static_cast<int>(gpt2::ParsedArgs::Outcome::kRun) && env.world_size() > 1)
      differ = options_that_differ(args.option_values, comm);
  }
  if (!differ.empty()) {
    if (env.rank() == 0) {
      std::string list;
      for (const std::string& d : differ) list += (list.empty() ? "" : ", ") + d;
      std::fprintf(stderr,
                   "gpt2-train: error: the ranks were not all given the same options; these differ (rank 0 "
                   "has): %s. Give every rank the same command line and config files.\n",
                   list.c_str());
    }
    env.exit_all(2);
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
