// CUDA flash attention (kernels/attention/attention.cu) against the CPU reference (attention_cpu.cpp):
// forward output and log-sum-exp, backward dq/dk/dv, over a sweep of shapes (T = 1, 37, 129, 1024;
// head sizes 12 to 128, odd ones included), both storage types, both paths (tensor cores and the fp32
// SIMT fallback forced through attention_force_generic), both tensor-core forward kernels
// (AttentionForwardPath: mma.sync, and wgmma on 9.0), both ways the tensor-core backward gets dQ
// (AttentionBackwardPath), determinism and full overwrite of outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention/attention.hpp"
#include "kernels/attention/attention_cuda.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/common/kernel_paths.hpp"
#include "kernels/reduce/reduce_cuda.hpp"
#include "tests/gpu/gpu_test_util.hpp"

namespace gpt2 {
namespace {

struct Shape {
  int B, T, C, NH;
  float input_scale = 1.0f;  // std of q, k, v: larger -> peakier softmax
};

std::string name(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
         " NH=" + std::to_string(s.NH) + " hs=" + std::to_string(s.C / s.NH);
}

// lse[b,h,t] = log sum_{t2<=t} exp(q.k / sqrt(hs)) in double: the statistic the forward saves.
std::vector<float> reference_lse(const std::vector<float>& qkv, const Shape& s) {
  const int hs = s.C / s.NH, C3 = 3 * s.C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<float> lse(static_cast<size_t>(s.B) * s.NH * s.T);
  std::vector<double> sc(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const float* q = &qkv[(static_cast<size_t>(b) * s.T + t) * C3 + h * hs];
        double mx = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = &qkv[(static_cast<size_t>(b) * s.T + t2) * C3 + s.C + h * hs];
          double dot = 0;
          for (int i = 0; i < hs; ++i) dot += static_cast<double>(q[i]) * k[i];
          sc[t2] = dot * scale;
          mx = std::max(mx, sc[t2]);
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) sum += std::exp(sc[t2] - mx);
        lse[(static_cast<size_t>(b) * s.NH + h) * s.T + t] = static_cast<float>(mx + std::log(sum));
      }
  return lse;
}

// out = att . v with given probabilities (the naive bf16 chain stores att in bf16 before this product).
std::vector<float> apply_att(const std::vector<float>& att, const std::vector<float>& qkv, const Shape& s) {
  const int hs = s.C / s.NH, C3 = 3 * s.C;
  std::vector<float> out(static_cast<size_t>(s.B) * s.T * s.C, 0.0f);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const float* a = &att[((static_cast<size_t>(b) * s.NH + h) * s.T + t) * s.T];
        float* o = &out[(static_cast<size_t>(b) * s.T + t) * s.C + h * hs];
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = &qkv[(static_cast<size_t>(b) * s.T + t2) * C3 + 2 * s.C + h * hs];
          for (int i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
  return out;
}

// All-ones bytes are NaN in fp32 and bf16: any element a kernel fails to write shows up as an error.
// On the stream the kernels run on: a (legacy-stream) cudaMemset is not ordered with a non-blocking stream's
// kernels and could land after them (the emulator's asynchronous streams caught that here).
void poison(void* p, size_t bytes, cudaStream_t stream = nullptr) {
  CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes, stream));
}

void expect_bit_identical(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what << " differs";
}

// Sets a path (forward or backward) for one scope and restores the previous one.
template <class Path, Path (*kGet)(), void (*kSet)(Path)>
class PathScope {
 public:
  explicit PathScope(Path path) : saved_(kGet()) { kSet(path); }
  ~PathScope() { kSet(saved_); }
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  Path saved_;
};
using BackwardPathScope = PathScope<kernels::AttentionBackwardPath, kernels::attention_backward_path,
                                    kernels::attention_set_backward_path>;
using ForwardPathScope =
    PathScope<kernels::AttentionForwardPath, kernels::attention_forward_path, kernels::attention_set_forward_path>;

std::string path_names() {
  const kernels::AttentionBackwardPath bwd = kernels::attention_backward_path();
  const kernels::AttentionForwardPath fwd = kernels::attention_forward_path();
  return std::string(fwd == kernels::AttentionForwardPath::kWgmma           ? " wgmma-fwd"
                     : fwd == kernels::AttentionForwardPath::kWgmmaPingPong ? " wgmma-pingpong-fwd"
                                                                            : " mma-sync-fwd") +
         (bwd == kernels::AttentionBackwardPath::kAccumulateDq   ? " accumulate-dq"
          : bwd == kernels::AttentionBackwardPath::kWgmma        ? " wgmma-bwd"
          : bwd == kernels::AttentionBackwardPath::kStoreDs      ? " store-ds"
          : bwd == kernels::AttentionBackwardPath::kWgmmaStoreDs ? " wgmma-store-ds"
                                                                 : " recompute-dq");
}

template <class T>
void check_attention(const Shape& s, bool force_generic, uint32_t seed) {
  SCOPED_TRACE(name(s) + (std::is_same_v<T, float> ? " fp32" : " bf16") + (force_generic ? " generic path" : "") +
               path_names());
  const size_t n_qkv = static_cast<size_t>(s.B) * s.T * 3 * s.C, n_out = static_cast<size_t>(s.B) * s.T * s.C;
  const size_t n_lse = static_cast<size_t>(s.B) * s.NH * s.T;
  const std::vector<float> qkv = test::round_to<T>(test::random_vec(n_qkv, seed, s.input_scale));
  const std::vector<float> dout = test::round_to<T>(test::random_vec(n_out, seed + 1));

  // fp32 reference on the rounded inputs
  std::vector<float> out_ref(n_out), att(n_lse * s.T), dqkv_ref(n_qkv);
  kernels::attention_forward_cpu(out_ref.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  kernels::attention_backward_cpu(dqkv_ref.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
  const std::vector<float> lse_ref = reference_lse(qkv, s);
  // naive bf16 chain: probabilities stored in bf16, every output rounded to bf16
  std::vector<float> out_naive, dqkv_naive;
  if constexpr (!std::is_same_v<T, float>) {
    const std::vector<float> att_bf16 = test::round_bf16(att);
    out_naive = test::round_bf16(apply_att(att_bf16, qkv, s));
    dqkv_naive.resize(n_qkv);
    kernels::attention_backward_cpu(dqkv_naive.data(), dout.data(), qkv.data(), att_bf16.data(), s.B, s.T, s.C, s.NH);
    dqkv_naive = test::round_bf16(dqkv_naive);
  }

  DeviceBuffer<T> d_qkv, d_dout, d_out(n_out), d_dqkv(n_qkv);
  DeviceBuffer<float> d_lse(n_lse);
  DeviceBuffer<char> scratch(kernels::attention_backward_scratch_bytes(s.B, s.T, s.C, s.NH));
  d_qkv.upload(qkv);
  d_dout.upload(dout);
  CudaStream stream;
  kernels::attention_force_generic(force_generic);

  std::vector<float> out[2], lse[2], dqkv[2];
  for (int run = 0; run < 2; ++run) {
    poison(d_out.data(), d_out.bytes(), stream.get());
    poison(d_lse.data(), d_lse.bytes(), stream.get());
    poison(d_dqkv.data(), d_dqkv.bytes(), stream.get());
    poison(scratch.data(), scratch.bytes(), stream.get());
    kernels::attention_forward_cuda<T>(d_out.data(), d_lse.data(), d_qkv.data(), s.B, s.T, s.C, s.NH, stream.get());
    kernels::attention_backward_cuda<T>(d_dqkv.data(), scratch.data(), d_dout.data(), d_qkv.data(), d_out.data(),
                                        d_lse.data(), s.B, s.T, s.C, s.NH, stream.get());
    stream.sync();
    out[run] = d_out.download();
    lse[run] = d_lse.download();
    dqkv[run] = d_dqkv.download();
  }
  kernels::attention_force_generic(false);

  test::expect_close<T>(out[0], out_ref, out_naive, "out");
  test::expect_close<T>(dqkv[0], dqkv_ref, dqkv_naive, "dqkv");
  // lse: fp32 statistics in both storage types (bf16 only rounds the inputs, which the reference shares)
  const double lse_tol = (std::is_same_v<T, float> ? 1e-5 : 4e-5) * std::max(1.0, test::max_abs(lse_ref));
  const double lse_err = test::max_abs_diff(lse[0], lse_ref);
  EXPECT_LE(lse_err, lse_tol) << "lse: max abs error " << lse_err;

  expect_bit_identical(out[0], out[1], "out (two runs)");
  expect_bit_identical(lse[0], lse[1], "lse (two runs)");
  expect_bit_identical(dqkv[0], dqkv[1], "dqkv (two runs)");
}

// Awkward shapes: T = 1 and not a multiple of any tile, C = 72 with head sizes 72..12, odd head sizes.
const Shape kSmallShapes[] = {
    {1, 1, 64, 1},    {3, 37, 72, 1},   {3, 37, 72, 2},   {3, 37, 72, 3},         {3, 37, 72, 4},
    {3, 37, 72, 6},   {2, 45, 126, 2},  {1, 50, 63, 7},   {2, 64, 128, 2},        {2, 200, 256, 4},
    {1, 128, 320, 4}, {1, 130, 384, 4}, {1, 129, 512, 4}, {1, 150, 256, 4, 3.0f},
};
// Head sizes with a tensor-core kernel (64, 80, 96, 128), run again through the fp32 SIMT fallback.
const Shape kTensorCoreShapes[] = {
    {2, 200, 256, 4}, {1, 128, 320, 4}, {1, 130, 384, 4}, {1, 129, 512, 4}, {3, 37, 256, 4}, {1, 1, 64, 1},
};
const Shape kGpt2Shape = {2, 1024, 768, 12};

template <class T>
class AttentionTest : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(AttentionTest, StorageTypes);

TYPED_TEST(AttentionTest, SmallShapesMatchCpu) {
  uint32_t seed = 100;
  for (const Shape& s : kSmallShapes) check_attention<TypeParam>(s, false, seed += 10);
}

TYPED_TEST(AttentionTest, Gpt2ShapeMatchesCpu) {
  check_attention<TypeParam>(kGpt2Shape, false, 7);
}

// The 5-product backward (dQ summed by the key-tile blocks in turns): every tensor-core head size, T
// not a multiple of any tile (the last query tile's rows >= T are never stored), T = 1, and GPT-2's
// shape, where 16 key tiles take turns on each of 16 query tiles. Poisoned scratch shows that the
// accumulator needs no clearing and that the turn counters are reset by the launcher.
TEST(AttentionAccumulateDq, MatchesCpu) {
  BackwardPathScope path(kernels::AttentionBackwardPath::kAccumulateDq);
  uint32_t seed = 700;
  for (const Shape& s : kTensorCoreShapes) check_attention<bf16>(s, false, seed += 10);
  check_attention<bf16>(kGpt2Shape, false, 11);
  check_attention<bf16>({2, 1000, 256, 2}, false, 12);  // hs = 128: 32-row query tiles, 2 dimension halves per tile
}

// Device buffers of one bf16 forward + backward: random qkv (seed) and dout (seed + 1), outputs and scratch.
struct Buffers {
  Buffers(const Shape& s, uint32_t seed)
      : out(static_cast<size_t>(s.B) * s.T * s.C),
        dqkv(static_cast<size_t>(s.B) * s.T * 3 * s.C),
        lse(static_cast<size_t>(s.B) * s.NH * s.T),
        scratch(kernels::attention_backward_scratch_bytes(s.B, s.T, s.C, s.NH)) {
    qkv.upload(test::random_vec(dqkv.size(), seed));
    dout.upload(test::random_vec(out.size(), seed + 1));
  }
  DeviceBuffer<bf16> qkv, dout, out, dqkv;
  DeviceBuffer<float> lse;
  DeviceBuffer<char> scratch;
};

// dqkv's q columns and its k, v columns, each row after row.
struct QAndKv {
  std::vector<float> q, kv;
};
QAndKv split_q_kv(const std::vector<float>& dqkv, const Shape& s) {
  QAndKv parts;
  for (size_t row = 0; row < static_cast<size_t>(s.B) * s.T; ++row) {
    const float* r = &dqkv[row * 3 * s.C];
    parts.q.insert(parts.q.end(), r, r + s.C);
    parts.kv.insert(parts.kv.end(), r + s.C, r + 3 * s.C);
  }
  return parts;
}

// `path` and `reference` compute the same dq/dk/dv: dk and dv come from the same dK/dV code (the same
// bits); dq is summed in another order (a few bf16 ulps).
void expect_same_dkdv(const Shape& s, kernels::AttentionBackwardPath reference, kernels::AttentionBackwardPath path,
                      uint32_t seed) {
  SCOPED_TRACE(name(s));
  Buffers d(s, seed);
  kernels::attention_forward_cuda<bf16>(d.out.data(), d.lse.data(), d.qkv.data(), s.B, s.T, s.C, s.NH, nullptr);
  std::vector<float> dqkv[2];
  const kernels::AttentionBackwardPath paths[2] = {reference, path};
  for (int i = 0; i < 2; ++i) {
    BackwardPathScope scope(paths[i]);
    poison(d.dqkv.data(), d.dqkv.bytes());
    kernels::attention_backward_cuda<bf16>(d.dqkv.data(), d.scratch.data(), d.dout.data(), d.qkv.data(), d.out.data(),
                                           d.lse.data(), s.B, s.T, s.C, s.NH, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    dqkv[i] = d.dqkv.download();
  }
  const QAndKv a = split_q_kv(dqkv[0], s), b = split_q_kv(dqkv[1], s);
  EXPECT_EQ(std::memcmp(a.kv.data(), b.kv.data(), a.kv.size() * sizeof(float)), 0) << "dk, dv differ";
  EXPECT_LE(test::max_abs_diff(a.q, b.q), 4.0 / 256 * test::max_abs(a.q)) << "dq";
}
void expect_agrees_with_recompute_dq(const Shape& s, kernels::AttentionBackwardPath path, uint32_t seed) {
  expect_same_dkdv(s, kernels::AttentionBackwardPath::kRecomputeDq, path, seed);
}

TEST(AttentionAccumulateDq, AgreesWithRecomputeDq) {
  expect_agrees_with_recompute_dq({2, 333, 384, 6}, kernels::AttentionBackwardPath::kAccumulateDq, 52);
}

// The backward that stores dS (bf16 causal tiles in the scratch) and sums dQ = dS K from it in a second
// launch: every tensor-core head size, T not a multiple of any tile (rows and keys >= T in the last tiles:
// the scratch is poisoned with NaN, so a dS value the dK/dV launch left unwritten and the dQ launch reads
// shows), T = 1, and hs = 128, where the dK/dV blocks' 32-query tiles fill half a tile each.
TEST(AttentionStoreDs, MatchesCpu) {
  BackwardPathScope path(kernels::AttentionBackwardPath::kStoreDs);
  uint32_t seed = 1100;
  for (const Shape& s : kTensorCoreShapes) check_attention<bf16>(s, false, seed += 10);
  check_attention<bf16>({2, 1000, 256, 2}, false, 22);
}

TEST(AttentionStoreDs, Gpt2ShapeMatchesCpu) {
  BackwardPathScope path(kernels::AttentionBackwardPath::kStoreDs);
  check_attention<bf16>(kGpt2Shape, false, 21);
}

// Its dq is summed from the dS that dK used (rounded to bf16 once): hs = 64 and 128, T not a multiple of 64.
TEST(AttentionStoreDs, AgreesWithRecomputeDq) {
  for (const Shape& s : {Shape{2, 333, 384, 6}, Shape{1, 100, 256, 2}})
    expect_agrees_with_recompute_dq(s, kernels::AttentionBackwardPath::kStoreDs, 53);
}

// The qkv bias gradient summed by the attention backward (bias_chunks, GPT2_ATTENTION_BIAS_SUMS): on
// recompute-dq and store-ds (the mma.sync kernels) each 64-row tile of a sequence writes the column sums of the
// bf16 dqkv values it stored, one chunk row per (sequence, tile), and the call returns the row count; dqkv keeps
// every bit of the call without chunks. Every tensor-core head size, T = 1 and T not a multiple of 64 (a last
// tile with rows >= T: their dK, dV, dQ are zero, from zero-filled rows, and the kernels mask them besides), chunks
// poisoned first (a column left unwritten is NaN). Then
// column_sums_add_cuda adds the chunks into a bias: dqkv's column sums over every row.
TEST(AttentionBiasSums, ChunksAreTheColumnSumsOfDqkv) {
  using P = kernels::AttentionBackwardPath;
  uint32_t seed = 1300;
  for (P path : {P::kRecomputeDq, P::kStoreDs}) {
    BackwardPathScope scope(path);
    for (const Shape& s : {Shape{2, 200, 256, 4}, Shape{1, 128, 320, 4}, Shape{1, 130, 384, 4}, Shape{1, 129, 512, 4},
                           Shape{3, 37, 256, 4}, Shape{1, 1, 64, 1}}) {
      SCOPED_TRACE(name(s) + (path == P::kStoreDs ? ", store-ds" : ", recompute-dq"));
      Buffers d(s, seed += 10);
      kernels::attention_forward_cuda<bf16>(d.out.data(), d.lse.data(), d.qkv.data(), s.B, s.T, s.C, s.NH, nullptr);
      poison(d.dqkv.data(), d.dqkv.bytes());
      EXPECT_EQ(kernels::attention_backward_cuda<bf16>(d.dqkv.data(), d.scratch.data(), d.dout.data(), d.qkv.data(),
                                                       d.out.data(), d.lse.data(), s.B, s.T, s.C, s.NH, nullptr),
                0);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> plain = d.dqkv.download();

      const int rows = kernels::attention_bias_chunk_rows(s.B, s.T), W = 3 * s.C, tiles = (s.T + 63) / 64;
      ASSERT_EQ(rows, s.B * tiles);
      ASSERT_EQ(kernels::attention_bias_chunks_bytes(s.B, s.T, s.C), static_cast<size_t>(rows) * W * sizeof(float));
      DeviceBuffer<float> chunks(static_cast<size_t>(rows) * W);
      poison(chunks.data(), chunks.bytes());
      poison(d.dqkv.data(), d.dqkv.bytes());
      EXPECT_EQ(kernels::attention_backward_cuda<bf16>(d.dqkv.data(), d.scratch.data(), d.dout.data(), d.qkv.data(),
                                                       d.out.data(), d.lse.data(), s.B, s.T, s.C, s.NH, nullptr,
                                                       chunks.data()),
                rows);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> dqkv = d.dqkv.download(), got = chunks.download();
      expect_bit_identical(dqkv, plain, "dqkv with the chunks against without");

      // each chunk: its tile's rows (< T) of dqkv as stored, summed in double; fp32 sums in another order
      // differ by rounding, bounded by the sum of magnitudes
      std::vector<double> total(W, 0.0), magnitude(W, 0.0);
      int bad = 0;
      for (int b = 0; b < s.B; ++b) {
        for (int tile = 0; tile < tiles; ++tile) {
          for (int c = 0; c < W; ++c) {
            double sum = 0.0, mag = 0.0;
            for (int t = tile * 64; t < std::min(s.T, tile * 64 + 64); ++t) {
              const double x = dqkv[(static_cast<size_t>(b) * s.T + t) * W + c];
              sum += x;
              mag += std::fabs(x);
            }
            total[c] += sum;
            magnitude[c] += mag;
            const float v = got[(static_cast<size_t>(b) * tiles + tile) * W + c];
            if (!(std::fabs(v - sum) <= 1e-5 * mag + 1e-30) && bad++ < 5)
              ADD_FAILURE() << "chunk (b " << b << ", tile " << tile << ") column " << c << ": " << v << " against "
                            << sum;
          }
        }
      }
      EXPECT_EQ(bad, 0) << "chunk entries that are not their tile's column sums";

      DeviceBuffer<float> bias(W);
      bias.upload(std::vector<float>(W, 0.5f));  // += : the sums are added to what is there
      kernels::column_sums_add_cuda<float>(bias.data(), nullptr, W, chunks.data(), rows, W, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> added = bias.download();
      int off = 0;
      for (int c = 0; c < W; ++c)
        if (!(std::fabs(added[c] - (0.5 + total[c])) <= 1e-5 * (magnitude[c] + 0.5)) && off++ < 5)
          ADD_FAILURE() << "bias column " << c << ": " << added[c] << " against " << 0.5 + total[c];
      EXPECT_EQ(off, 0) << "bias columns that are not 0.5 + dqkv's column sums";
    }
  }
}

// The paths that do not sum the chunks (accumulate-dq; the wgmma ones where they run; fp32's SIMT kernels)
// return 0 and leave them untouched: the caller then sums dqkv's columns as before.
TEST(AttentionBiasSums, OtherPathsLeaveTheChunksAlone) {
  using P = kernels::AttentionBackwardPath;
  const Shape s{2, 130, 256, 4};
  const int rows = kernels::attention_bias_chunk_rows(s.B, s.T);
  DeviceBuffer<float> chunks(static_cast<size_t>(rows) * 3 * s.C);
  std::vector<P> paths = {P::kAccumulateDq};
  if (kernels::attention_bwd_wgmma_available()) paths.insert(paths.end(), {P::kWgmma, P::kWgmmaStoreDs});
  for (P path : paths) {
    BackwardPathScope scope(path);
    Buffers d(s, 1400);
    kernels::attention_forward_cuda<bf16>(d.out.data(), d.lse.data(), d.qkv.data(), s.B, s.T, s.C, s.NH, nullptr);
    poison(chunks.data(), chunks.bytes());
    EXPECT_EQ(
        kernels::attention_backward_cuda<bf16>(d.dqkv.data(), d.scratch.data(), d.dout.data(), d.qkv.data(),
                                               d.out.data(), d.lse.data(), s.B, s.T, s.C, s.NH, nullptr, chunks.data()),
        0)
        << path_names();
    CUDA_CHECK(cudaDeviceSynchronize());
    for (float v : chunks.download()) ASSERT_TRUE(std::isnan(v)) << "a chunk written by " << path_names();
  }
  // fp32 runs the SIMT kernels
  const size_t n_qkv = static_cast<size_t>(s.B) * s.T * 3 * s.C, n_out = static_cast<size_t>(s.B) * s.T * s.C;
  DeviceBuffer<float> qkv, dout, out(n_out), dqkv(n_qkv), lse(static_cast<size_t>(s.B) * s.NH * s.T);
  DeviceBuffer<char> scratch(kernels::attention_backward_scratch_bytes(s.B, s.T, s.C, s.NH));
  qkv.upload(test::random_vec(n_qkv, 1401));
  dout.upload(test::random_vec(n_out, 1402));
  kernels::attention_forward_cuda<float>(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, nullptr);
  poison(chunks.data(), chunks.bytes());
  EXPECT_EQ(kernels::attention_backward_cuda<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                                                    lse.data(), s.B, s.T, s.C, s.NH, nullptr, chunks.data()),
            0);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (float v : chunks.download()) ASSERT_TRUE(std::isnan(v)) << "a chunk written by the fp32 backward";
}

// The scratch a path needs: recompute-dq only D (B*NH*T fp32), store-ds D and the causal dS tiles (bf16),
// accumulate-dq and wgmma D, the fp32 dQ accumulator and the counters; the size without a path covers
// every path. No device needed (host arithmetic), so it runs everywhere the suite runs.
TEST(AttentionScratch, EachPathGetsWhatItUses) {
  using P = kernels::AttentionBackwardPath;
  const int B = 16, T = 1024, C = 768, NH = 12;
  const size_t d = static_cast<size_t>(B) * NH * T * sizeof(float);
  const size_t tiles = 16 * 17 / 2;  // causal 64 x 64 tiles a head at T = 1024
  EXPECT_EQ(kernels::attention_backward_scratch_bytes(B, T, C, NH, P::kRecomputeDq), d);
  EXPECT_EQ(kernels::attention_backward_scratch_bytes(B, T, C, NH, P::kStoreDs),
            d + static_cast<size_t>(B) * NH * tiles * 64 * 64 * sizeof(bf16));
  EXPECT_GE(kernels::attention_backward_scratch_bytes(B, T, C, NH, P::kAccumulateDq),
            d + static_cast<size_t>(B) * T * C * sizeof(float));
  EXPECT_EQ(kernels::attention_backward_scratch_bytes(B, T, C, NH, P::kWgmma),
            kernels::attention_backward_scratch_bytes(B, T, C, NH, P::kAccumulateDq));
  EXPECT_EQ(kernels::attention_backward_scratch_bytes(B, T, C, NH, P::kWgmmaStoreDs),
            kernels::attention_backward_scratch_bytes(B, T, C, NH, P::kStoreDs));
  for (P path : {P::kRecomputeDq, P::kAccumulateDq, P::kWgmma, P::kStoreDs, P::kWgmmaStoreDs})
    EXPECT_GE(kernels::attention_backward_scratch_bytes(B, T, C, NH),
              kernels::attention_backward_scratch_bytes(B, T, C, NH, path));
  // T = 65: two tile rows, three causal tiles a head (after D's 260 bytes, rounded up to 512)
  EXPECT_EQ(kernels::attention_backward_scratch_bytes(1, 65, 64, 1, P::kStoreDs), 512 + 3 * 64 * 64 * sizeof(bf16));
}

// The mma.sync kernels' block order (tile_order.hpp) decides when a tile runs, never what it computes: each
// head alone, at most 3 heads a group (12 heads: 4 groups of 3; 10: 3, 3, 2, 2), one group of every head and
// the default (sized by L2) give the same bits in out, lse and dqkv, and the default matches the CPU. 12
// heads at hs = 64 (2 forward ranks, 4 backward) and 10 at hs = 80, T not a multiple of a tile.
TEST(AttentionTileOrder, EveryGroupSizeGivesTheSameBits) {
  struct GroupScope {
    explicit GroupScope(int heads) { kernels::attention_set_tile_group_heads(heads); }
    ~GroupScope() { kernels::attention_set_tile_group_heads(0); }
  };
  ForwardPathScope fwd(kernels::AttentionForwardPath::kMmaSync);
  BackwardPathScope bwd(kernels::AttentionBackwardPath::kRecomputeDq);
  uint32_t seed = 900;
  for (const Shape& s : {Shape{3, 200, 256, 4}, Shape{2, 130, 400, 5}}) {
    check_attention<bf16>(s, false, seed += 10);
    auto run = [&](int group_heads) {
      const GroupScope scope(group_heads);
      Buffers d(s, seed);
      poison(d.out.data(), d.out.bytes());
      poison(d.lse.data(), d.lse.bytes());
      poison(d.dqkv.data(), d.dqkv.bytes());
      kernels::attention_forward_cuda<bf16>(d.out.data(), d.lse.data(), d.qkv.data(), s.B, s.T, s.C, s.NH, nullptr);
      kernels::attention_backward_cuda<bf16>(d.dqkv.data(), d.scratch.data(), d.dout.data(), d.qkv.data(),
                                             d.out.data(), d.lse.data(), s.B, s.T, s.C, s.NH, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      return std::vector<std::vector<float>>{d.out.download(), d.lse.download(), d.dqkv.download()};
    };
    const auto by_default = run(0);
    for (int group_heads : {1, 3, s.B * s.NH}) {
      SCOPED_TRACE(name(s) + ", " + std::to_string(group_heads) + " heads a group");
      const auto other = run(group_heads);
      expect_bit_identical(other[0], by_default[0], "out");
      expect_bit_identical(other[1], by_default[1], "lse");
      expect_bit_identical(other[2], by_default[2], "dqkv");
    }
  }
}

// The shapes both wgmma suites check against the CPU (hs = 64; tests/emu/include/emu/attention_driver_util.h,
// gpu_test_shapes, is the same list for the emulator).
const Shape kWgmmaShapes[] = {{1, 1, 64, 1},    {2, 64, 128, 2},  {3, 37, 256, 4},  {2, 128, 128, 2},
                              {2, 129, 192, 3}, {1, 257, 64, 1},  {2, 200, 256, 4}, {1, 150, 256, 4, 3.0f}};

// The Hopper forward (wgmma + TMA, hs = 64 only): T = 1, tails of the 128-row tiles (a last query tile
// with rows >= T, whose K and V tiles come in zero-filled), exact multiples, a peaky softmax, GPT-2's
// shape (192 units on a persistent grid of one block per SM: some blocks take two). Both schedules: the
// consumers independent, and taking turns (ping-pong). Runs on a 9.0 device with the sm_90a code; skips
// elsewhere.
TEST(AttentionWgmmaForward, MatchesCpu) {
  if (!kernels::attention_fwd_wgmma_available()) GTEST_SKIP() << "needs compute capability 9.0 and sm_90a code";
  for (kernels::AttentionForwardPath p :
       {kernels::AttentionForwardPath::kWgmma, kernels::AttentionForwardPath::kWgmmaPingPong}) {
    ForwardPathScope path(p);
    uint32_t seed = 900;
    for (const Shape& s : kWgmmaShapes)
      check_attention<bf16>(s, false, seed += 10);
    check_attention<bf16>(kGpt2Shape, false, 13);
  }
}

// out and lse of one bf16 forward launch on `path`, from random qkv (seed), outputs poisoned first.
struct ForwardResult {
  std::vector<float> out, lse;
};
ForwardResult forward_on_path(const Shape& s, kernels::AttentionForwardPath path, uint32_t seed) {
  const size_t n_qkv = static_cast<size_t>(s.B) * s.T * 3 * s.C, n_out = static_cast<size_t>(s.B) * s.T * s.C;
  DeviceBuffer<bf16> d_qkv, d_out(n_out);
  DeviceBuffer<float> d_lse(static_cast<size_t>(s.B) * s.NH * s.T);
  d_qkv.upload(test::random_vec(n_qkv, seed));
  ForwardPathScope scope(path);
  poison(d_out.data(), d_out.bytes());
  poison(d_lse.data(), d_lse.bytes());
  kernels::attention_forward_cuda<bf16>(d_out.data(), d_lse.data(), d_qkv.data(), s.B, s.T, s.C, s.NH, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return {d_out.download(), d_lse.download()};
}

// The two forward kernels compute the same function: out within a few bf16 ulps (the dot products are
// summed in another order), lse within fp32 rounding. Skips off 9.0.
TEST(AttentionWgmmaForward, AgreesWithMmaSync) {
  if (!kernels::attention_fwd_wgmma_available()) GTEST_SKIP() << "needs compute capability 9.0 and sm_90a code";
  const Shape s = {4, 700, 768, 12};
  const ForwardResult mma = forward_on_path(s, kernels::AttentionForwardPath::kMmaSync, 62);
  const ForwardResult wgmma = forward_on_path(s, kernels::AttentionForwardPath::kWgmma, 62);
  EXPECT_LE(test::max_abs_diff(mma.out, wgmma.out), 4.0 / 256 * test::max_abs(mma.out)) << "out";
  EXPECT_LE(test::max_abs_diff(mma.lse, wgmma.lse), 1e-4 * std::max(1.0, test::max_abs(mma.lse))) << "lse";
  // The ping-pong schedule only changes when each consumer issues: the same products, the same bits.
  const ForwardResult pingpong = forward_on_path(s, kernels::AttentionForwardPath::kWgmmaPingPong, 62);
  EXPECT_EQ(test::max_abs_diff(wgmma.out, pingpong.out), 0.0) << "out, ping-pong vs cooperative";
  EXPECT_EQ(test::max_abs_diff(wgmma.lse, pingpong.lse), 0.0) << "lse, ping-pong vs cooperative";
}

// Asking for the wgmma forward where it does not apply (head sizes other than 64; any device other than
// 9.0) runs mma.sync: the same bits as asking for mma.sync. Runs on every GPU.
TEST(AttentionWgmmaForward, FallsBackToMmaSyncWhereItDoesNotApply) {
  for (const Shape& s : {Shape{2, 200, 320, 4}, Shape{1, 129, 512, 4}, Shape{2, 150, 256, 4}}) {
    if (s.C / s.NH == 64 && kernels::attention_fwd_wgmma_available()) continue;  // it applies there
    SCOPED_TRACE(name(s));
    const ForwardResult mma = forward_on_path(s, kernels::AttentionForwardPath::kMmaSync, 72);
    const ForwardResult asked = forward_on_path(s, kernels::AttentionForwardPath::kWgmma, 72);
    expect_bit_identical(mma.out, asked.out, "out (mma.sync vs wgmma asked for)");
    expect_bit_identical(mma.lse, asked.lse, "lse (mma.sync vs wgmma asked for)");
  }
}

// The Hopper backward (wgmma + TMA, hs = 64 only; dQ summed by the 128-key tiles in turns): T = 1, tails
// of the 64-row query tiles and 128-row key tiles (rows >= T come in zero-filled), exact multiples, a
// peaky softmax, GPT-2's shape (8 key tiles taking turns on each query tile). check_attention runs it twice on poisoned outputs and
// scratch: the results must be bit-identical. Runs on a 9.0 device with the sm_90a code; skips elsewhere.
TEST(AttentionWgmmaBackward, MatchesCpu) {
  if (!kernels::attention_bwd_wgmma_available()) GTEST_SKIP() << "needs compute capability 9.0 and sm_90a code";
  BackwardPathScope path(kernels::AttentionBackwardPath::kWgmma);
  uint32_t seed = 1900;
  for (const Shape& s : kWgmmaShapes)
    check_attention<bf16>(s, false, seed += 10);
  check_attention<bf16>(kGpt2Shape, false, 17);
}

// One small shape: two key tiles taking turns at dQ, tails of both tile sizes, both consumer warpgroups'
// keys. Small enough for compute-sanitizer's racecheck (tools/gpu-phase.sh B), which checks what the CPU
// emulator cannot: the named barriers around the shared dS^T tile (tests/emu/README.md, Limits).
TEST(AttentionWgmmaBackward, TwoKeyTilesMatchCpu) {
  if (!kernels::attention_bwd_wgmma_available()) GTEST_SKIP() << "needs compute capability 9.0 and sm_90a code";
  BackwardPathScope path(kernels::AttentionBackwardPath::kWgmma);
  check_attention<bf16>(Shape{1, 200, 128, 2}, false, 1950);
}

// dq/dk/dv of one bf16 backward on `path` (after the default forward), outputs poisoned first.
std::vector<float> backward_on_path(const Shape& s, kernels::AttentionBackwardPath path, uint32_t seed) {
  Buffers d(s, seed);
  kernels::attention_forward_cuda<bf16>(d.out.data(), d.lse.data(), d.qkv.data(), s.B, s.T, s.C, s.NH, nullptr);
  BackwardPathScope scope(path);
  poison(d.dqkv.data(), d.dqkv.bytes());
  poison(d.scratch.data(), d.scratch.bytes());
  kernels::attention_backward_cuda<bf16>(d.dqkv.data(), d.scratch.data(), d.dout.data(), d.qkv.data(), d.out.data(),
                                         d.lse.data(), s.B, s.T, s.C, s.NH, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return d.dqkv.download();
}

// The path each call ran is recorded (gpt2-train's "kernels:" line; tools/gpu-phase.sh's opt-in steps
// check it): what was asked for where it applies, mma.sync where the wgmma kernel does not.
TEST(AttentionWgmmaForward, RecordsThePathItRan) {
  using P = kernels::AttentionForwardPath;
  const bool wgmma = kernels::attention_fwd_wgmma_available();
  const struct {
    P path;
    Shape shape;
    const char* want;
  } cases[] = {{P::kMmaSync, Shape{2, 128, 128, 2}, "attention forward: mma.sync"},
               {P::kWgmma, Shape{2, 128, 128, 2}, wgmma ? "attention forward: wgmma" : "attention forward: mma.sync"},
               {P::kWgmmaPingPong, Shape{2, 128, 128, 2},
                wgmma ? "attention forward: wgmma-pingpong" : "attention forward: mma.sync"},
               {P::kWgmma, Shape{2, 200, 320, 4}, "attention forward: mma.sync"}};  // head size 80
  for (const auto& c : cases) {
    kernels::reset_kernel_paths();
    forward_on_path(c.shape, c.path, 73);
    EXPECT_EQ(kernels::kernel_paths_used(), c.want) << name(c.shape);
  }
  kernels::reset_kernel_paths();
  backward_on_path(Shape{2, 128, 128, 2}, kernels::AttentionBackwardPath::kAccumulateDq, 74);
  EXPECT_NE(kernels::kernel_paths_used().find("attention backward: accumulate-dq"), std::string::npos)
      << kernels::kernel_paths_used();
  kernels::reset_kernel_paths();
  backward_on_path(Shape{2, 128, 128, 2}, kernels::AttentionBackwardPath::kStoreDs, 74);
  EXPECT_NE(kernels::kernel_paths_used().find("attention backward: store-ds"), std::string::npos)
      << kernels::kernel_paths_used();
  kernels::reset_kernel_paths();
  backward_on_path(Shape{2, 128, 128, 2}, kernels::AttentionBackwardPath::kWgmmaStoreDs, 74);
  const std::string want =
      kernels::attention_bwd_wgmma_available() ? "attention backward: wgmma-store-ds" : "attention backward: store-ds";
  EXPECT_NE(kernels::kernel_paths_used().find(want), std::string::npos) << kernels::kernel_paths_used();
}

// The wgmma backward and the mma.sync one compute the same dq/dk/dv up to summation order (a few bf16
// ulps), at GPT-2's head count with T not a multiple of the tiles. Skips off 9.0.
TEST(AttentionWgmmaBackward, AgreesWithRecomputeDq) {
  if (!kernels::attention_bwd_wgmma_available()) GTEST_SKIP() << "needs compute capability 9.0 and sm_90a code";
  const Shape s = {2, 333, 768, 12};
  const std::vector<float> mma = backward_on_path(s, kernels::AttentionBackwardPath::kRecomputeDq, 82);
  const std::vector<float> wgmma = backward_on_path(s, kernels::AttentionBackwardPath::kWgmma, 82);
  EXPECT_LE(test::max_abs_diff(mma, wgmma), 4.0 / 256 * test::max_abs(mma)) << "dqkv";
}

// Two runs of the wgmma backward at GPT-2's shape give the same bits: dQ is summed in turn order whatever
// the blocks' timing (dq_turns.cuh). Skips off 9.0.
TEST(AttentionWgmmaBackward, Deterministic) {
  if (!kernels::attention_bwd_wgmma_available()) GTEST_SKIP() << "needs compute capability 9.0 and sm_90a code";
  const std::vector<float> a = backward_on_path(kGpt2Shape, kernels::AttentionBackwardPath::kWgmma, 92);
  const std::vector<float> b = backward_on_path(kGpt2Shape, kernels::AttentionBackwardPath::kWgmma, 92);
  expect_bit_identical(a, b, "dqkv (two runs)");
}

// A wgmma backward asked for where it does not apply (head sizes other than 64; any device other than 9.0)
// gives the bits of the path it falls back to. Runs on every GPU.
void expect_backward_falls_back(kernels::AttentionBackwardPath asked, kernels::AttentionBackwardPath fallback,
                                uint32_t seed) {
  for (const Shape& s : {Shape{2, 200, 320, 4}, Shape{1, 129, 512, 4}, Shape{2, 150, 256, 4}}) {
    if (s.C / s.NH == 64 && kernels::attention_bwd_wgmma_available()) continue;  // it applies there
    SCOPED_TRACE(name(s));
    const std::vector<float> ran = backward_on_path(s, fallback, seed);
    const std::vector<float> got = backward_on_path(s, asked, seed);
    expect_bit_identical(ran, got, "dqkv (the fallback vs the path asked for)");
  }
}

// The wgmma backward falls back to recompute-dq.
TEST(AttentionWgmmaBackward, FallsBackToRecomputeDqWhereItDoesNotApply) {
  expect_backward_falls_back(kernels::AttentionBackwardPath::kWgmma, kernels::AttentionBackwardPath::kRecomputeDq, 102);
}

// The wgmma dK/dV kernel storing dS (causal tiles, as store-ds) for store-ds's dQ launch: the wgmma shapes
// (T = 1; tails of the 64-query and 128-key tiles, where consumer 1's keys of the last key tile may lie past
// every DsTiles row; exact multiples; a peaky softmax) and GPT-2's. check_attention poisons the scratch
// with NaN: a dS^T tile the writer warp left out and the dQ launch reads shows. Skips off 9.0.
TEST(AttentionWgmmaStoreDs, MatchesCpu) {
  if (!kernels::attention_bwd_wgmma_available()) GTEST_SKIP() << "needs compute capability 9.0 and sm_90a code";
  BackwardPathScope path(kernels::AttentionBackwardPath::kWgmmaStoreDs);
  uint32_t seed = 2300;
  for (const Shape& s : kWgmmaShapes) check_attention<bf16>(s, false, seed += 10);
  check_attention<bf16>(kGpt2Shape, false, 23);
}

// One small shape for compute-sanitizer (tools/gpu-phase.sh B) and the emulator: two key tiles, tails of
// both tile sizes, both consumers' halves written from both dS^T buffers.
TEST(AttentionWgmmaStoreDs, TwoKeyTilesMatchCpu) {
  if (!kernels::attention_bwd_wgmma_available()) GTEST_SKIP() << "needs compute capability 9.0 and sm_90a code";
  BackwardPathScope path(kernels::AttentionBackwardPath::kWgmmaStoreDs);
  check_attention<bf16>(Shape{1, 200, 128, 2}, false, 2350);
}

// Its dK/dV kernel is the wgmma backward's without the dQ share: dk and dv the same bits; dq summed from the
// stored dS in another order (a few ulps). T not a multiple of the tiles. Skips off 9.0.
TEST(AttentionWgmmaStoreDs, AgreesWithWgmma) {
  if (!kernels::attention_bwd_wgmma_available()) GTEST_SKIP() << "needs compute capability 9.0 and sm_90a code";
  expect_same_dkdv({2, 333, 384, 6}, kernels::AttentionBackwardPath::kWgmma,
                   kernels::AttentionBackwardPath::kWgmmaStoreDs, 83);
}

// wgmma-store-ds falls back to store-ds on the mma.sync kernels.
TEST(AttentionWgmmaStoreDs, FallsBackToStoreDsWhereItDoesNotApply) {
  expect_backward_falls_back(kernels::AttentionBackwardPath::kWgmmaStoreDs, kernels::AttentionBackwardPath::kStoreDs,
                             103);
}

TEST(AttentionFallback, GenericPathMatchesCpuAtTensorCoreHeadSizes) {
  uint32_t seed = 500;
  for (const Shape& s : kTensorCoreShapes) check_attention<bf16>(s, true, seed += 10);
}

TEST(AttentionFallback, GenericPathMatchesCpuAtGpt2Shape) {
  check_attention<bf16>(kGpt2Shape, true, 9);
}

// The tensor-core and SIMT paths compute the same function: their bf16 outputs agree to a few bf16 ulps.
TEST(AttentionFallback, TensorCoreAndGenericPathsAgree) {
  const Shape s = {2, 200, 256, 4};
  Buffers d(s, 42);
  std::vector<float> out[2], lse[2], dqkv[2];
  for (int generic = 0; generic < 2; ++generic) {
    kernels::attention_force_generic(generic == 1);
    kernels::attention_forward_cuda<bf16>(d.out.data(), d.lse.data(), d.qkv.data(), s.B, s.T, s.C, s.NH, nullptr);
    kernels::attention_backward_cuda<bf16>(d.dqkv.data(), d.scratch.data(), d.dout.data(), d.qkv.data(), d.out.data(),
                                           d.lse.data(), s.B, s.T, s.C, s.NH, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    out[generic] = d.out.download();
    lse[generic] = d.lse.download();
    dqkv[generic] = d.dqkv.download();
  }
  kernels::attention_force_generic(false);
  EXPECT_LE(test::max_abs_diff(out[0], out[1]), 4.0 / 256 * test::max_abs(out[1]));
  EXPECT_LE(test::max_abs_diff(lse[0], lse[1]), 1e-4 * std::max(1.0, test::max_abs(lse[1])));
  EXPECT_LE(test::max_abs_diff(dqkv[0], dqkv[1]), 4.0 / 256 * test::max_abs(dqkv[1]));
}

TEST(AttentionDeathTest, HeadSizeAbove128IsRejected) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(kernels::attention_forward_cuda<float>(nullptr, nullptr, nullptr, 1, 8, 1024, 4, nullptr),
               "head size hs=C/NH=256");
  EXPECT_DEATH(kernels::attention_backward_cuda<bf16>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 8, 1040,
                                                      8, nullptr),
               "head size hs=C/NH=130");
}

// A path named in the environment that does not exist stops the process, naming the variable and the
// choices (the child process reads the environment afresh: the choice is made at the first query).
TEST(AttentionDeathTest, UnknownPathInTheEnvironmentIsRejected) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        setenv("GPT2_ATTENTION_FWD", "fast", 1);
        (void)kernels::attention_forward_path();
      },
      "GPT2_ATTENTION_FWD='fast' is not a forward path: use mma-sync");
  EXPECT_DEATH(
      {
        setenv("GPT2_ATTENTION_BWD", "atomic", 1);
        (void)kernels::attention_backward_path();
      },
      "GPT2_ATTENTION_BWD='atomic' is not a backward path: use recompute-dq");
}

}  // namespace
}  // namespace gpt2
