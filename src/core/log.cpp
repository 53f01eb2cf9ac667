#include "core/log.hpp"

#include <cstdio>

namespace gpt2 {
namespace {
int g_rank = 0;
}

void set_log_rank(int rank) { g_rank = rank; }
bool is_log_rank() { return g_rank == 0; }

void log_info(const char* fmt, ...) {
  if (g_rank != 0) return;
  va_list args;
  va_start(args, fmt);
  std::vprintf(fmt, args);
  va_end(args);
  std::fflush(stdout);
}

void log_warn(const char* fmt, ...) {
  if (g_rank != 0) return;
  std::fputs("warning: ", stderr);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fflush(stderr);
}

std::string format_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof(buf), "%.2fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof(buf), "%.2fM", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof(buf), "%.1fK", n / 1e3);
  else std::snprintf(buf, sizeof(buf), "%.0f", n);
  return buf;
}

}  // namespace gpt2
