// The small memory-bound CUDA kernels against their CPU references: GELU (gelu.hpp), fused
// softmax + cross-entropy (softmax_xent.hpp), AdamW (adamw.hpp) and the deterministic reductions
// (reduce.hpp). Every kernel runs in fp32 and bf16, over awkward sizes (tails shorter than a 128-bit
// vector, rows that are not a whole number of vectors) and misaligned pointers, which force the
// scalar fallback paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/adamw/adamw.hpp"
#include "kernels/adamw/adamw_cuda.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/gelu/gelu.hpp"
#include "kernels/gelu/gelu_cuda.hpp"
#include "core/param_segment.hpp"
#include "kernels/reduce/reduce.hpp"
#include "kernels/reduce/reduce_cuda.hpp"
#include "kernels/softmax_xent/softmax_xent.hpp"
#include "kernels/softmax_xent/softmax_xent_cuda.hpp"
#include "tests/gpu/gpu_test_util.hpp"

namespace gpt2::test {
namespace {

using kernels::AdamWStep;

// Sizes: one element, a tail shorter than any vector, a long odd tensor.
const long kSizes[] = {1, 7, 1000003};

// A device buffer laid out as [offset elements | n payload | kGuard guard elements], with payload at
// data() + offset: an offset of 1 misaligns every 128-bit access and forces the scalar path, and the
// guard catches writes past the end.
constexpr long kGuard = 16;
constexpr float kSentinel = 12288.0f;  // 3 * 2^12: exact in bf16 (12345 is not: it rounds to 12352)

template <class T>
struct Padded {
  DeviceBuffer<T> buf;
  long offset = 0, n = 0;
  Padded(const std::vector<float>& payload, long off) : offset(off), n(static_cast<long>(payload.size())) {
    std::vector<float> host(offset + n + kGuard, kSentinel);
    std::copy(payload.begin(), payload.end(), host.begin() + offset);
    buf.upload(host);
  }
  T* data() { return buf.data() + offset; }
  std::vector<float> payload() const {
    const auto all = buf.download();
    return std::vector<float>(all.begin() + offset, all.begin() + offset + n);
  }
  // Nothing outside the payload was written.
  void expect_untouched_outside(const char* what) const {
    const auto all = buf.download();
    long bad = 0;
    for (long i = 0; i < offset; ++i) bad += all[i] != kSentinel;
    for (long i = offset + n; i < static_cast<long>(all.size()); ++i) bad += all[i] != kSentinel;
    EXPECT_EQ(bad, 0) << what << ": " << bad << " elements outside the tensor were written";
  }
};

void sync() {
  CUDA_CHECK(cudaDeviceSynchronize());
}

// Elements whose bits differ (a count, so a failure does not print millions of values).
long bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  long bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return bad;
}

template <class T>
class ElementwiseTest : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16>;
struct TypeNames {
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "fp32" : "bf16";
  }
};
TYPED_TEST_SUITE(ElementwiseTest, StorageTypes, TypeNames);

// ---------------------------------------------------------------------------------------------------
// GELU

TYPED_TEST(ElementwiseTest, GeluForwardMatchesCpu) {
  using T = TypeParam;
  for (long n : kSizes) {
    for (long offset : {0L, 1L}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset);
      const auto inp = round_to<T>(random_vec(n, 11 + n, 2.0f));
      std::vector<float> ref(n);
      kernels::gelu_forward_cpu(ref.data(), inp.data(), n);
      Padded<T> d_inp(inp, offset), d_out(std::vector<float>(n, kSentinel), offset);
      kernels::gelu_forward_cuda<T>(d_out.data(), d_inp.data(), n, nullptr);
      sync();
      expect_close<T>(d_out.payload(), ref, round_to<T>(ref), "gelu out");
      d_out.expect_untouched_outside("gelu out");
    }
  }
}

TYPED_TEST(ElementwiseTest, GeluBackwardMatchesCpuAndMayAliasDout) {
  using T = TypeParam;
  for (long n : kSizes) {
    for (long offset : {0L, 1L}) {
      for (bool alias : {false, true}) {
        SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset << " alias=" << alias);
        const auto inp = round_to<T>(random_vec(n, 21 + n, 2.0f));
        const auto dout = round_to<T>(random_vec(n, 31 + n, 0.5f));
        std::vector<float> ref(n);
        kernels::gelu_backward_cpu(ref.data(), inp.data(), dout.data(), n);
        Padded<T> d_inp(inp, offset), d_dout(dout, offset), d_dinp(std::vector<float>(n, kSentinel), offset);
        Padded<T>& result = alias ? d_dout : d_dinp;
        kernels::gelu_backward_cuda<T>(result.data(), d_inp.data(), d_dout.data(), n, nullptr);
        sync();
        expect_close<T>(result.payload(), ref, round_to<T>(ref), "gelu dinp");
        result.expect_untouched_outside("gelu dinp");
        d_inp.expect_untouched_outside("gelu inp");
        if (!alias) {
          EXPECT_EQ(bit_mismatches(d_dout.payload(), dout), 0) << "dout changed";
        }
      }
    }
  }
}

// The fp32 GELU and its gradient against double precision over the whole range, not only the |x| < 2 of the
// tests above, each within the bound its form allows (cuda_util.cuh's gelu_f32): a few fp32 ulps, plus what
// 2^v makes of the rounding of v = -2 sqrt(2/pi) log2(e) (x + 0.044715 x^3), a relative error growing with
// |v|. The bound leaves the hardware's 2-ulp ex2 and 1-ulp rcp a margin of about 2 (a float32 model with
// such errors reached 0.50 of it; the emulator gives its ex2 and rcp errors of that size too). tanhf's 0.5 x (1 + tanh(u)),
// the form before, misses it: 1 + tanh(u) cancels for negative x (on the emulator, with glibc's tanhf, 1813
// of 6145 grid outputs and 1749 gradients fell outside, at x = -4 by about 100 times). Beyond |x| = 30 the
// GELU is x or 0 and its gradient 1 or 0 (to the reciprocal's ulp), gelu(+inf) = +inf, NaN stays NaN.
TEST(ElementwiseGeluFp32, AccurateOverTheWholeRange) {
  std::vector<float> x;
  for (int i = -12 * 256; i <= 12 * 256; ++i) x.push_back(static_cast<float>(i) / 256.0f);
  std::mt19937 rng(2026);  // and floats whose squares round (the grid's are exact)
  std::uniform_real_distribution<float> anywhere(-12.0f, 12.0f);
  for (int i = 0; i < 4096; ++i) x.push_back(anywhere(rng));
  for (float v : {1e-40f, 1e-30f, 1e-6f, 30.0f, 100.0f, 1e4f, 1e30f, std::numeric_limits<float>::max()}) {
    x.push_back(v);
    x.push_back(-v);
  }
  const long n = static_cast<long>(x.size());
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  const long n_all = static_cast<long>(x.size());
  Padded<float> d_x(x, 0), d_out(std::vector<float>(n_all, kSentinel), 0), d_dout(std::vector<float>(n_all, 1.0f), 0),
      d_dinp(std::vector<float>(n_all, kSentinel), 0);
  kernels::gelu_forward_cuda<float>(d_out.data(), d_x.data(), n_all, nullptr);
  kernels::gelu_backward_cuda<float>(d_dinp.data(), d_x.data(), d_dout.data(), n_all, nullptr);
  sync();
  const std::vector<float> y = d_out.payload(), dy = d_dinp.payload();

  const double kS = std::sqrt(2.0 / std::acos(-1.0)), kUlp = std::ldexp(1.0, -23);
  // The reciprocal flushes below 2^-126 (ptx.cuh): s is 0 from about x = -10.0 down, so the outputs there may
  // be off by that much s (the worst figures below leave that region out).
  const double kFlushedS = std::ldexp(1.0, -125), kFlushBelow = -10.0;
  long bad_fwd = 0, bad_grad = 0;
  double worst_fwd = 0, worst_grad = 0;  // error / bound, above the flush
  for (long i = 0; i < n; ++i) {
    const double xi = x[i], u = kS * (xi + 0.044715 * xi * xi * xi), v = -2.0 * u / std::log(2.0);
    const double e = std::exp(-2.0 * u), s = std::isfinite(e) ? 1.0 / (1.0 + e) : 0.0;
    const double one_minus_s = std::isfinite(e) ? e * s : 1.0, poly = 2.0 * kS * (1.0 + 3.0 * 0.044715 * xi * xi);
    const double g = xi * s, slope_term = s * one_minus_s * xi * poly, dg = s + slope_term;
    if (std::fabs(xi) >= 30) {  // saturated
      const bool fwd_ok = xi > 0 ? std::fabs(y[i] - xi) <= 2 * kUlp * xi : y[i] == 0.0f;
      const bool grad_ok = xi > 0 ? std::fabs(dy[i] - 1.0) <= 2 * kUlp : dy[i] == 0.0f;
      if (!fwd_ok && bad_fwd++ < 5) ADD_FAILURE() << "gelu(" << xi << ") = " << y[i];
      if (!grad_ok && bad_grad++ < 5) ADD_FAILURE() << "gelu'(" << xi << ") = " << dy[i];
      continue;
    }
    const double amp = (8.0 + 2.0 * std::fabs(v)) * kUlp;
    const double bound_fwd = amp * std::fabs(g) + kFlushedS * std::fabs(xi);
    // s's error through both terms, and, where 1 - s cancels (s near 1), that rounding of s (a few ulps of s,
    // not amplified by v: 2^v is small there) times the rest of the slope term
    const double bound_grad = amp * (s + std::fabs(slope_term)) + 8.0 * kUlp * s * std::fabs(xi) * poly +
                              kFlushedS * (1.0 + std::fabs(xi) * poly);
    const double err_fwd = std::fabs(y[i] - g), err_grad = std::fabs(dy[i] - dg);
    if (!(err_fwd <= bound_fwd) && bad_fwd++ < 5)
      ADD_FAILURE() << "gelu(" << xi << ") = " << y[i] << ", exact " << g << ", bound " << bound_fwd;
    if (!(err_grad <= bound_grad) && bad_grad++ < 5)
      ADD_FAILURE() << "gelu'(" << xi << ") = " << dy[i] << ", exact " << dg << ", bound " << bound_grad;
    if (xi > kFlushBelow) {
      if (bound_fwd > 0) worst_fwd = std::max(worst_fwd, err_fwd / bound_fwd);
      worst_grad = std::max(worst_grad, err_grad / bound_grad);
    }
  }
  EXPECT_EQ(bad_fwd, 0) << "GELU outputs outside their bound (worst above the flush at " << worst_fwd << " of it)";
  EXPECT_EQ(bad_grad, 0) << "GELU gradients outside their bound (worst above the flush at " << worst_grad << " of it)";
  EXPECT_EQ(y[n], std::numeric_limits<float>::infinity()) << "gelu(+inf)";
  EXPECT_TRUE(std::isnan(y[n + 1])) << "gelu(NaN) = " << y[n + 1];
  EXPECT_TRUE(std::isnan(dy[n + 1])) << "gelu'(NaN) = " << dy[n + 1];
  std::printf("fp32 GELU over [-12, 12]: worst error above the flush %.3f of its bound, gradient %.3f\n", worst_fwd,
              worst_grad);
}

// ---------------------------------------------------------------------------------------------------
// Softmax + cross-entropy

struct XentShape {
  int N, V, Vp;
};

template <class T>
void check_softmax_xent(const XentShape& sh, float dloss, bool write_grad, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "N=" << sh.N << " V=" << sh.V << " Vp=" << sh.Vp << " dloss=" << dloss
                                  << " write_grad=" << write_grad);
  const size_t total = static_cast<size_t>(sh.N) * sh.Vp;
  auto logits = random_vec(total, seed, 3.0f);
  // Padding columns hold values that would win the max: they must never reach the loss.
  for (int i = 0; i < sh.N; ++i)
    for (int j = sh.V; j < sh.Vp; ++j) logits[static_cast<size_t>(i) * sh.Vp + j] = 100.0f + j % 7;
  logits = round_to<T>(logits);
  std::vector<int32_t> targets(sh.N);
  std::mt19937 gen(seed + 1);
  std::uniform_int_distribution<int32_t> pick(0, sh.V - 1);
  for (auto& t : targets) t = pick(gen);
  targets[0] = sh.V - 1;  // the last real column (the vector that straddles V)
  if (sh.N > 1) targets[1] = 0;

  // The reference is computed in fp64: over a 50257-wide row, the fp32 CPU kernel's own sum carries a
  // relative error of ~1e-5 (sqrt(V) eps), as large as the tolerance. The CPU kernel is checked against
  // fp64 in tests/unit/test_kernels.cpp; here the GPU is held to the same fp64 truth.
  std::vector<float> ref_losses(sh.N), ref_logits = logits;
  for (int i = 0; i < sh.N; ++i) {
    const float* x = logits.data() + static_cast<size_t>(i) * sh.Vp;
    float* g = ref_logits.data() + static_cast<size_t>(i) * sh.Vp;
    double m = -INFINITY, sum = 0.0;
    for (int j = 0; j < sh.V; ++j) m = std::max(m, static_cast<double>(x[j]));
    for (int j = 0; j < sh.V; ++j) sum += std::exp(static_cast<double>(x[j]) - m);
    ref_losses[i] = static_cast<float>(std::log(sum) + m - x[targets[i]]);
    if (!write_grad) continue;
    for (int j = 0; j < sh.Vp; ++j)
      g[j] = j < sh.V ? static_cast<float>(dloss * (std::exp(static_cast<double>(x[j]) - m) / sum -
                                                     (j == targets[i] ? 1.0 : 0.0)))
                      : 0.0f;
  }

  DeviceBuffer<T> d_logits;
  d_logits.upload(logits);
  DeviceBuffer<int32_t> d_targets(sh.N);
  CUDA_CHECK(cudaMemcpy(d_targets.data(), targets.data(), sh.N * sizeof(int32_t), cudaMemcpyHostToDevice));
  DeviceBuffer<float> d_losses;
  d_losses.upload(std::vector<float>(sh.N, NAN));
  kernels::softmax_xent_cuda<T>(d_losses.data(), d_logits.data(), d_targets.data(), sh.N, sh.V, sh.Vp, dloss,
                                write_grad, nullptr);
  sync();
  const auto losses = d_losses.download();
  // Losses are fp32 in both paths, computed from the same (rounded) logits: fp32 rule for both types.
  expect_close_fp32(losses, ref_losses, "losses");
  const auto out = d_logits.download();
  if (!write_grad) {
    EXPECT_EQ(bit_mismatches(out, logits), 0) << "logits changed without write_grad";
    return;
  }
  expect_close<T>(out, ref_logits, round_to<T>(ref_logits), "dlogits");
  long nonzero_pad = 0;
  for (int i = 0; i < sh.N; ++i)
    for (int j = sh.V; j < sh.Vp; ++j) nonzero_pad += out[static_cast<size_t>(i) * sh.Vp + j] != 0.0f;
  EXPECT_EQ(nonzero_pad, 0) << "padding columns of dlogits must be exactly 0";

  // Deterministic: the same inputs give the same bits.
  DeviceBuffer<T> d_again;
  d_again.upload(logits);
  DeviceBuffer<float> d_losses_again(sh.N);
  kernels::softmax_xent_cuda<T>(d_losses_again.data(), d_again.data(), d_targets.data(), sh.N, sh.V, sh.Vp, dloss,
                                write_grad, nullptr);
  sync();
  EXPECT_EQ(bit_mismatches(d_losses_again.download(), losses), 0) << "losses not bit-identical on a second run";
  EXPECT_EQ(bit_mismatches(d_again.download(), out), 0) << "dlogits not bit-identical on a second run";
}

TYPED_TEST(ElementwiseTest, SoftmaxXentMatchesCpu) {
  using T = TypeParam;
  const XentShape shapes[] = {
      {37, 257, 384},     // awkward rows, whole vectors: the 128-bit path with a straddling vector at V
      {37, 257, 259},     // a row that is not a whole number of vectors: the scalar path
      {1, 1, 1},          // a single class: loss 0, gradient 0
      {64, 50257, 50304}  // GPT-2's vocabulary and its padding
  };
  uint32_t seed = 100;
  for (const auto& sh : shapes)
    for (bool write_grad : {false, true})
      for (float dloss : {1.0f, 1.0f / 3000.0f}) check_softmax_xent<T>(sh, dloss, write_grad, ++seed);
}

// ---------------------------------------------------------------------------------------------------
// AdamW

template <class T>
void check_adamw(long n, long offset, float weight_decay, float grad_scale, bool params_are_master) {
  SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset << " weight_decay=" << weight_decay
                                  << " grad_scale=" << grad_scale << " params_are_master=" << params_are_master);
  std::vector<float> master = random_vec(n, 41 + n, 0.5f), m(n, 0.0f), v(n, 0.0f);
  Padded<float> d_master(master, offset), d_m(m, offset), d_v(v, offset);
  Padded<T> d_params(std::vector<float>(n, kSentinel), offset);
  for (long step = 1; step <= 3; ++step) {
    SCOPED_TRACE(testing::Message() << "step=" << step);
    const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, weight_decay, grad_scale, step};
    const auto grads = round_to<T>(random_vec(n, 51 + 7 * step + n, 0.3f));
    kernels::adamw_update_cpu(master.data(), grads.data(), m.data(), v.data(), n, s);
    Padded<T> d_grads(grads, offset);
    T* params = params_are_master ? reinterpret_cast<T*>(d_master.data()) : d_params.data();
    kernels::adamw_update_cuda<T>(d_master.data(), params, d_grads.data(), d_m.data(), d_v.data(), n, s, nullptr);
    sync();
    // fp32 arithmetic on the same inputs in both paths: the fp32 rule for both storage types. Not bits:
    // g++ contracts the CPU loop's a * b + c into fmas where -march has them (x86-64-v3 does), the kernel
    // rounds every operation (adamw_element): on the H100 (2026-11-27) m and v differed in the last bit
    // here and there.
    expect_close_fp32(d_master.payload(), master, "master");
    expect_close_fp32(d_m.payload(), m, "m");
    expect_close_fp32(d_v.payload(), v, "v");
    d_master.expect_untouched_outside("master");
    d_m.expect_untouched_outside("m");
    d_v.expect_untouched_outside("v");
    if (!params_are_master) {
      // params = master rounded to T: against the unrounded master, naive = the CPU master rounded.
      expect_close<T>(d_params.payload(), master, round_to<T>(master), "params");
      d_params.expect_untouched_outside("params");
    }
  }
}

TYPED_TEST(ElementwiseTest, AdamWMatchesCpu) {
  using T = TypeParam;
  for (long n : kSizes)
    for (long offset : {0L, 1L})
      for (float wd : {0.0f, 0.1f})
        for (float grad_scale : {1.0f, 0.37f}) check_adamw<T>(n, offset, wd, grad_scale, false);
}

TEST(AdamW, Fp32ParamsMayBeTheMasterWeights) {
  for (long n : kSizes) check_adamw<float>(n, 0, 0.1f, 0.5f, true);
}

// params rounded to nearest even, exactly as the host rounds (DeviceBuffer<bf16>::upload).
TEST(AdamW, Bf16ParamsAreTheMasterRoundedToNearestEven) {
  const long n = 4099;
  std::vector<float> master = random_vec(n, 61, 1.0f), m(n, 0.0f), v(n, 0.0f), grads = round_bf16(random_vec(n, 62));
  const AdamWStep s{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f, 1};
  DeviceBuffer<float> d_master, d_m, d_v;
  d_master.upload(master);
  d_m.upload(m);
  d_v.upload(v);
  DeviceBuffer<bf16> d_params(n), d_grads;
  d_grads.upload(grads);
  kernels::adamw_update_cuda<bf16>(d_master.data(), d_params.data(), d_grads.data(), d_m.data(), d_v.data(), n, s,
                                   nullptr);
  sync();
  const auto gpu_master = d_master.download(), gpu_params = d_params.download();
  EXPECT_EQ(bit_mismatches(gpu_params, round_bf16(gpu_master)), 0);
}

// Multi-tensor AdamW: one launch over the chunks of many pieces gives every bit that one launch per
// piece gives (the same per-element arithmetic), on the whole buffer and on a ZeRO-1-like shard with
// unaligned cuts, and leaves everything outside the pieces alone. Tensors of 1, 3, 7 and > 2 chunks of
// elements, mixed weight decay, odd offsets (the scalar path) next to aligned ones.
template <class T>
void check_adamw_multi(std::vector<FlatRange> owned) {  // empty: the whole buffer
  std::vector<ParamSegment> segs;
  size_t off = 0;
  const size_t sizes[] = {768, 1, 3, 20000, 7, 4096, 8193, 37, 2 * kernels::kAdamWChunkElems + 5, 640};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
    segs.push_back({off, sizes[i], i % 3 != 1});
    off += sizes[i];
  }
  const long n = static_cast<long>(off);
  if (owned.empty()) owned = {{0, off}};
  const std::vector<OwnedPiece> pieces = owned_pieces(segs, owned);
  const long local = static_cast<long>(total_size(owned));
  const std::vector<float> master0 = random_vec(n, 71, 0.5f);
  std::vector<float> m0 = random_vec(local, 72, 0.01f), v0 = random_vec(local, 73, 0.01f);
  for (float& x : v0) x = x * x;  // second moments are >= 0

  // Two identical device states: one updated piece by piece, one by the multi-tensor launch.
  struct State {
    DeviceBuffer<float> master, m, v;
    DeviceBuffer<T> params, grads;
  } st[2];
  const auto grads = round_to<T>(random_vec(n, 74, 0.3f));
  for (State& x : st) {
    x.master.upload(master0);
    x.m.upload(m0);
    x.v.upload(v0);
    x.params.upload(std::vector<float>(n, kSentinel));
    x.grads.upload(grads);
  }
  const std::vector<kernels::AdamWChunk> chunks = kernels::adamw_chunks(pieces);
  DeviceBuffer<kernels::AdamWChunk> d_chunks(chunks.size());
  CUDA_CHECK(cudaMemcpy(d_chunks.data(), chunks.data(), chunks.size() * sizeof(chunks[0]), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
  for (long step = 1; step <= 2; ++step) {
    const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, step};
    for (const OwnedPiece& p : pieces) {
      AdamWStep ps = s;
      if (!p.decay) ps.weight_decay = 0.0f;
      kernels::adamw_update_cuda<T>(st[0].master.data() + p.flat, st[0].params.data() + p.flat,
                                    st[0].grads.data() + p.flat, st[0].m.data() + p.local, st[0].v.data() + p.local,
                                    static_cast<long>(p.size), ps, nullptr);
    }
    kernels::adamw_update_multi_cuda<T>(st[1].master.data(), st[1].params.data(), st[1].grads.data(), st[1].m.data(),
                                        st[1].v.data(), d_chunks.data(), static_cast<int>(chunks.size()), s, nullptr);
    sync();
  }
  EXPECT_EQ(bit_mismatches(st[1].master.download(), st[0].master.download()), 0) << "master";
  EXPECT_EQ(bit_mismatches(st[1].params.download(), st[0].params.download()), 0) << "params";
  EXPECT_EQ(bit_mismatches(st[1].m.download(), st[0].m.download()), 0) << "m";
  EXPECT_EQ(bit_mismatches(st[1].v.download(), st[0].v.download()), 0) << "v";
  // Outside the pieces nothing moved (the per-piece launches never touch it, so check the multi one alone).
  const auto master1 = st[1].master.download(), params1 = st[1].params.download();
  std::vector<bool> inside(n, false);
  for (const OwnedPiece& p : pieces)
    for (size_t i = p.flat; i < p.flat + p.size; ++i) inside[i] = true;
  long moved = 0;
  for (long i = 0; i < n; ++i)
    if (!inside[i]) moved += master1[i] != master0[i] || params1[i] != kSentinel;
  EXPECT_EQ(moved, 0) << "elements outside the owned pieces changed";
}

TYPED_TEST(ElementwiseTest, AdamWMultiTensorMatchesPerTensorBits) {
  check_adamw_multi<TypeParam>({});              // all of it
  check_adamw_multi<TypeParam>({{1234, 40001}});  // a shard cut inside tensors, unaligned
  check_adamw_multi<TypeParam>({{5, 6}, {21000, 30000}, {40000, 40003}});
}

// The multi-tensor launch's non-finite flag, what the training step's update check reads instead of a pass
// over the weights: 0 after an ordinary update, which gives the same bits as without the flag; 1 when one
// updated weight is NaN or infinite, on the vectorised path (aligned chunks) and on the scalar one (a shard
// cut at an odd offset), and when finite weights overflow in the update (lr 1e38); never cleared by the
// kernel.
TYPED_TEST(ElementwiseTest, AdamWMultiTensorFlagsANonFiniteWeight) {
  using T = TypeParam;
  const size_t n = 3 * kernels::kAdamWChunkElems + 5;
  const std::vector<ParamSegment> segs = {{0, n, true}};
  for (const size_t first : {size_t{0}, size_t{3}}) {  // 0: vectorised chunks; 3: every chunk scalar
    SCOPED_TRACE(::testing::Message() << "owned from " << first);
    const std::vector<FlatRange> owned = {{first, n}};
    const std::vector<OwnedPiece> pieces = owned_pieces(segs, owned);
    const std::vector<kernels::AdamWChunk> chunks = kernels::adamw_chunks(pieces);
    DeviceBuffer<kernels::AdamWChunk> d_chunks(chunks.size());
    CUDA_CHECK(cudaMemcpy(d_chunks.data(), chunks.data(), chunks.size() * sizeof(chunks[0]), cudaMemcpyHostToDevice));
    const size_t local = total_size(owned);
    const std::vector<float> grads = round_to<T>(random_vec(n, 81, 0.3f));
    // One update from `master0` with the flag starting at `flag0` (or no flag): the flag after, and the weights.
    auto update = [&](const std::vector<float>& master0, int flag0, bool with_flag, std::vector<float>* master_out,
                      const AdamWStep& s) {
      DeviceBuffer<float> master(n), m(local), v(local);
      DeviceBuffer<T> params(n), g(n);
      DeviceBuffer<int> flag(1);
      master.upload(master0);
      m.upload(std::vector<float>(local, 0.0f));
      v.upload(std::vector<float>(local, 0.0f));
      g.upload(grads);
      CUDA_CHECK(cudaMemcpy(flag.data(), &flag0, sizeof(int), cudaMemcpyHostToDevice));
      kernels::adamw_update_multi_cuda<T>(master.data(), params.data(), g.data(), m.data(), v.data(), d_chunks.data(),
                                          static_cast<int>(chunks.size()), s, nullptr,
                                          with_flag ? flag.data() : nullptr);
      sync();
      int got = -1;
      CUDA_CHECK(cudaMemcpy(&got, flag.data(), sizeof(int), cudaMemcpyDeviceToHost));
      if (master_out) *master_out = master.download();
      return got;
    };
    const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
    const std::vector<float> finite = random_vec(n, 82, 0.5f);
    std::vector<float> with_flag, without_flag;
    EXPECT_EQ(update(finite, 0, true, &with_flag, s), 0) << "an ordinary update was flagged";
    update(finite, 0, false, &without_flag, s);
    EXPECT_EQ(bit_mismatches(with_flag, without_flag), 0) << "the flag changed the update";
    EXPECT_EQ(update(finite, 1, true, nullptr, s), 1) << "the kernel cleared a flag that was set";
    for (const float x : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
      for (const size_t bad : {first + 100, first + kernels::kAdamWChunkElems + 7, n - 1}) {
        std::vector<float> master0 = finite;
        master0[bad] = x;
        EXPECT_EQ(update(master0, 0, true, nullptr, s), 1) << "a weight " << x << " at " << bad << " was not flagged";
      }
    }
    AdamWStep huge = s;  // every weight finite before; the step size lr / (1 - beta1) overflows
    huge.lr = 1e38f;
    EXPECT_EQ(update(finite, 0, true, nullptr, huge), 1) << "an update that overflows was not flagged";
  }
}

// ---------------------------------------------------------------------------------------------------
// Reductions

double sum_squares_device(DeviceBuffer<char>& scratch, DeviceBuffer<double>& result, const void* x, bool bf, long n,
                          cudaStream_t stream) {
  scratch.resize(kernels::sum_squares_scratch_bytes(n));
  CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0xff, scratch.bytes(), stream));  // contents must not matter
  if (bf)
    kernels::sum_squares_cuda<bf16>(result.data(), scratch.data(), static_cast<const bf16*>(x), n, stream);
  else
    kernels::sum_squares_cuda<float>(result.data(), scratch.data(), static_cast<const float*>(x), n, stream);
  double r = 0;
  CUDA_CHECK(cudaMemcpyAsync(&r, result.data(), sizeof(double), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return r;
}

TYPED_TEST(ElementwiseTest, SumSquaresIsAccurateAndDeterministic) {
  using T = TypeParam;
  constexpr bool kBf = std::is_same_v<T, bf16>;
  // The last size fills the 1024-block grid and makes every thread loop.
  for (long n : {1L, 7L, 1000003L, 8388613L}) {
    for (long offset : {0L, 1L}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset);
      const auto x = round_to<T>(random_vec(n, 71 + n, 1.5f));
      double exact = 0;  // a plain double loop; each x^2 is exact in double
      for (float e : x) exact += static_cast<double>(e) * e;
      const double cpu = kernels::sum_squares_cpu(x.data(), n);
      Padded<T> d_x(x, offset);
      DeviceBuffer<char> scratch;
      DeviceBuffer<double> result(1);
      CudaStream s1, s2;
      const double a = sum_squares_device(scratch, result, d_x.data(), kBf, n, s1.get());
      // A second run on another stream, behind unrelated work: same bits.
      kernels::scale_cuda<T>(d_x.data(), 1.0f, n, s2.get());
      const double b = sum_squares_device(scratch, result, d_x.data(), kBf, n, s2.get());
      EXPECT_EQ(std::memcmp(&a, &b, sizeof(double)), 0) << a << " vs " << b << ": not bit-identical";
      // Double sums in three different orders: they agree to ~sqrt(n) ulp, far inside 1e-10.
      EXPECT_NEAR(a, exact, 1e-10 * exact);
      EXPECT_NEAR(a, cpu, 1e-10 * exact);
    }
  }
}

TEST(SumSquares, EmptyBufferGivesZero) {
  DeviceBuffer<char> scratch(kernels::sum_squares_scratch_bytes(0));
  DeviceBuffer<double> result(1);
  const double one = 1.0;
  CUDA_CHECK(cudaMemcpy(result.data(), &one, sizeof(double), cudaMemcpyHostToDevice));
  kernels::sum_squares_cuda<float>(result.data(), scratch.data(), nullptr, 0, nullptr);
  double r = -1;
  CUDA_CHECK(cudaMemcpy(&r, result.data(), sizeof(double), cudaMemcpyDeviceToHost));
  EXPECT_EQ(r, 0.0);
}

TYPED_TEST(ElementwiseTest, ScaleMatchesCpu) {
  using T = TypeParam;
  for (long n : kSizes) {
    for (long offset : {0L, 1L}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset);
      const auto x = round_to<T>(random_vec(n, 81 + n));
      auto ref = x;
      kernels::scale_cpu(ref.data(), 0.37f, n);
      Padded<T> d_x(x, offset);
      kernels::scale_cuda<T>(d_x.data(), 0.37f, n, nullptr);
      sync();
      expect_close<T>(d_x.payload(), ref, round_to<T>(ref), "scaled x");
      d_x.expect_untouched_outside("scaled x");
    }
  }
}

}  // namespace
}  // namespace gpt2::test
