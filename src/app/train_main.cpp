// gpt2-train: see --help.
#include <cstdio>

#include "app/train_options.hpp"
#include "comm/mpi_env.hpp"
#include "core/log.hpp"

int main(int argc, char** argv) {
  gpt2::MpiEnv env(&argc, &argv);
  gpt2::ParsedArgs args = gpt2::parse_train_args(argc, argv);
  // Every rank parses the same arguments and reaches the same outcome, so only rank 0 prints and
  // every rank exits with the same status: no abort needed, no rank left waiting.
  if (args.outcome == gpt2::ParsedArgs::Outcome::kHelp) {
    if (env.rank() == 0) std::fputs(args.message.c_str(), stdout);
    env.exit_all(0);
  }
  if (args.outcome == gpt2::ParsedArgs::Outcome::kError) {
    if (env.rank() == 0) std::fprintf(stderr, "gpt2-train: error: %s\nRun 'gpt2-train --help' for the options.\n",
                                      args.message.c_str());
    env.exit_all(2);
  }
  const int status = gpt2::run_training(args.config, env);
  env.exit_all(status);
}
