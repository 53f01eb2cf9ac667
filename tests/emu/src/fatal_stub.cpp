// For the kernel drivers, which link no src/core: core/error.hpp's fatal(): print and end the process.
#include "core/error.hpp"
#include <cstdio>
#include <cstdlib>
namespace gpt2 {
void fatal(const std::string& what, const char* file, int line) {
  std::fprintf(stderr, "[gpt2] error: %s", what.c_str());
  if (file) std::fprintf(stderr, " (at %s:%d)", file, line);
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
  std::_Exit(1);
}
}  // namespace gpt2
