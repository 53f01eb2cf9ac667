// libFuzzer harness: the checkpoint reader (src/train/checkpoint.cpp) on an arbitrary file: the resume
// probe (checkpoint_problem), the model configuration, then, for a model small enough to build here,
// the parameters, the optimizer state and the train state. Like fuzz_token_file, this checks our side of the HDF5 boundary: clean errors,
// shapes checked before reading into our buffers, no HDF5 identifier left open.
#include "model/gpt2.hpp"
#include "optim/adamw.hpp"
#include "tests/fuzz/fuzz_hdf5.hpp"
#include "train/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpt2::fuzz::install_reject_hook();
  const std::string path = gpt2::fuzz::write_input("checkpoint", data, size);
  // --resume auto's probe reads the same untrusted files and promises an answer, never an error that
  // ends the job: anything it throws (even our own rejection) escapes this harness as a finding. (In
  // production it runs in a child process; here in this one, so the sanitizers see inside it.)
  (void)gpt2::checkpoint_problem_in_process(path);
  gpt2::fuzz::check_no_open_hdf5_ids();
  try {
    const gpt2::GPT2Config cfg = gpt2::read_checkpoint_config(path);
    // The seed checkpoints hold ~10k parameters; a mutated header may ask for billions.
    if (cfg.num_params() <= 1'000'000 && cfg.n_layer <= 8) {
      gpt2::GPT2 model(cfg);
      std::vector<float> m(model.table().total()), v(model.table().total());
      gpt2::OptimizerState opt{gpt2::AdamWConfig{}, 0, m.data(), v.data()};
      gpt2::TrainState state;
      gpt2::load_checkpoint(path, model, &opt, &state);
    }
  } catch (const gpt2::fuzz::Rejected&) {
  }
  gpt2::fuzz::check_no_open_hdf5_ids();
  return 0;
}
