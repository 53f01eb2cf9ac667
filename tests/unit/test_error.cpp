// fatal() as an exception (core/error.hpp, FatalAsException): what comm/fail_together.hpp builds on to print
// an error that every rank finds once, not once per rank. Outside a scope, and inside an OpenMP parallel
// region, fatal() must still print and end the process.
#include <gtest/gtest.h>
#include <omp.h>

#include <new>
#include <stdexcept>
#include <string>

#include "core/error.hpp"

namespace gpt2 {
namespace {

FatalError caught(void (*f)()) {
  FatalAsException scope;
  try {
    f();
  } catch (const FatalError& e) {
    return e;
  }
  ADD_FAILURE() << "fatal() did not throw inside a FatalAsException scope";
  return {};
}

TEST(FatalAsException, ThrowsTheMessageAndStatusInsteadOfEndingTheProcess) {
  const FatalError user = caught([] { GPT2_REQUIRE(1 + 1 == 3, "file not found: " << "x.h5"); });
  EXPECT_EQ(user.what, "file not found: x.h5");
  EXPECT_EQ(user.exit_code, 1);
  const FatalError usage = caught([] { GPT2_REQUIRE_OPTIONS(false, "--micro-batch " << 3 << " does not divide"); });
  EXPECT_EQ(usage.what, "--micro-batch 3 does not divide");
  EXPECT_EQ(usage.exit_code, 2);
  // An internal check keeps its place in the source: the message is the same as fatal() prints.
  const FatalError check = caught([] { GPT2_CHECK(2 < 1, "why"); });
  EXPECT_NE(check.what.find("check failed: 2 < 1 why (at "), std::string::npos) << check.what;
  EXPECT_NE(check.what.find("test_error.cpp:"), std::string::npos) << check.what;
}

TEST(FatalAsException, AnyExceptionStandsForTheErrorFatalWouldReport) {
  // fail_together() takes any exception out of its work as that rank's error, in fatal()'s words.
  const FatalError oom = fatal_error_of(std::make_exception_ptr(std::bad_alloc()));
  EXPECT_EQ(oom.what.rfind("out of memory (std::bad_alloc)", 0), 0u) << oom.what;
  EXPECT_EQ(oom.exit_code, 1);
  const FatalError other = fatal_error_of(std::make_exception_ptr(std::runtime_error("permission denied")));
  EXPECT_EQ(other.what, "uncaught exception: permission denied");
  const FatalError own = fatal_error_of(std::make_exception_ptr(FatalError{"--lr is wrong", 2}));
  EXPECT_EQ(own.what, "--lr is wrong");
  EXPECT_EQ(own.exit_code, 2);
  EXPECT_EQ(fatal_error_of(std::make_exception_ptr(42)).what, "uncaught exception of an unknown type");
}

TEST(FatalAsException, ScopesNestAndEndWithTheOutermost) {
  testing::FLAGS_gtest_death_test_style = "threadsafe";
  {
    FatalAsException outer;
    { FatalAsException inner; }
    EXPECT_THROW(fatal("still inside the outer scope"), FatalError);
  }
  EXPECT_EXIT(fatal("after every scope ended"), ::testing::ExitedWithCode(1), "error: after every scope ended");
  EXPECT_EXIT(fatal_usage("a usage error"), ::testing::ExitedWithCode(2), "error: a usage error");
}

// (A function: a pragma inside a macro's argument is not one.)
void fatal_in_a_parallel_region_of_a_scope(int threads) {
  FatalAsException scope;
#pragma omp parallel num_threads(threads)
  {
    if (omp_get_thread_num() == 0) fatal("inside a parallel region");
  }
}

TEST(FatalAsException, AnotherThreadOrAnOpenMPRegionStillEndsTheProcess) {
  // An exception must not leave an OpenMP parallel region (std::terminate): there fatal() ends the
  // process with its own message, as it does on any thread other than the scope's. Threadsafe: the
  // process may hold an OpenMP thread pool, which does not survive fork() alone.
  testing::FLAGS_gtest_death_test_style = "threadsafe";
  // One thread (--threads 1, OMP_THREAD_LIMIT=1) is a parallel region too, if not for omp_in_parallel().
  for (const int threads : {2, 1})
    EXPECT_EXIT(fatal_in_a_parallel_region_of_a_scope(threads), ::testing::ExitedWithCode(1),
                "error: inside a parallel region")
        << threads << " thread(s)";
}

TEST(FatalAsException, OneThatEscapesToTerminateStillEndsTheProcessWithItsStatus) {
  // A FatalError thrown where nothing catches it (here: out of a noexcept function) ends the process
  // through the terminate handler with its message and status, not as "an unknown exception".
  testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(
      {
        install_terminate_handler();
        FatalAsException scope;
        [&]() noexcept { fatal_usage("escaped from a noexcept function"); }();
      },
      ::testing::ExitedWithCode(2), "error: escaped from a noexcept function");
}

}  // namespace
}  // namespace gpt2
