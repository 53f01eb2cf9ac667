// Generation with a key/value cache on the GPU:
//   attention_decode_cuda (kernels/attention/attention_decode.cu) against attention_decode_cpu over a
//   sweep of shapes (hs 9..128, len = 1, len = maxT = 37, positions past len poisoned with NaN), both
//   storage types, bit-identical repeats and the argument checks;
//   GPT2Cuda::decode_step against GPT2::decode_step over 20 positions (fp32: 1e-4 norm-wise; bf16:
//   cosine > 0.99 and the same argmax on most positions), both GEMM backends, the cache filled to
//   max_seq_len, reset_cache/set_params, and the shared sampling loop (train/sample.hpp) on the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention/attention.hpp"
#include "kernels/attention/attention_cuda.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/gemm/gemm.hpp"
#include "model/gpt2.hpp"
#include "model/gpt2_cuda.hpp"
#include "tests/gpu/gpu_test_util.hpp"
#include "train/sample.hpp"

namespace gpt2 {
namespace {

// ================================================================================================
// attention_decode_cuda
// ================================================================================================

struct DecodeShape {
  int C, NH, maxT, len;
  float input_scale = 1.0f;  // std of q, k, v: larger -> peakier softmax
};

std::string name(const DecodeShape& s) {
  return "C=" + std::to_string(s.C) + " NH=" + std::to_string(s.NH) + " hs=" + std::to_string(s.C / s.NH) +
         " maxT=" + std::to_string(s.maxT) + " len=" + std::to_string(s.len);
}

// The naive bf16 chain of attention_decode_cpu: probabilities stored in bf16 before the value product,
// the output rounded to bf16.
std::vector<float> naive_bf16_decode(const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, const DecodeShape& s) {
  const int hs = s.C / s.NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> out(s.C, 0.0f), a(s.len);
  for (int h = 0; h < s.NH; ++h) {
    const size_t head = static_cast<size_t>(h) * s.maxT * hs;
    float mx = -INFINITY;
    for (int t = 0; t < s.len; ++t) {
      float dot = 0.0f;
      for (int i = 0; i < hs; ++i) dot += q[h * hs + i] * k[head + static_cast<size_t>(t) * hs + i];
      a[t] = dot * scale;
      mx = std::max(mx, a[t]);
    }
    float sum = 0.0f;
    for (int t = 0; t < s.len; ++t) sum += a[t] = std::exp(a[t] - mx);
    for (int t = 0; t < s.len; ++t) {
      const float p = test::round_bf16(a[t] / sum);
      for (int i = 0; i < hs; ++i) out[h * hs + i] += p * v[head + static_cast<size_t>(t) * hs + i];
    }
  }
  return test::round_bf16(out);
}

template <class T>
void check_decode(const DecodeShape& s, uint32_t seed) {
  SCOPED_TRACE(name(s) + (std::is_same_v<T, float> ? " fp32" : " bf16"));
  const int hs = s.C / s.NH;
  const size_t n_cache = static_cast<size_t>(s.NH) * s.maxT * hs;
  const std::vector<float> q = test::round_to<T>(test::random_vec(s.C, seed, s.input_scale));
  std::vector<float> k = test::round_to<T>(test::random_vec(n_cache, seed + 1, s.input_scale));
  std::vector<float> v = test::round_to<T>(test::random_vec(n_cache, seed + 2, s.input_scale));
  // Positions len..maxT-1 are not part of the cache yet: NaN there shows any read of them.
  for (int h = 0; h < s.NH; ++h)
    for (int t = s.len; t < s.maxT; ++t)
      for (int i = 0; i < hs; ++i) {
        k[(static_cast<size_t>(h) * s.maxT + t) * hs + i] = NAN;
        v[(static_cast<size_t>(h) * s.maxT + t) * hs + i] = NAN;
      }

  std::vector<float> ref(s.C);
  kernels::attention_decode_cpu(ref.data(), q.data(), k.data(), v.data(), s.len, s.maxT, s.C, s.NH);
  std::vector<float> naive;
  if constexpr (!std::is_same_v<T, float>) naive = naive_bf16_decode(q, k, v, s);

  DeviceBuffer<T> d_q, d_k, d_v, d_out(s.C);
  d_q.upload(q);
  d_k.upload(k);
  d_v.upload(v);
  CudaStream stream;
  std::vector<float> out[2];
  for (int run = 0; run < 2; ++run) {
    CUDA_CHECK(cudaMemsetAsync(d_out.data(), 0xff, d_out.bytes(), stream.get()));  // NaN: every element is written
    kernels::attention_decode_cuda<T>(d_out.data(), d_q.data(), d_k.data(), d_v.data(), s.len, s.maxT, s.C, s.NH,
                                      stream.get());
    stream.sync();
    out[run] = d_out.download();
  }
  test::expect_close<T>(out[0], ref, naive, "decode out");
  ASSERT_EQ(out[0].size(), out[1].size());
  EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0)
      << "decode out differs between two runs";
}

// hs = 24 (C=72, NH=3) and 64 as in GPT-2, len = 1 and len = maxT = 37, odd head sizes, hs = 128 (the
// largest), a 1024-position cache, a peaky softmax.
const DecodeShape kDecodeShapes[] = {
    {72, 3, 37, 1},     {72, 3, 37, 37},  {72, 3, 37, 20},       {128, 2, 37, 37},   {128, 2, 37, 1},
    {64, 1, 5, 3},      {63, 7, 16, 9},   {72, 1, 40, 33},       {256, 2, 200, 150}, {768, 12, 1024, 1024},
    {768, 12, 1024, 7}, {384, 6, 64, 64}, {72, 3, 37, 37, 4.0f},
};

template <class T>
class AttentionDecodeTest : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(AttentionDecodeTest, StorageTypes);

TYPED_TEST(AttentionDecodeTest, MatchesCpu) {
  uint32_t seed = 300;
  for (const DecodeShape& s : kDecodeShapes) check_decode<TypeParam>(s, seed += 10);
}

// The decode kernel computes the last row of the causal attention forward.
TEST(AttentionDecode, EqualsLastRowOfFullForward) {
  const int T = 37, C = 72, NH = 3, hs = C / NH;
  const std::vector<float> qkv = test::random_vec(static_cast<size_t>(T) * 3 * C, 77);
  std::vector<float> full(static_cast<size_t>(T) * C), att(static_cast<size_t>(NH) * T * T);
  kernels::attention_forward_cpu(full.data(), att.data(), qkv.data(), 1, T, C, NH);
  std::vector<float> k(static_cast<size_t>(NH) * T * hs), v(k.size());
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < hs; ++i) {
        k[(static_cast<size_t>(h) * T + t) * hs + i] = qkv[static_cast<size_t>(t) * 3 * C + C + h * hs + i];
        v[(static_cast<size_t>(h) * T + t) * hs + i] = qkv[static_cast<size_t>(t) * 3 * C + 2 * C + h * hs + i];
      }
  DeviceBuffer<float> d_q, d_k, d_v, d_out(C);
  d_q.upload(qkv.data() + static_cast<size_t>(T - 1) * 3 * C, C);
  d_k.upload(k);
  d_v.upload(v);
  kernels::attention_decode_cuda<float>(d_out.data(), d_q.data(), d_k.data(), d_v.data(), T, T, C, NH, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> last(full.end() - C, full.end());
  test::expect_close_fp32(d_out.download(), last, "last row of attention_forward_cpu");
}

TEST(AttentionDecodeDeathTest, RejectsBadArguments) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the binary: no fork of a CUDA process
  DeviceBuffer<float> buf(8);
  float* p = buf.data();
  EXPECT_DEATH(kernels::attention_decode_cuda<float>(p, p, p, p, 1, 4, 1040, 8, nullptr), "head size 130");
  EXPECT_DEATH(kernels::attention_decode_cuda<float>(p, p, p, p, 38, 37, 72, 3, nullptr), "len=38 with maxT=37");
  EXPECT_DEATH(kernels::attention_decode_cuda<float>(p, p, p, p, 0, 37, 72, 3, nullptr), "len=0");
  EXPECT_DEATH(kernels::attention_decode_cuda<bf16>(nullptr, nullptr, nullptr, nullptr, 1, 4, 72, 3, nullptr),
               "null pointer");
}

// ================================================================================================
// GPT2Cuda::decode_step
// ================================================================================================

struct ModelCase {
  const char* name;
  int L, NH, C, V, maxT;
};
// Awkward first (3 heads of 24, a vocabulary that is not a multiple of 128, a cache of exactly the 20
// decoded positions), then head size 64 as in every GPT-2 preset.
const ModelCase kModelCases[] = {{"awkward", 2, 3, 72, 300, 20}, {"hs64", 2, 2, 128, 256, 128}};
constexpr int kPositions = 20;

struct Param {
  Precision precision;
  kernels::GemmBackend gemm;
};

std::string param_name(const testing::TestParamInfo<Param>& p) {
  return std::string(name_of(p.param.precision)) +
         (p.param.gemm == kernels::GemmBackend::kHand ? "_hand" : "_cublaslt");
}

GPT2Config make_config(const ModelCase& c) {
  GPT2Config cfg;
  cfg.n_layer = c.L;
  cfg.n_head = c.NH;
  cfg.n_embd = c.C;
  cfg.vocab_size = c.V;
  cfg.max_seq_len = c.maxT;
  return cfg;
}

// A CPU model with the weights the GPU will hold: rounded to bf16 for a bf16 GPU model, so that the
// comparison sees only the rounding of the activations.
void init_cpu(GPT2& cpu, Precision p, uint64_t seed) {
  cpu.init(seed);
  if (p == Precision::kBf16) cpu.params() = test::round_bf16(cpu.params());
}

int32_t token_at(int t, int V) {
  return static_cast<int32_t>((t * 37 + 11) % V);
}

double cosine(const float* a, const float* b, int n) {
  double ab = 0, aa = 0, bb = 0;
  for (int i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return (aa == 0 && bb == 0) ? 1.0 : ab / std::sqrt(aa * bb + 1e-300);
}

class ModelDecode : public testing::TestWithParam<Param> {};

TEST_P(ModelDecode, LogitsMatchCpuDecode) {
  const Param prm = GetParam();
  const bool fp32 = prm.precision == Precision::kFp32;
  kernels::set_cpu_threads(2);
  for (const ModelCase& c : kModelCases) {
    SCOPED_TRACE(c.name);
    const GPT2Config cfg = make_config(c);
    GPT2 cpu(cfg);
    init_cpu(cpu, prm.precision, 1234);
    CudaStream stream;
    GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
    gpu.set_params(cpu.params().data());
    EXPECT_EQ(gpu.cache_len(), 0);
    KVCache cache;
    int same_argmax = 0;
    for (int t = 0; t < kPositions; ++t) {
      SCOPED_TRACE("position " + std::to_string(t));
      const int32_t tok = token_at(t, c.V);
      const float* ref = cpu.decode_step(tok, &cache);
      const float* got = gpu.decode_step(tok);
      double err = 0, scale = 1e-30;
      bool finite = true;
      for (int j = 0; j < c.V; ++j) {
        finite = finite && std::isfinite(got[j]);
        err = std::max(err, std::fabs(static_cast<double>(got[j]) - ref[j]));
        scale = std::max(scale, std::fabs(static_cast<double>(ref[j])));
      }
      ASSERT_TRUE(finite) << "non-finite GPU logits";
      if (fp32) {
        EXPECT_LE(err, 1e-4 * scale) << "max abs logit error " << err << " vs max |ref| " << scale;
      } else {
        EXPECT_GT(cosine(got, ref, c.V), 0.99);
      }
      same_argmax += std::max_element(got, got + c.V) - got == std::max_element(ref, ref + c.V) - ref;
    }
    EXPECT_EQ(gpu.cache_len(), kPositions);
    EXPECT_EQ(cache.len, kPositions);
    // fp32: the same argmax everywhere (logits agree to ~1e-6); bf16: on most positions (random weights
    // give top-2 gaps that bf16 rounding can occasionally bridge).
    EXPECT_GE(same_argmax, fp32 ? kPositions : kPositions * 4 / 5) << "positions with the CPU's argmax";
  }
}

// Bit-identical logits after reset_cache (and after set_params, which empties the cache too).
TEST_P(ModelDecode, RepeatsBitForBitAfterReset) {
  const Param prm = GetParam();
  const ModelCase& c = kModelCases[0];
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  init_cpu(cpu, prm.precision, 99);
  CudaStream stream;
  GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
  gpu.set_params(cpu.params().data());
  const int Vp = cfg.padded_vocab_size();
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    if (run == 1) gpu.reset_cache();
    if (run == 2) gpu.set_params(cpu.params().data());
    EXPECT_EQ(gpu.cache_len(), 0) << "run " << run;
    std::vector<float> logits;
    for (int t = 0; t < kPositions; ++t) {
      const float* l = gpu.decode_step(token_at(t, c.V));
      logits.insert(logits.end(), l, l + Vp);
    }
    if (run == 0) {
      first = logits;
    } else {
      ASSERT_EQ(logits.size(), first.size());
      EXPECT_EQ(std::memcmp(logits.data(), first.data(), logits.size() * sizeof(float)), 0)
          << "logits differ from the first run (run " << run << ")";
    }
  }
}

// Decoding does not disturb training: a training forward between decode steps changes nothing in the
// decoded logits, and the decode buffers do not change the training loss.
TEST_P(ModelDecode, IndependentOfTrainingForward) {
  const Param prm = GetParam();
  const ModelCase& c = kModelCases[1];
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  init_cpu(cpu, prm.precision, 5);
  CudaStream stream;
  GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
  gpu.set_params(cpu.params().data());
  const int B = 2, T = 16, Vp = cfg.padded_vocab_size();
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = token_at(i, c.V);
    tg[i] = token_at(i + 1, c.V);
  }
  const float loss_before = gpu.forward_eval(in.data(), tg.data(), B, T);
  std::vector<float> plain, mixed;
  for (int t = 0; t < 8; ++t) {
    const float* l = gpu.decode_step(token_at(t, c.V));
    plain.insert(plain.end(), l, l + Vp);
  }
  gpu.reset_cache();
  for (int t = 0; t < 8; ++t) {
    gpu.forward_train(in.data(), tg.data(), B, T, 1.0f / (B * T));
    const float* l = gpu.decode_step(token_at(t, c.V));
    mixed.insert(mixed.end(), l, l + Vp);
  }
  gpu.take_loss_sum();
  EXPECT_EQ(std::memcmp(plain.data(), mixed.data(), plain.size() * sizeof(float)), 0);
  EXPECT_EQ(gpu.forward_eval(in.data(), tg.data(), B, T), loss_before);
}

TEST_P(ModelDecode, SharedSamplingLoopRunsPastMaxSeqLen) {
  const Param prm = GetParam();
  ModelCase c = kModelCases[0];
  c.maxT = 8;  // 30 new tokens: the cache is rebuilt several times
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  init_cpu(cpu, prm.precision, 3);
  CudaStream stream;
  GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
  gpu.set_params(cpu.params().data());
  auto next_logits = [&](int32_t token, bool restart) {
    if (restart) gpu.reset_cache();
    return gpu.decode_step(token);
  };
  SampleOptions opt;
  opt.max_new_tokens = 30;
  opt.top_k = 20;
  opt.seed = 9;
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> a = generate(next_logits, c.V, c.maxT, prompt, opt);
  const std::vector<int32_t> b = generate(next_logits, c.V, c.maxT, prompt, opt);
  ASSERT_EQ(a.size(), 30u);
  EXPECT_EQ(a, b) << "the same seed gives the same tokens";
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < c.V);
  EXPECT_LE(gpu.cache_len(), c.maxT);
  if (prm.precision == Precision::kFp32) {
    // Greedy decoding: the GPU logits equal the CPU's to ~1e-6, so the argmax chain is the same.
    opt.temperature = 0.0f;
    EXPECT_EQ(generate(next_logits, c.V, c.maxT, prompt, opt), generate(cpu, prompt, opt));
  }
}

TEST_P(ModelDecode, RejectsFullCacheAndBadToken) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the binary: no fork of a CUDA process
  const Param prm = GetParam();
  ModelCase c = kModelCases[0];
  c.maxT = 4;
  const GPT2Config cfg = make_config(c);
  GPT2 cpu(cfg);
  init_cpu(cpu, prm.precision, 1);
  CudaStream stream;
  GPT2Cuda gpu(cfg, {prm.precision, prm.gemm}, stream.get());
  gpu.set_params(cpu.params().data());
  for (int t = 0; t < 4; ++t) gpu.decode_step(1);
  EXPECT_DEATH(gpu.decode_step(1), "key/value cache is full");
  gpu.reset_cache();
  EXPECT_DEATH(gpu.decode_step(c.V), "out of range");
}

INSTANTIATE_TEST_SUITE_P(Backends, ModelDecode,
                         testing::Values(Param{Precision::kFp32, kernels::GemmBackend::kCublasLt},
                                         Param{Precision::kFp32, kernels::GemmBackend::kHand},
                                         Param{Precision::kBf16, kernels::GemmBackend::kCublasLt},
                                         Param{Precision::kBf16, kernels::GemmBackend::kHand}),
                         param_name);

}  // namespace
}  // namespace gpt2
