#include "core/error.hpp"

#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <stdexcept>

#include "core/log.hpp"

namespace gpt2 {
namespace {
ErrorContext g_context;
AbortHook g_abort_hook = nullptr;
FatalReporter g_fatal_reporter = nullptr;
thread_local int t_fatal_as_exception = 0;  // FatalAsException scopes alive on this thread
}  // namespace

FatalAsException::FatalAsException() { ++t_fatal_as_exception; }
FatalAsException::~FatalAsException() {
  if (t_fatal_as_exception > 0) --t_fatal_as_exception;
}
void FatalAsException::end_all_on_this_thread() { t_fatal_as_exception = 0; }

void set_error_context_rank(int rank) { g_context.rank = rank; }
void set_error_context_device(int device) { g_context.device = device; }
void set_abort_hook(AbortHook hook) { g_abort_hook = hook; }
void set_fatal_reporter(FatalReporter reporter) { g_fatal_reporter = reporter; }

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

void print_error(const std::string& what) {
  log_flush(2.0);  // rank 0's queued progress lines first (log_set_async), if their reader is reading
  std::string where = "[gpt2";
  if (g_context.rank >= 0) where += " rank " + std::to_string(g_context.rank);
  where += " host " + hostname();
  if (g_context.device >= 0) where += " device " + std::to_string(g_context.device);
  where += "]";
  std::fprintf(stderr, "%s error: %s\n", where.c_str(), what.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
}

namespace {
[[noreturn]] void end_job(int exit_code, const std::string& what) {
  // omp_get_level(), not omp_in_parallel(): a region of one thread (--threads 1) is one as well.
  if (t_fatal_as_exception > 0 && omp_get_level() == 0) throw FatalError{what, exit_code};
  print_error(what);
  if (FatalReporter r = g_fatal_reporter) {
    g_fatal_reporter = nullptr;  // once: a failure inside the reporter must not recurse
    r();
    std::fflush(stderr);
  }
  if (g_abort_hook != nullptr) g_abort_hook(exit_code, what);
  std::exit(exit_code);
}
}  // namespace

void fatal(const std::string& what, const char* file, int line) {
  end_job(1, file == nullptr ? what : what + " (at " + file + ":" + std::to_string(line) + ")");
}

void fatal_usage(const std::string& what) { end_job(2, what); }

FatalError fatal_error_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const FatalError& x) {
    return x;
  } catch (const std::bad_alloc& x) {
    return {msg() << "out of memory (" << x.what() << "): the model, batch or data do not fit in this process's "
                     "memory; use a smaller model, batch or fewer ranks per node",
            1};
  } catch (const std::length_error& x) {
    return {msg() << "a buffer size exceeds what can be allocated (std::length_error: " << x.what()
                  << "); use a smaller model or batch",
            1};
  } catch (const std::exception& x) {
    return {msg() << "uncaught exception: " << x.what(), 1};
  } catch (...) {
    return {"uncaught exception of an unknown type", 1};
  }
}

namespace {
[[noreturn]] void on_terminate() {
  t_fatal_as_exception = 0;  // from here on every error ends the job (this handler must not throw)
  const std::exception_ptr e = std::current_exception();
  if (!e) fatal("std::terminate called without an exception (a noexcept function threw, or a joinable thread was destroyed)");
  const FatalError error = fatal_error_of(e);  // a FatalError here was thrown where nothing catches it
  end_job(error.exit_code, error.what);
}
}  // namespace

void install_terminate_handler() { std::set_terminate(on_terminate); }

}  // namespace gpt2
