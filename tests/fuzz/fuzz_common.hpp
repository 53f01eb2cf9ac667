// Shared by the libFuzzer harnesses of tests/fuzz. Our readers end the job through gpt2::fatal() on
// bad input, which is the intended outcome for a malformed file, not a finding. The harnesses turn it
// into an exception (Rejected) so one process can try millions of inputs; what remains a finding is a
// sanitizer report, a crash, a hang, or a broken property that a harness checks itself.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.hpp"

namespace gpt2::fuzz {

struct Rejected {};

// Installed once: fatal() prints its message (hidden by libFuzzer's -close_fd_mask=2) and throws.
inline void install_reject_hook() {
  static const bool once = [] {
    set_abort_hook([](int, const std::string&) { throw Rejected{}; });
    return true;
  }();
  (void)once;
}

// A property a harness checks failed: report it the way libFuzzer records a crash (abort).
[[noreturn]] inline void property_failed(const char* what) {
  std::fprintf(stderr, "fuzz property failed: %s\n", what);
  std::abort();
}

// Writes the input to one file per process and harness (the readers under test take paths).
inline std::string write_input(const char* harness, const uint8_t* data, size_t size) {
  const char* dir = std::getenv("TMPDIR");
  const std::string path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/gpt2-fuzz-" + harness + "-" +
                           std::to_string(getpid()) + ".bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();  // the harness cannot run at all: not a finding in the code under test
  }
  return path;
}

}  // namespace gpt2::fuzz
