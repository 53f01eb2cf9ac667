// main() of every GPU test binary: without a usable GPU it prints "skipped: no GPU ..." and exits 77,
// which ctest reports as skipped (SKIP_RETURN_CODE), so CI on GPU-less machines stays green.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "kernels/common/device.hpp"

int main(int argc, char** argv) {
  std::string why;
  if (gpt2::gpu_count(&why) == 0) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
