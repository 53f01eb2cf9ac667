// The backend choices (core/backend.hpp): every name parses to its enum and back, "auto" only where a
// choice may be automatic, and anything else is refused.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "core/backend.hpp"
#include "kernels/common/kernel_paths.hpp"

namespace gpt2 {
namespace {

template <class E>
void round_trips(std::initializer_list<E> all) {
  for (E e : all) {
    E back{};
    ASSERT_TRUE(parse_choice(name_of(e), &back)) << name_of(e);
    EXPECT_EQ(back, e) << name_of(e);
    std::optional<E> opt;
    ASSERT_TRUE(parse_choice(std::string(name_of(e)), &opt));
    EXPECT_EQ(opt, e);
  }
  E e{};
  EXPECT_FALSE(parse_choice("auto", &e)) << "a plain choice has no auto";
  EXPECT_FALSE(parse_choice("", &e));
  std::optional<E> opt = all.begin()[0];
  EXPECT_TRUE(parse_choice("auto", &opt));
  EXPECT_FALSE(opt.has_value()) << "auto leaves the choice open";
  EXPECT_EQ(name_of(std::optional<E>()), "auto");
  EXPECT_EQ(name_of(std::optional<E>(all.begin()[0])), name_of(all.begin()[0]));
}

TEST(BackendChoices, NamesRoundTrip) {
  round_trips({Device::kCpu, Device::kCuda});
  round_trips({Precision::kFp32, Precision::kBf16});
  round_trips({Comm::kMpi, Comm::kNccl});
  round_trips({GemmBackend::kHand, GemmBackend::kCublasLt});
}

TEST(BackendChoices, RefusesOtherNames) {
  GemmBackend g{};
  EXPECT_FALSE(parse_choice("cublas", &g));
  Precision p{};
  EXPECT_FALSE(parse_choice("fp16", &p));
  EXPECT_FALSE(parse_choice("BF16", &p)) << "names are exact";
  std::optional<Device> d;
  EXPECT_FALSE(parse_choice("tpu", &d));
  Comm c{};
  EXPECT_FALSE(parse_choice("gloo", &c));
}

// The "kernels:" line gpt2-train prints and tools/gpu-phase.sh reads: every path each operation took,
// once, in the order first seen; names compared by content, not address.
TEST(KernelPaths, EachPathOnceInFirstUseOrder) {
  kernels::reset_kernel_paths();
  EXPECT_EQ(kernels::kernel_paths_used(), "");
  const std::string copy = "mma.sync";  // another address, the same name
  kernels::record_kernel_path("attention forward", "mma.sync");
  kernels::record_kernel_path("gemm", "hand wgmma 128x128");
  kernels::record_kernel_path("attention forward", copy.c_str());
  kernels::record_kernel_path("gemm", "hand mma.sync");
  kernels::record_kernel_path("gemm", "hand wgmma 128x128");
  EXPECT_EQ(kernels::kernel_paths_used(), "attention forward: mma.sync; gemm: hand wgmma 128x128, hand mma.sync");
  kernels::reset_kernel_paths();
  EXPECT_EQ(kernels::kernel_paths_used(), "");
}

}  // namespace
}  // namespace gpt2
