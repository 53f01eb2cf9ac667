// Command line and INI configs of gpt2-train (Boost.ProgramOptions stays inside src/app).
#pragma once

#include <string>
#include <vector>

#include "train/trainer.hpp"

namespace gpt2 {

struct ParsedArgs {
  enum class Outcome { kRun = 0, kHelp = 1, kError = 2 } outcome = Outcome::kRun;  // ordered by severity
  std::string message;  // --help text, or the error
  TrainConfig config;
  // The options the ranks of a job must agree on (train_main.cpp), in the order the program declares them, as
  // "--name VALUE" ("--name" alone when unset), after the config files: all but --help, --config (whose files
  // are merged into the others) and what may differ from node to node (paths, --threads). Filled when parsing
  // succeeded.
  std::vector<std::string> option_values;
};

// Parses argv and every --config file (later files override earlier ones; the command line
// overrides all files). Never exits: the caller decides how to end every rank.
ParsedArgs parse_train_args(int argc, char** argv);

}  // namespace gpt2
