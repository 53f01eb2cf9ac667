// libFuzzer harness: gpt2-train's option parsing (src/app/train_options.cpp, Boost.ProgramOptions).
// The input up to the first NUL byte is an INI file given with --config; each further NUL-separated
// piece is one more command-line argument. Property: an accepted configuration satisfies what the
// validation promises the trainer.
#include <cstring>
#include <string>
#include <vector>

#include "app/train_options.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpt2::fuzz::install_reject_hook();
  const char* p = reinterpret_cast<const char*>(data);
  const size_t ini_len = strnlen(p, size);
  const std::string ini_path = gpt2::fuzz::write_input("train_options", data, ini_len);
  std::vector<std::string> args = {"gpt2-train", "--config", ini_path};
  for (size_t pos = ini_len + 1; pos <= size;) {
    const size_t n = strnlen(p + pos, size - pos);
    args.emplace_back(p + pos, n);
    pos += n + 1;
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  try {
    const gpt2::ParsedArgs r = gpt2::parse_train_args(static_cast<int>(args.size()), argv.data());
    if (r.outcome == gpt2::ParsedArgs::Outcome::kRun) {
      const gpt2::TrainConfig& c = r.config;
      // With --init-from or a resume and no model options, the checkpoint gives the architecture later
      // (as from_pretrained): the model limits are the trainer's to check then.
      const bool model_ok = c.model_from_checkpoint ||
                            (c.model.validate().empty() && c.seq_len <= c.model.max_seq_len);
      if (!model_ok || c.micro_batch <= 0 || c.seq_len <= 0 || c.global_batch_tokens < 0 || c.max_steps < 0 ||
          !(c.bucket_mb > 0) || c.log_every <= 0)
        gpt2::fuzz::property_failed("an accepted configuration breaks the validated limits");
    } else if (r.message.empty()) {
      gpt2::fuzz::property_failed("help or error without a message");
    }
  } catch (const gpt2::fuzz::Rejected&) {
  }
  return 0;
}
