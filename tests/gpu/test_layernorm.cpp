// GPU layernorm (kernels/layernorm/layernorm.cu) against the CPU reference (layernorm_cpu.cpp): forward,
// forward fused with the residual add, apply from saved statistics (recompute), backward (+= into dinp,
// dweight, dbias), in fp32 and bf16.
// The shape sweep takes every path: the 128-bit register path with several packs-per-lane counts, and
// the scalar fallbacks (C not a multiple of the 16-byte pack, misaligned pointers, rows too wide for
// registers / for the backward's shared memory). Determinism: two backward runs give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_test_util.hpp"
#include "kernels/common/device_buffer.hpp"
#include "kernels/layernorm/layernorm.hpp"
#include "kernels/layernorm/layernorm_cuda.hpp"

namespace gpt2 {
namespace {

using test::expect_close;
using test::random_vec;
using test::round_to;

struct Shape {
  int N, C;
};
// V = 16 / sizeof(T) elements per pack: 4 (fp32), 8 (bf16). Packs per lane = ceil(C / V / 32).
const Shape kShapes[] = {
    {111, 72},    // B=3, T=37; fewer packs than lanes
    {1, 768},     // GPT-2 124M, a single row: fewer than one backward chunk
    {37, 768},    // 3 backward chunks: 13, 13 and 11 rows
    {2048, 768},  // 128 backward row chunks, 2 rows a warp
    {41, 1024},   // GPT-2 355M (bf16 4 packs a lane)
    {19, 1280},   // GPT-2 774M (bf16 5 packs a lane)
    {67, 1600},   // GPT-2 1.5B (bf16 7 packs); backward shared memory above the 48 KiB default
    {9, 2048},    // widest backward fast path
    {29, 512},    // bf16 2 packs a lane, fp32 4
    {13, 384},    // fp32 3 packs (bf16 2)
    {11, 640},    // fp32 5 packs (bf16 3)
    {7, 896},     // fp32 7 packs (bf16 4)
    {5, 1536},    // bf16 6 packs (fp32 12): with the above, every pack count of both types on every path
    {333, 8},     // one pack per row (bf16)
    {17, 3},      // scalar for both types
    {5, 75},      // scalar for both types
    {20001, 72},  // many backward chunks (501 of 40 rows, set by the cap of 512), the last one a single row
    {3, 3072},    // bf16: forward register path, backward fallback; fp32: both fallback
    {7, 4104},    // rows too wide for registers: fallback for both types
};

// Device copy of n values at an element offset from a 16-byte aligned allocation (offset 1 makes
// every row misaligned for 128-bit accesses and forces the scalar kernels).
template <class T>
class OffsetBuffer {
 public:
  OffsetBuffer(const std::vector<float>& host, size_t offset) : n_(host.size()), offset_(offset) { upload(host); }
  // Filled with NaN, so an element the kernel fails to write shows up in the comparison.
  OffsetBuffer(size_t n, size_t offset)
      : OffsetBuffer(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()), offset) {}
  void upload(const std::vector<float>& host) {
    ASSERT_EQ(host.size(), n_);
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
  size_t n_, offset_;
};

std::vector<float> affine(std::vector<float> v, float add) {
  for (auto& x : v) x += add;
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

uint32_t seed_of(int N, int C, int salt) {
  return static_cast<uint32_t>(N * 7919 + C * 31 + salt);
}

template <class T>
void check_forward(int N, int C, size_t offset, float mean_offset = 0.5f) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " offset=" << offset);
  const size_t n = static_cast<size_t>(N) * C;
  const auto x = round_to<T>(affine(random_vec(n, seed_of(N, C, 1)), mean_offset));
  const auto w = round_to<T>(affine(random_vec(C, seed_of(N, C, 2), 0.2f), 1.0f));
  const auto b = round_to<T>(random_vec(C, seed_of(N, C, 3), 0.2f));
  std::vector<float> out(n), mean(N), rstd(N);
  kernels::layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  // Naive bf16: the output stored in bf16; the statistics are fp32 in every implementation.
  const auto out_naive = round_to<T>(out);

  OffsetBuffer<T> d_x(x, offset), d_w(w, offset), d_b(b, offset), d_out(n, offset);
  OffsetBuffer<float> d_mean(N, 0), d_rstd(N, 0);
  CudaStream stream;
  kernels::layernorm_forward_cuda<T>(d_out.get(), d_mean.get(), d_rstd.get(), d_x.get(), d_w.get(), d_b.get(), N, C,
                                     stream.get());
  stream.sync();
  expect_close<T>(d_out.download(), out, out_naive, "out");
  expect_close<T>(d_mean.download(), mean, mean, "mean");
  expect_close<T>(d_rstd.download(), rstd, rstd, "rstd");
}

template <class T>
void check_residual_forward(int N, int C, size_t offset) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " offset=" << offset);
  const size_t n = static_cast<size_t>(N) * C;
  const auto a = round_to<T>(random_vec(n, seed_of(N, C, 4)));
  const auto b = round_to<T>(affine(random_vec(n, seed_of(N, C, 5), 0.5f), 0.25f));
  const auto w = round_to<T>(affine(random_vec(C, seed_of(N, C, 6), 0.2f), 1.0f));
  const auto bias = round_to<T>(random_vec(C, seed_of(N, C, 7), 0.2f));
  std::vector<float> residual(n), out(n), mean(N), rstd(N);
  kernels::residual_layernorm_forward_cpu(residual.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(),
                                          w.data(), bias.data(), N, C);
  // Naive bf16: the residual is stored in bf16 and the layernorm reads it back from there.
  const auto residual_naive = round_to<T>(residual);
  std::vector<float> out_naive(n), mean_naive(N), rstd_naive(N);
  kernels::layernorm_forward_cpu(out_naive.data(), mean_naive.data(), rstd_naive.data(), residual_naive.data(),
                                 w.data(), bias.data(), N, C);
  out_naive = round_to<T>(out_naive);

  OffsetBuffer<T> d_a(a, offset), d_b(b, offset), d_w(w, offset), d_bias(bias, offset);
  OffsetBuffer<T> d_res(n, offset), d_out(n, offset);
  OffsetBuffer<float> d_mean(N, 0), d_rstd(N, 0);
  CudaStream stream;
  kernels::residual_layernorm_forward_cuda<T>(d_res.get(), d_out.get(), d_mean.get(), d_rstd.get(), d_a.get(),
                                              d_b.get(), d_w.get(), d_bias.get(), N, C, stream.get());
  stream.sync();
  const auto g_res = d_res.download(), g_out = d_out.download();
  const auto g_mean = d_mean.download(), g_rstd = d_rstd.download();
  expect_close<T>(g_res, residual, residual_naive, "residual");
  expect_close<T>(g_out, out, out_naive, "out");
  expect_close<T>(g_mean, mean, mean_naive, "mean");
  expect_close<T>(g_rstd, rstd, rstd_naive, "rstd");

  // The normalisation must read the residual as stored (rounded to T), since the backward reads that
  // same tensor: the plain forward over the stored residual reproduces every bit.
  OffsetBuffer<T> d_out2(n, offset);
  OffsetBuffer<float> d_mean2(N, 0), d_rstd2(N, 0);
  kernels::layernorm_forward_cuda<T>(d_out2.get(), d_mean2.get(), d_rstd2.get(), d_res.get(), d_w.get(), d_bias.get(),
                                     N, C, stream.get());
  stream.sync();
  EXPECT_TRUE(same_bits(d_out2.download(), g_out)) << "out differs from layernorm(stored residual)";
  EXPECT_TRUE(same_bits(d_mean2.download(), g_mean)) << "mean differs from layernorm(stored residual)";
  EXPECT_TRUE(same_bits(d_rstd2.download(), g_rstd)) << "rstd differs from layernorm(stored residual)";
}

// layernorm_apply_cuda (activation recompute) from the statistics a forward saved: every bit of the
// forward's output, on both forward forms (plain over x, fused over the stored residual) and every
// path; and the CPU layernorm_apply over the same statistics within the usual rule.
template <class T>
void check_apply(int N, int C, size_t offset) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " offset=" << offset);
  const size_t n = static_cast<size_t>(N) * C;
  const auto x = round_to<T>(affine(random_vec(n, seed_of(N, C, 11)), 0.5f));
  const auto y = round_to<T>(random_vec(n, seed_of(N, C, 12), 0.5f));
  const auto w = round_to<T>(affine(random_vec(C, seed_of(N, C, 13), 0.2f), 1.0f));
  const auto b = round_to<T>(random_vec(C, seed_of(N, C, 14), 0.2f));
  OffsetBuffer<T> d_x(x, offset), d_y(y, offset), d_w(w, offset), d_b(b, offset);
  OffsetBuffer<T> d_out(n, offset), d_res(n, offset), d_again(n, offset);
  OffsetBuffer<float> d_mean(N, 0), d_rstd(N, 0);
  CudaStream stream;

  kernels::layernorm_forward_cuda<T>(d_out.get(), d_mean.get(), d_rstd.get(), d_x.get(), d_w.get(), d_b.get(), N, C,
                                     stream.get());
  kernels::layernorm_apply_cuda<T>(d_again.get(), d_x.get(), d_mean.get(), d_rstd.get(), d_w.get(), d_b.get(), N, C,
                                   stream.get());
  stream.sync();
  const auto g_out = d_out.download();
  EXPECT_TRUE(same_bits(d_again.download(), g_out)) << "apply differs from the forward's output";

  // The CPU reference from the same statistics.
  const auto mean = d_mean.download(), rstd = d_rstd.download();
  std::vector<float> ref(n);
  kernels::layernorm_apply_cpu(ref.data(), x.data(), mean.data(), rstd.data(), w.data(), b.data(), N, C);
  expect_close<T>(d_again.download(), ref, round_to<T>(ref), "apply");

  kernels::residual_layernorm_forward_cuda<T>(d_res.get(), d_out.get(), d_mean.get(), d_rstd.get(), d_x.get(),
                                              d_y.get(), d_w.get(), d_b.get(), N, C, stream.get());
  kernels::layernorm_apply_cuda<T>(d_again.get(), d_res.get(), d_mean.get(), d_rstd.get(), d_w.get(), d_b.get(), N,
                                   C, stream.get());
  stream.sync();
  EXPECT_TRUE(same_bits(d_again.download(), d_out.download())) << "apply differs from the fused forward's output";
}

template <class T>
void check_backward(int N, int C, size_t offset) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " offset=" << offset);
  const size_t n = static_cast<size_t>(N) * C;
  const auto x = round_to<T>(affine(random_vec(n, seed_of(N, C, 8)), 0.5f));
  const auto w = round_to<T>(affine(random_vec(C, seed_of(N, C, 9), 0.2f), 1.0f));
  const auto dout = round_to<T>(random_vec(n, seed_of(N, C, 10)));
  // Accumulating outputs start nonzero: the kernels must add (+=), not overwrite.
  const auto dinp0 = round_to<T>(random_vec(n, seed_of(N, C, 11)));
  const auto dw0 = round_to<T>(random_vec(C, seed_of(N, C, 12)));
  const auto db0 = round_to<T>(random_vec(C, seed_of(N, C, 13)));
  std::vector<float> fwd_out(n), mean(N), rstd(N);
  kernels::layernorm_forward_cpu(fwd_out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                 std::vector<float>(C, 0.0f).data(), N, C);
  auto dinp = dinp0, dw = dw0, db = db0;
  kernels::layernorm_backward_cpu(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                                  rstd.data(), N, C);
  const auto dinp_naive = round_to<T>(dinp), dw_naive = round_to<T>(dw), db_naive = round_to<T>(db);

  OffsetBuffer<T> d_x(x, offset), d_w(w, offset), d_dout(dout, offset);
  OffsetBuffer<T> d_dinp(dinp0, offset), d_dw(dw0, offset), d_db(db0, offset);
  OffsetBuffer<float> d_mean(mean, 0), d_rstd(rstd, 0);
  // Scratch starts as garbage (NaN): its contents on entry must not matter. At offset 1 it is 4-byte
  // aligned only, which the partial sums' float4 loads must not take.
  const size_t scratch_bytes = kernels::layernorm_backward_scratch_bytes(N, C);
  ASSERT_GT(scratch_bytes, 0u);
  OffsetBuffer<float> scratch(scratch_bytes / sizeof(float), offset);
  CudaStream stream;
  auto run = [&] {
    kernels::layernorm_backward_cuda<T>(d_dinp.get(), d_dw.get(), d_db.get(), scratch.get(), d_dout.get(), d_x.get(),
                                        d_w.get(), d_mean.get(), d_rstd.get(), N, C, stream.get());
    stream.sync();
  };
  run();
  const auto g_dinp = d_dinp.download(), g_dw = d_dw.download(), g_db = d_db.download();
  expect_close<T>(g_dinp, dinp, dinp_naive, "dinp");
  expect_close<T>(g_dw, dw, dw_naive, "dweight");
  expect_close<T>(g_db, db, db_naive, "dbias");

  // Same inputs again: the same bits.
  d_dinp.upload(dinp0);
  d_dw.upload(dw0);
  d_db.upload(db0);
  run();
  EXPECT_TRUE(same_bits(d_dinp.download(), g_dinp)) << "dinp not deterministic";
  EXPECT_TRUE(same_bits(d_dw.download(), g_dw)) << "dweight not deterministic";
  EXPECT_TRUE(same_bits(d_db.download(), g_db)) << "dbias not deterministic";

  // Each warp with its next row in flight (layernorm_backward_prefetch_rows): the same arithmetic in the
  // same order, so the same bits (rows a warp: 1 to 5 here, and the chunks' last rows).
  struct PrefetchRows {
    PrefetchRows() { kernels::layernorm_backward_prefetch_rows(true); }
    ~PrefetchRows() { kernels::layernorm_backward_prefetch_rows(false); }
  };
  d_dinp.upload(dinp0);
  d_dw.upload(dw0);
  d_db.upload(db0);
  {
    const PrefetchRows prefetch;
    run();
  }
  EXPECT_TRUE(same_bits(d_dinp.download(), g_dinp)) << "dinp differs with two rows in flight a warp";
  EXPECT_TRUE(same_bits(d_dw.download(), g_dw)) << "dweight differs with two rows in flight a warp";
  EXPECT_TRUE(same_bits(d_db.download(), g_db)) << "dbias differs with two rows in flight a warp";
}

template <class T>
class LayerNormCuda : public ::testing::Test {};
struct TypeNames {
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "fp32" : "bf16";
  }
};
using StorageTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(LayerNormCuda, StorageTypes, TypeNames);

TYPED_TEST(LayerNormCuda, ForwardMatchesCpu) {
  for (const Shape& s : kShapes) check_forward<TypeParam>(s.N, s.C, 0);
}

TYPED_TEST(LayerNormCuda, ForwardMisalignedTakesScalarPath) {
  for (int C : {72, 768}) check_forward<TypeParam>(37, C, 1);
}

// Mean 30, standard deviation 1: E[x^2] - E[x]^2 would lose about 10 bits of the variance in fp32
// and miss the fp32 tolerance on rstd; the two-pass variance does not.
TYPED_TEST(LayerNormCuda, ForwardLargeMeanUsesTwoPassVariance) {
  check_forward<TypeParam>(64, 768, 0, 30.0f);
}

TYPED_TEST(LayerNormCuda, ResidualForwardMatchesCpu) {
  for (const Shape& s : kShapes) check_residual_forward<TypeParam>(s.N, s.C, 0);
}

TYPED_TEST(LayerNormCuda, ResidualForwardMisalignedTakesScalarPath) {
  for (int C : {72, 768}) check_residual_forward<TypeParam>(37, C, 1);
}

TYPED_TEST(LayerNormCuda, ApplyReproducesForwardBits) {
  for (const Shape& s : kShapes) check_apply<TypeParam>(s.N, s.C, 0);
  for (int C : {72, 768}) check_apply<TypeParam>(37, C, 1);
}

TYPED_TEST(LayerNormCuda, BackwardMatchesCpuAndIsDeterministic) {
  for (const Shape& s : kShapes) check_backward<TypeParam>(s.N, s.C, 0);
}

TYPED_TEST(LayerNormCuda, BackwardMisalignedTakesScalarPath) {
  for (int C : {72, 768}) check_backward<TypeParam>(37, C, 1);
  check_backward<TypeParam>(1000, 768, 1);
}

TYPED_TEST(LayerNormCuda, NoRowsIsANoOp) {
  EXPECT_EQ(kernels::layernorm_backward_scratch_bytes(0, 768), 0u);
  // Null pointers are fine when there is nothing to do: nothing is launched.
  kernels::layernorm_forward_cuda<TypeParam>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 768, nullptr);
  kernels::residual_layernorm_forward_cuda<TypeParam>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                      nullptr, 0, 768, nullptr);
  kernels::layernorm_backward_cuda<TypeParam>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                              nullptr, 0, 768, nullptr);
  kernels::layernorm_apply_cuda<TypeParam>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 768, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace gpt2
