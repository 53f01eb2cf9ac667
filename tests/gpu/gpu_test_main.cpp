// main() of every GPU test binary: without a usable GPU it prints "skipped: no GPU ..." and exits 77,
// which ctest reports as skipped (SKIP_RETURN_CODE), so CI on GPU-less machines stays green. Listing
// (--gtest_list_tests) works everywhere.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "kernels/common/device.hpp"

int main(int argc, char** argv) {
  // Listing runs no test, so it needs no GPU: tools/gpu-phase.sh checks here that its filters select tests.
  bool list_only = false;
  for (int i = 1; i < argc; ++i) list_only |= std::strncmp(argv[i], "--gtest_list_tests", 18) == 0;
  std::string why;
  if (!list_only && gpt2::gpu_count(&why) == 0) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
