#include "train/stop_signal.hpp"

#include <time.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/error.hpp"

namespace gpt2 {

namespace {

// Written by the handler, read by the step loop: lock-free atomics are async-signal-safe.
std::atomic<int> g_stop_signal{0};
std::atomic<long long> g_term_ns{0};  // CLOCK_MONOTONIC of the first SIGTERM, 0 if none
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<long long>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

long long monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe (POSIX)
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);
  long long zero = 0;
  if (sig == SIGTERM) g_term_ns.compare_exchange_strong(zero, monotonic_ns());
}

struct Grace {
  double seconds = std::numeric_limits<double>::infinity();
  std::string source = "unknown: no kill deadline assumed";
};

double parse_seconds(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  GPT2_REQUIRE(errno == 0 && end != text && *end == '\0' && v >= 0,
               name << "='" << text << "' is not a number of seconds >= 0");
  return v;
}

Grace find_grace() {
  Grace g;
  // Open MPI's mpirun/orted launched this process (srun's direct launch sets no HNP URI).
  if (std::getenv("OMPI_MCA_orte_hnp_uri") != nullptr) {
    const char* t = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
    g.seconds = t != nullptr ? parse_seconds("OMPI_MCA_odls_base_sigkill_timeout", t) : 1.0;  // Open MPI's default
    g.source = "mpirun's odls_base_sigkill_timeout";
  }
  if (const char* t = std::getenv("GPT2_KILL_GRACE_S")) {
    const double v = parse_seconds("GPT2_KILL_GRACE_S", t);
    if (v < g.seconds) {
      g.seconds = v;
      g.source = "GPT2_KILL_GRACE_S";
    }
  }
  return g;
}

const Grace& grace() {
  static const Grace g = find_grace();
  return g;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGUSR1, SIGTERM, SIGINT}) sigaddset(&sa.sa_mask, s);  // one handler at a time
  sa.sa_flags = SA_RESTART;                                            // do not break the MPI or file calls in progress
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sa.sa_flags = SA_RESTART | SA_RESETHAND;  // the second Ctrl-C takes the default action: end now
  sigaction(SIGINT, &sa, nullptr);
}

int stop_signal() {
  return g_stop_signal.load();
}

double kill_grace_s() {
  return grace().seconds;
}

const char* kill_grace_source() {
  return grace().source.c_str();
}

double seconds_until_kill() {
  const long long t = g_term_ns.load();
  if (t == 0) return std::numeric_limits<double>::infinity();
  return kill_grace_s() - static_cast<double>(monotonic_ns() - t) * 1e-9;
}

}  // namespace gpt2
