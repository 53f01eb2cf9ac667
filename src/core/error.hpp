// One error family for the whole project. Every failure ends up in gpt2::fatal(), which prints a
// message naming the rank, host and device, then ends the whole job (MPI_Abort once MPI is up), so a
// failure on one rank never leaves the others waiting.
#pragma once

#include <exception>
#include <sstream>
#include <string>

namespace gpt2 {

// Where we are, for error messages. Filled in by the MPI environment and the device setup.
struct ErrorContext {
  int rank = -1;      // -1 until MPI is initialised
  int device = -1;    // CUDA device ordinal, -1 on the CPU backend
};
void set_error_context_rank(int rank);
void set_error_context_device(int device);

// Called by fatal() after printing `what`: ends the job. The MPI environment installs one that calls
// MPI_Abort; before that (and in plain unit tests) the default calls std::exit(exit_code). A harness that
// must go on after a failure (the fuzzers, bench_gpu_kernels) installs one that throws.
using AbortHook = void (*)(int exit_code, const std::string& what);
void set_abort_hook(AbortHook hook);

// Called by fatal() once, before the abort hook, to leave evidence behind (the communicator writes its
// flight record of the last collectives there). Must not call fatal() itself.
using FatalReporter = void (*)();
void set_fatal_reporter(FatalReporter reporter);

// Prints "[gpt2 rank R host H device D] error: WHAT" (plus "(at FILE:LINE)" when given) to stderr
// and ends the job with status 1.
[[noreturn]] void fatal(const std::string& what, const char* file = nullptr, int line = 0);
// The same for a command line that asks for something impossible (options that contradict each other,
// a batch the ranks cannot share), found after the options parsed: status 2, as for a bad option.
[[noreturn]] void fatal_usage(const std::string& what);

// Prints "[gpt2 rank R host H device D] error: WHAT" to stderr (rank 0's queued log lines first), and
// nothing else: for the callers that end the job themselves (comm/fail_together.hpp).
void print_error(const std::string& what);

// What fatal() throws, instead of printing and ending the job, on a thread inside a FatalAsException
// scope: for startup work that every rank runs alike and so usually fails alike on every rank, where
// one rank is to print the error once for all (comm/fail_together.hpp).
struct FatalError {
  std::string what;   // the message, with "(at FILE:LINE)" for internal checks
  int exit_code = 1;  // 1 or 2 (fatal_usage)
};
// While one is alive, fatal() on this thread throws FatalError. Not inside an OpenMP parallel region,
// even one of one thread (an exception must not leave one): there fatal() prints and ends the job as
// always, as on every other thread. Scopes nest.
class FatalAsException {
 public:
  FatalAsException();
  ~FatalAsException();
  FatalAsException(const FatalAsException&) = delete;
  FatalAsException& operator=(const FatalAsException&) = delete;
  // For a child process fork()ed inside a scope: from here on fatal() ends it (it must never unwind into
  // its parent's stack, which it has a copy of).
  static void end_all_on_this_thread();
};

// The error an exception stands for: a FatalError's own, or what fatal() says of any other (out of
// memory, a buffer too large, an uncaught std::exception). For the places that turn exceptions into
// errors: the terminate handler and comm/fail_together.hpp.
FatalError fatal_error_of(std::exception_ptr e);

// Makes an exception that escapes main, or any thread, end the job through fatal() ("[gpt2 rank R host H]
// error: out of memory ...", MPI_Abort on every rank) instead of std::terminate's abort and backtrace on
// each rank. Call first thing in main(); the terminate handler runs before any unwinding, so MPI is
// still initialised when it aborts.
void install_terminate_handler();

// Builds a message from stream insertions: fatal(msg() << "bad value " << x).
class msg {
 public:
  template <class T>
  msg& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  operator std::string() const { return os_.str(); }  // NOLINT: implicit on purpose
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
};

std::string hostname();

}  // namespace gpt2

// The one generic check. The condition is evaluated exactly once and never inside an assert, so
// the error text is never lost (llm.c lost MPI error strings that way).
#define GPT2_CHECK_GEN(cond, what_expr)                                                   \
  do {                                                                                    \
    if (!(cond)) ::gpt2::fatal(std::string(what_expr), __FILE__, __LINE__);               \
  } while (0)

// CHECK(cond) or CHECK(cond, "explanation " << value)
#define GPT2_CHECK(cond, ...)                                                             \
  GPT2_CHECK_GEN(cond, (::gpt2::msg() << "check failed: " #cond " " __VA_ARGS__).str())

// Errors that are the user's (bad option, bad file): the message is the whole story, no file:line.
#define GPT2_REQUIRE(cond, ...)                                                           \
  do {                                                                                    \
    if (!(cond)) ::gpt2::fatal((::gpt2::msg() << __VA_ARGS__).str());                     \
  } while (0)

// The same for options that cannot work together (exit status 2, as a bad option): fatal_usage().
#define GPT2_REQUIRE_OPTIONS(cond, ...)                                                   \
  do {                                                                                    \
    if (!(cond)) ::gpt2::fatal_usage((::gpt2::msg() << __VA_ARGS__).str());               \
  } while (0)
