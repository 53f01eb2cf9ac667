// GPU token + position embedding (kernels/encoder/encoder.cu) against the CPU reference
// (encoder_cpu.cpp), in fp32 and bf16: the forward gather, the host plan of the wte backward, and the
// backward (+= into dwte and dwpe) with many repeated tokens, 128-bit and scalar paths. Determinism:
// two backward runs give the same bits.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_test_util.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/encoder/encoder.hpp"
#include "kernels/encoder/encoder_cuda.hpp"

namespace gpt2 {
namespace {

using test::expect_close;
using test::random_vec;
using test::round_to;

struct Shape {
  int B, T, C, V, maxT;
};
const Shape kShapes[] = {
    {3, 37, 72, 7, 40},      // awkward: T=37, C=72; 7 tokens -> every token repeated ~16 times
    {4, 64, 768, 1000, 64},  // GPT-2 124M width
    {8, 128, 768, 50, 130},  // 124M width, 1024 positions over 50 tokens, one token ~half of them
    {2, 33, 75, 5, 33},      // C not a multiple of a 16-byte pack: scalar path
    {1, 1, 8, 3, 1},         // a single position
};

// Half the positions are token 0 (a frequent token with hundreds of positions, split over warps),
// the rest uniform over [0, V).
std::vector<int32_t> make_tokens(int N, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> any(0, V - 1);
  std::vector<int32_t> tok(static_cast<size_t>(N));
  for (auto& t : tok) t = (gen() & 1u) ? 0 : any(gen);
  return tok;
}

// Device copy at an element offset from an aligned allocation (offset 1 forces the scalar kernels).
template <class T>
class OffsetBuffer {
 public:
  OffsetBuffer(const std::vector<float>& host, size_t offset) : offset_(offset) { upload(host); }
  void upload(const std::vector<float>& host) {
    std::vector<float> tmp(offset_, 0.0f);
    tmp.insert(tmp.end(), host.begin(), host.end());
    buf_.upload(tmp);
  }
  T* get() { return buf_.data() + offset_; }
  std::vector<float> download() const {
    std::vector<float> v = buf_.download();
    v.erase(v.begin(), v.begin() + static_cast<long>(offset_));
    return v;
  }

 private:
  DeviceBuffer<T> buf_;
  size_t offset_;
};

DeviceBuffer<int32_t> upload_ints(const std::vector<int32_t>& v) {
  DeviceBuffer<int32_t> d(v.size());
  CUDA_CHECK(cudaMemcpy(d.data(), v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  return d;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class T>
void check_forward(const Shape& s, size_t offset) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V
                                    << " offset=" << offset);
  const int N = s.B * s.T;
  const auto tokens = make_tokens(N, s.V, static_cast<uint32_t>(N + s.C));
  const auto wte = round_to<T>(random_vec(static_cast<size_t>(s.V) * s.C, 21));
  const auto wpe = round_to<T>(random_vec(static_cast<size_t>(s.maxT) * s.C, 22));
  std::vector<float> out(static_cast<size_t>(N) * s.C);
  kernels::encoder_forward_cpu(out.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);

  auto d_tok = upload_ints(tokens);
  OffsetBuffer<T> d_wte(wte, offset), d_wpe(wpe, offset);
  OffsetBuffer<T> d_out(std::vector<float>(out.size(), std::numeric_limits<float>::quiet_NaN()), offset);
  CudaStream stream;
  kernels::encoder_forward_cuda<T>(d_out.get(), d_tok.data(), d_wte.get(), d_wpe.get(), s.B, s.T, s.C, stream.get());
  stream.sync();
  expect_close<T>(d_out.download(), out, round_to<T>(out), "out");
}

template <class T>
void check_backward(const Shape& s, size_t offset) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V
                                    << " offset=" << offset);
  const int N = s.B * s.T;
  const auto tokens = make_tokens(N, s.V, static_cast<uint32_t>(N + s.C + 1));
  const auto dout = round_to<T>(random_vec(static_cast<size_t>(N) * s.C, 23));
  // Nonzero starting gradients: the backward adds (+=). Rows of unused tokens and of t >= T must stay.
  const auto dwte0 = round_to<T>(random_vec(static_cast<size_t>(s.V) * s.C, 24));
  const auto dwpe0 = round_to<T>(random_vec(static_cast<size_t>(s.maxT) * s.C, 25));
  auto dwte = dwte0, dwpe = dwpe0;
  kernels::encoder_backward_cpu(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);

  std::vector<int32_t> plan;
  const int U = kernels::encoder_backward_plan(tokens.data(), N, &plan);
  ASSERT_EQ(plan.size(), static_cast<size_t>(2 * U + 1 + N));
  auto d_plan = upload_ints(plan);
  OffsetBuffer<T> d_dout(dout, offset), d_dwte(dwte0, offset), d_dwpe(dwpe0, offset);
  CudaStream stream;
  auto run = [&] {
    kernels::encoder_backward_cuda<T>(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_plan.data(), U, s.B, s.T, s.C,
                                      stream.get());
    stream.sync();
  };
  run();
  const auto g_dwte = d_dwte.download(), g_dwpe = d_dwpe.download();
  expect_close<T>(g_dwte, dwte, round_to<T>(dwte), "dwte");
  expect_close<T>(g_dwpe, dwpe, round_to<T>(dwpe), "dwpe");

  d_dwte.upload(dwte0);
  d_dwpe.upload(dwpe0);
  run();
  EXPECT_TRUE(same_bits(d_dwte.download(), g_dwte)) << "dwte not deterministic";
  EXPECT_TRUE(same_bits(d_dwpe.download(), g_dwpe)) << "dwpe not deterministic";
}

template <class T>
class EncoderCuda : public ::testing::Test {};
struct TypeNames {
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "fp32" : "bf16";
  }
};
using StorageTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(EncoderCuda, StorageTypes, TypeNames);

TYPED_TEST(EncoderCuda, ForwardMatchesCpu) {
  for (const Shape& s : kShapes) check_forward<TypeParam>(s, 0);
  check_forward<TypeParam>(kShapes[0], 1);
  check_forward<TypeParam>(kShapes[1], 1);
}

TYPED_TEST(EncoderCuda, BackwardMatchesCpuAndIsDeterministic) {
  for (const Shape& s : kShapes) check_backward<TypeParam>(s, 0);
  check_backward<TypeParam>(kShapes[0], 1);
  check_backward<TypeParam>(kShapes[1], 1);
}

}  // namespace
}  // namespace gpt2
