// GPU GEMM (kernels/gemm/gemm.cu, gemm_cublaslt.cu) against a plain double-precision loop (awkward
// shapes, every transpose combination and epilogue, C +=) and against the CPU reference (gemm_cpu.cpp)
// for every product GPT-2 124M makes, at 256 rows (and 4096 for a weight gradient). Both backends, both
// storage types. Forced paths: the hand kernel's scalar tile loader and a forced split-K factor,
// cuBLASLt's unfused epilogues, misaligned pointers; the hand bf16 kernel forced to mma.sync and to
// wgmma (the latter on compute capability 9.0 only). The bias gradient fused into the weight gradient
// (weight_bias_grad_cuda). Determinism: two runs give the same bits.
// Outputs that are overwritten are poisoned with NaN first, and a guard after C catches stray writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/common/kernel_paths.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/gemm/gemm_cuda.hpp"
#include "tests/gpu/gpu_test_util.hpp"

namespace gpt2::test {
namespace {

using kernels::GemmBackend;
using kernels::GemmContext;
using kernels::GemmEpilogue;
using kernels::GemmTestHooks;
using kernels::GemmWgmmaKernel;

// (On the CPU emulator too: tests/emu/src/cublaslt_emu.cpp answers cuBLASLt's calls from its documented contract.)
constexpr GemmBackend kBackends[] = {GemmBackend::kHand, GemmBackend::kCublasLt};
constexpr GemmEpilogue kEpilogues[] = {GemmEpilogue::kNone, GemmEpilogue::kBias, GemmEpilogue::kBiasGelu,
                                       GemmEpilogue::kDGelu};
const float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 12288.0f;  // 3 * 2^12: exact in bf16 (12345 is not: it rounds to 12352)
constexpr size_t kGuard = 64;

const char* ep_name(GemmEpilogue ep) {
  switch (ep) {
    case GemmEpilogue::kNone:
      return "none";
    case GemmEpilogue::kBias:
      return "bias";
    case GemmEpilogue::kBiasGelu:
      return "bias_gelu";
    case GemmEpilogue::kDGelu:
      return "dgelu";
  }
  return "?";
}

// The GELU of the kernels (tanh approximation), in double for references and float for naive bf16.
template <class F>
F gelu_host(F x) {
  const F s = static_cast<F>(0.7978845608028654);
  return static_cast<F>(0.5) * x * (static_cast<F>(1) + std::tanh(s * (x + static_cast<F>(0.044715) * x * x * x)));
}
template <class F>
F gelu_grad_host(F x) {
  const F s = static_cast<F>(0.7978845608028654);
  const F t = std::tanh(s * (x + static_cast<F>(0.044715) * x * x * x));
  return static_cast<F>(0.5) * (static_cast<F>(1) + t) + static_cast<F>(0.5) * x * (static_cast<F>(1) - t * t) * s *
                                                             (static_cast<F>(1) + static_cast<F>(3 * 0.044715) * x * x);
}

void sync() {
  CUDA_CHECK(cudaDeviceSynchronize());
}

long bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  long bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return bad;
}

// A device copy of a host tensor at `offset` elements into its buffer (offset 1 misaligns it), with
// kGuard sentinel elements after it.
template <class T>
struct Dev {
  DeviceBuffer<T> buf;
  size_t offset = 0, n = 0;
  Dev() = default;
  Dev(const std::vector<float>& v, size_t off) : offset(off), n(v.size()) {
    std::vector<float> host(offset + n + kGuard, kSentinel);
    std::copy(v.begin(), v.end(), host.begin() + offset);
    buf.upload(host);
  }
  T* data() { return n ? buf.data() + offset : nullptr; }
  std::vector<float> get() const {
    const auto all = buf.download();
    return std::vector<float>(all.begin() + offset, all.begin() + offset + n);
  }
  long guard_writes() const {
    const auto all = buf.download();
    long bad = 0;
    for (size_t i = 0; i < offset; ++i) bad += all[i] != kSentinel;
    for (size_t i = offset + n; i < all.size(); ++i) bad += all[i] != kSentinel;
    return bad;
  }
};

// ---------------------------------------------------------------------------------------------------
// One product against the double loop.

struct GemmCase {
  int M, N, K;
  bool trans_a, trans_b;
  GemmEpilogue ep;
  bool accumulate;
  std::string str() const {
    std::ostringstream os;
    os << "M=" << M << " N=" << N << " K=" << K << (trans_a ? " A^T" : "") << (trans_b ? " B^T" : "")
       << " ep=" << ep_name(ep) << (accumulate ? " C+=" : "");
    return os.str();
  }
};

struct Inputs {
  std::vector<float> a, b, bias, aux, c0;  // rounded to the storage type; empty when unused
};
struct Outputs {
  std::vector<float> c, aux;
};

template <class T>
Inputs make_inputs(const GemmCase& g, uint32_t seed) {
  Inputs in;
  in.a = round_to<T>(random_vec(static_cast<size_t>(g.M) * g.K, seed));
  in.b = round_to<T>(random_vec(static_cast<size_t>(g.K) * g.N, seed + 1));
  const size_t mn = static_cast<size_t>(g.M) * g.N;
  if (g.ep == GemmEpilogue::kBias || g.ep == GemmEpilogue::kBiasGelu) in.bias = round_to<T>(random_vec(g.N, seed + 2));
  if (g.ep == GemmEpilogue::kDGelu) in.aux = round_to<T>(random_vec(mn, seed + 3));
  in.c0 = g.accumulate ? round_to<T>(random_vec(mn, seed + 4)) : std::vector<float>(mn, kNaN);
  return in;
}

// The exact result (double accumulation), or the naive bf16 chain (fp32 accumulation, every stored
// value rounded to bf16, the GELU taken of the rounded pre-activation). stored_product: the product is
// stored before the GELU gradient scales it (cuBLASLt's unfused dgelu: a plain bf16 product, then an
// elementwise pass), so the naive chain rounds it there too.
Outputs reference(const GemmCase& g, const Inputs& in, bool naive_bf16, bool stored_product = false) {
  const size_t mn = static_cast<size_t>(g.M) * g.N;
  Outputs out;
  out.c.resize(mn);
  if (g.ep == GemmEpilogue::kBiasGelu) out.aux.resize(mn);
  auto rnd = [&](double v) { return naive_bf16 ? static_cast<double>(round_bf16(static_cast<float>(v))) : v; };
  for (int i = 0; i < g.M; ++i) {
    for (int j = 0; j < g.N; ++j) {
      double s = 0;
      float sf = 0;
      for (int k = 0; k < g.K; ++k) {
        const float av = g.trans_a ? in.a[static_cast<size_t>(k) * g.M + i] : in.a[static_cast<size_t>(i) * g.K + k];
        const float bv = g.trans_b ? in.b[static_cast<size_t>(j) * g.K + k] : in.b[static_cast<size_t>(k) * g.N + j];
        if (naive_bf16)
          sf = std::fma(av, bv, sf);
        else
          s += static_cast<double>(av) * bv;
      }
      if (naive_bf16) s = sf;
      const size_t idx = static_cast<size_t>(i) * g.N + j;
      double v = s;
      switch (g.ep) {
        case GemmEpilogue::kNone:
          if (g.accumulate) v += in.c0[idx];
          break;
        case GemmEpilogue::kBias:
          v += in.bias[j];
          break;
        case GemmEpilogue::kBiasGelu: {
          const double pre = rnd(v + in.bias[j]);
          out.aux[idx] = static_cast<float>(pre);
          v = naive_bf16 ? gelu_host<float>(static_cast<float>(pre)) : gelu_host<double>(pre);
          break;
        }
        case GemmEpilogue::kDGelu:
          if (stored_product) v = rnd(v);
          v *= naive_bf16 ? gelu_grad_host<float>(in.aux[idx]) : gelu_grad_host<double>(in.aux[idx]);
          break;
      }
      out.c[idx] = static_cast<float>(rnd(v));
    }
  }
  return out;
}

// Runs one product on the GPU; `offset` elements of misalignment for every pointer.
template <class T>
Outputs run_gpu(GemmContext& ctx, const GemmCase& g, const Inputs& in, size_t offset, long* guard_writes = nullptr) {
  Dev<T> a(in.a, offset), b(in.b, offset), bias(in.bias, offset), c(in.c0, offset);
  const size_t mn = static_cast<size_t>(g.M) * g.N;
  Dev<T> aux(g.ep == GemmEpilogue::kDGelu
                 ? in.aux
                 : (g.ep == GemmEpilogue::kBiasGelu ? std::vector<float>(mn, kNaN) : std::vector<float>()),
             offset);
  kernels::gemm_cuda<T>(ctx, c.data(), a.data(), b.data(), bias.data(), aux.data(), g.M, g.N, g.K, g.trans_a, g.trans_b,
                        g.accumulate, g.ep, nullptr);
  sync();
  Outputs out;
  out.c = c.get();
  if (g.ep == GemmEpilogue::kBiasGelu) out.aux = aux.get();
  if (guard_writes) *guard_writes = c.guard_writes() + (g.ep == GemmEpilogue::kBiasGelu ? aux.guard_writes() : 0);
  return out;
}

template <class T>
void compare(const Outputs& gpu, const Outputs& ref, const Outputs& naive, const std::string& what) {
  expect_close<T>(gpu.c, ref.c, naive.c, (what + " C").c_str());
  if (!ref.aux.empty()) expect_close<T>(gpu.aux, ref.aux, naive.aux, (what + " aux").c_str());
}

// One context per backend for the many small cases (handle, workspaces and cuBLASLt plans reused).
// Never destroyed: it must outlive every test, and destruction order against the CUDA runtime at exit
// is not worth depending on.
GemmContext& shared_context(GemmBackend be) {
  if (be == GemmBackend::kHand) {
    static GemmContext* hand = new GemmContext(GemmBackend::kHand);
    return *hand;
  }
  static GemmContext* lt = new GemmContext(GemmBackend::kCublasLt);
  return *lt;
}

// A named set of test hooks ("" and all off: the paths the shape selects).
struct Variant {
  std::string tag;
  GemmTestHooks hooks;
};

// The variants again with the hand backend's bf16 product forced onto mma.sync, where its default is the
// wgmma kernel (compute capability 9.0): mma.sync is the default on every other GPU and the fallback here,
// so each case keeps it too. Only the variants that leave the hand kernel to the shape (split-K forced or
// not); the others already name their path, or change only cuBLASLt's.
template <class T>
std::vector<Variant> with_mma_sync(std::vector<Variant> v) {
  if (!std::is_same_v<T, bf16> || !shared_context(GemmBackend::kHand).hand_wgmma_enabled()) return v;
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) {
    const GemmTestHooks& h = v[i].hooks;
    if (h.hand_path != kernels::GemmHandPath::kAuto || h.hand_force_scalar_loads || h.lt_force_unfused_epilogue ||
        h.unfused_bias_grad)
      continue;
    Variant m = v[i];
    m.tag = "[mma.sync] " + v[i].tag;
    m.hooks.hand_path = kernels::GemmHandPath::kMmaSync;
    v.push_back(m);
  }
  return v;
}
// Each backend's default path (and mma.sync, by with_mma_sync).
template <class T>
std::vector<Variant> default_paths() {
  return with_mma_sync<T>({{"", GemmTestHooks{}}});
}

// Whether a variant's hooks change what backend `be` runs (all off: every backend's default path). A
// backend whose paths a variant leaves alone would only repeat its default run: device time that the
// lent GPU's phase A, under a deadline, has better uses for.
bool variant_changes(const GemmTestHooks& h, GemmBackend be) {
  const bool lt = h.lt_force_unfused_epilogue || h.lt_bias_grad_bf16 || h.lt_bias_grad_row_major;
  const bool hand = h.hand_force_scalar_loads || h.hand_force_splits > 0 ||
                    h.hand_path != kernels::GemmHandPath::kAuto || h.wgmma_kernel != GemmWgmmaKernel::kDefault ||
                    h.wgmma_max_blocks > 0;
  if (!lt && !hand) return true;
  return be == GemmBackend::kCublasLt ? lt : hand;
}

// Each backend under each variant that changes its path (variant_changes), in variant order.
std::vector<std::pair<Variant, GemmBackend>> runs_of(const std::vector<Variant>& variants) {
  std::vector<std::pair<Variant, GemmBackend>> runs;
  for (const Variant& v : variants)
    for (GemmBackend be : kBackends)
      if (variant_changes(v.hooks, be)) runs.emplace_back(v, be);
  return runs;
}
// The runs of a case on the paths the shapes select (and mma.sync where that is not the default).
template <class T>
std::vector<std::pair<Variant, GemmBackend>> default_runs() {
  return runs_of(default_paths<T>());
}

// run_gpu on `be`'s shared context under `hooks` (cleared again after).
template <class T>
Outputs run_hooked(GemmBackend be, const GemmTestHooks& hooks, const GemmCase& g, const Inputs& in) {
  GemmContext& ctx = shared_context(be);
  ctx.test_hooks() = hooks;
  const Outputs out = run_gpu<T>(ctx, g, in, 0);
  ctx.test_hooks() = GemmTestHooks{};
  return out;
}

// Every backend, under each variant that changes its path, on one case, against one reference.
template <class T>
void check_case(const GemmCase& g, uint32_t seed, const std::vector<Variant>& variants = default_paths<T>(),
                size_t offset = 0) {
  const Inputs in = make_inputs<T>(g, seed);
  const Outputs ref = reference(g, in, false);
  const Outputs naive = std::is_same_v<T, bf16> ? reference(g, in, true) : Outputs{};
  // cuBLASLt's dgelu runs unfused when forced, when N (its aux leading dimension) is not a multiple of 8, or
  // when cuBLASLt offers no fused algorithm (which may depend on the pointers' alignment): one more bf16
  // rounding than the fused chain (found on the emulated cuBLASLt, 2026-11-27). So cuBLASLt's dgelu is held
  // to the bound of the naive chain that rounds the product too, the looser one.
  const Outputs naive_stored = std::is_same_v<T, bf16> && g.ep == GemmEpilogue::kDGelu ? reference(g, in, true, true)
                                                                                      : Outputs{};
  for (const auto& [v, be] : runs_of(variants)) {
    const bool lt_dgelu = !naive_stored.c.empty() && be == GemmBackend::kCublasLt;
    GemmContext& ctx = shared_context(be);
    ctx.test_hooks() = v.hooks;
    long guard = 0;
    const Outputs gpu = run_gpu<T>(ctx, g, in, offset, &guard);
    ctx.test_hooks() = GemmTestHooks{};
    const std::string what = std::string(name_of(be)) + " " + v.tag + (offset ? "[offset 1] " : "") + g.str();
    compare<T>(gpu, ref, lt_dgelu ? naive_stored : naive, what);
    EXPECT_EQ(guard, 0) << what << ": elements outside C/aux were written";
  }
}

template <class T>
class GemmTest : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16>;
struct TypeNames {
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "fp32" : "bf16";
  }
};
TYPED_TEST_SUITE(GemmTest, StorageTypes, TypeNames);

struct Shape {
  int M, N, K;
};
// Not multiples of any tile: B*T = 37*3 rows with C = 72 (and 3C); odd K and N (no 16-byte rows: the
// scalar loaders and epilogues); a single element; a K long enough for split-K on a small output.
const Shape kAwkwardShapes[] = {{111, 72, 72},  {111, 216, 72},  {37, 45, 37},   {1, 1, 1},
                                {130, 136, 40}, {257, 129, 300}, {72, 100, 4100}};

// Every transpose combination, epilogue and C += on the awkward shapes.
TYPED_TEST(GemmTest, AwkwardShapesAllTransposesAndEpilogues) {
  uint32_t seed = 100;
  for (const Shape& s : kAwkwardShapes)
    for (int t = 0; t < 4; ++t) {
      for (GemmEpilogue ep : kEpilogues)
        check_case<TypeParam>({s.M, s.N, s.K, (t & 1) != 0, (t & 2) != 0, ep, false}, seed++);
      check_case<TypeParam>({s.M, s.N, s.K, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kNone, true}, seed++);
    }
}

// The hand kernel's fallbacks on shapes that would not take them: scalar tile loads, a forced split
// (3, so the last split is short; the reduction applies every epilogue); cuBLASLt's unfused epilogues.
TYPED_TEST(GemmTest, ForcedPaths) {
  std::vector<Variant> forced(3);
  forced[0].tag = "[scalar loads] ";
  forced[0].hooks.hand_force_scalar_loads = true;
  forced[1].tag = "[split 3] ";
  forced[1].hooks.hand_force_splits = 3;
  forced[2].tag = "[unfused] ";
  forced[2].hooks.lt_force_unfused_epilogue = true;
  forced = with_mma_sync<TypeParam>(forced);
  uint32_t seed = 500;
  for (const Shape& s : {Shape{111, 216, 72}, Shape{200, 136, 104}})
    for (int t = 0; t < 4; ++t) {
      for (GemmEpilogue ep : kEpilogues)
        check_case<TypeParam>({s.M, s.N, s.K, (t & 1) != 0, (t & 2) != 0, ep, false}, seed++, forced);
      check_case<TypeParam>({s.M, s.N, s.K, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kNone, true}, seed++, forced);
    }
}

// Pointers one element off 16-byte alignment: scalar loaders and epilogues, cuBLASLt with alignment 2/4. (Every
// device's hand path is mma.sync here: TMA needs 16-byte aligned operands.)
TYPED_TEST(GemmTest, MisalignedPointers) {
  const std::vector<Variant> defaults = {{"", GemmTestHooks{}}};
  uint32_t seed = 900;
  for (int t = 0; t < 4; ++t) {
    for (GemmEpilogue ep : kEpilogues)
      check_case<TypeParam>({136, 264, 72, (t & 1) != 0, (t & 2) != 0, ep, false}, seed++, defaults, 1);
    check_case<TypeParam>({136, 264, 72, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kNone, true}, seed++, defaults, 1);
  }
}

// ---------------------------------------------------------------------------------------------------
// GPT-2's products against the CPU reference (gemm_cpu.cpp).

constexpr int kC = 768, kVp = 50304;

template <class T>
std::vector<float> rnd_t(size_t n, uint32_t seed) {
  return round_to<T>(random_vec(n, seed));
}
std::vector<float> rounded_bf16(const std::vector<float>& v) {
  return round_bf16(v);
}

// Runs gemm_cuda on host tensors (C pre-filled with c_init), returns C.
template <class T>
std::vector<float> gpu_gemm(GemmContext& ctx, const std::vector<float>& c_init, const std::vector<float>& a,
                            const std::vector<float>& b, const std::vector<float>* bias, std::vector<float>* aux, int M,
                            int N, int K, bool ta, bool tb, bool acc, GemmEpilogue ep, size_t out_offset = 0) {
  // out_offset: elements of misalignment of C, bias and aux only (the operands stay aligned)
  Dev<T> dc(c_init, out_offset), da(a, 0), db(b, 0), dbias(bias ? *bias : std::vector<float>(), out_offset),
      daux(aux ? *aux : std::vector<float>(), out_offset);
  kernels::gemm_cuda<T>(ctx, dc.data(), da.data(), db.data(), dbias.data(), daux.data(), M, N, K, ta, tb, acc, ep,
                        nullptr);
  sync();
  EXPECT_EQ(dc.guard_writes(), 0) << "writes outside C";
  if (aux && ep == GemmEpilogue::kBiasGelu) *aux = daux.get();
  return dc.get();
}

// naive bf16 of an fp32 reference: the reference rounded once (identity for fp32, unused there).
template <class T>
std::vector<float> naive_of(const std::vector<float>& ref) {
  return std::is_same_v<T, bf16> ? rounded_bf16(ref) : ref;
}

// One linear layer (N rows, IC -> OC) forward and backward, as the model runs it.
template <class T>
void check_linear(GemmBackend be, int rows, int IC, int OC, bool gelu_after, uint32_t seed,
                  const GemmTestHooks& hooks = GemmTestHooks{}) {
  GemmContext ctx(be);
  ctx.test_hooks() = hooks;
  const std::string tag = std::string(name_of(be)) + " linear " + std::to_string(rows) + "x" +
                          std::to_string(IC) + "->" + std::to_string(OC) + " ";
  const size_t n_in = static_cast<size_t>(rows) * IC, n_out = static_cast<size_t>(rows) * OC;
  const auto inp = rnd_t<T>(n_in, seed), w = rnd_t<T>(static_cast<size_t>(IC) * OC, seed + 1),
             bias = rnd_t<T>(OC, seed + 2), dout = rnd_t<T>(n_out, seed + 3),
             dw0 = rnd_t<T>(static_cast<size_t>(IC) * OC, seed + 4), dbias0 = rnd_t<T>(OC, seed + 5);

  // Forward: out = inp @ w + bias (then GELU for the MLP up-projection, keeping the pre-activation).
  std::vector<float> ref(n_out);
  kernels::linear_forward_cpu(ref.data(), inp.data(), w.data(), bias.data(), rows, IC, OC);
  std::vector<float> aux(n_out, kNaN);
  const auto out = gpu_gemm<T>(ctx, std::vector<float>(n_out, kNaN), inp, w, &bias, &aux, rows, OC, IC, false, false,
                               false, gelu_after ? GemmEpilogue::kBiasGelu : GemmEpilogue::kBias);
  if (!gelu_after) {
    expect_close<T>(out, ref, naive_of<T>(ref), (tag + "forward").c_str());
  } else {
    expect_close<T>(aux, ref, naive_of<T>(ref), (tag + "forward pre-activation").c_str());
    std::vector<float> g(n_out), g_naive(n_out);
    for (size_t i = 0; i < n_out; ++i) {
      g[i] = static_cast<float>(gelu_host<double>(ref[i]));
      g_naive[i] = round_bf16(gelu_host<float>(round_bf16(ref[i])));
    }
    expect_close<T>(out, g, g_naive, (tag + "forward gelu").c_str());
  }

  // Backward on the CPU: dinp =, dw +=, dbias +=.
  std::vector<float> dinp_ref(n_in), dw_ref = dw0, dbias_ref = dbias0;
  kernels::linear_backward_cpu(dinp_ref.data(), dw_ref.data(), dbias_ref.data(), dout.data(), inp.data(), w.data(),
                               rows, IC, OC);
  // dinp = dout @ w^T
  const auto dinp = gpu_gemm<T>(ctx, std::vector<float>(n_in, kNaN), dout, w, nullptr, nullptr, rows, IC, OC, false,
                                true, false, GemmEpilogue::kNone);
  expect_close<T>(dinp, dinp_ref, naive_of<T>(dinp_ref), (tag + "dinp").c_str());
  // The same product through the GELU gradient (MLP down-projection's dinp: d pre-activation).
  {
    auto pre = rnd_t<T>(n_in, seed + 6);
    const auto dpre = gpu_gemm<T>(ctx, std::vector<float>(n_in, kNaN), dout, w, nullptr, &pre, rows, IC, OC, false,
                                  true, false, GemmEpilogue::kDGelu);
    std::vector<float> r(n_in);
    for (size_t i = 0; i < n_in; ++i) r[i] = static_cast<float>(dinp_ref[i] * gelu_grad_host<double>(pre[i]));
    expect_close<T>(dpre, r, naive_of<T>(r), (tag + "dinp * gelu'").c_str());
  }
  // dw += inp^T @ dout
  const auto dw =
      gpu_gemm<T>(ctx, dw0, inp, dout, nullptr, nullptr, IC, OC, rows, true, false, true, GemmEpilogue::kNone);
  expect_close<T>(dw, dw_ref, naive_of<T>(dw_ref), (tag + "dw +=").c_str());
  // dbias += column sums of dout
  {
    Dev<T> ddb(dbias0, 0), ddout(dout, 0);
    DeviceBuffer<char> scratch(kernels::bias_backward_scratch_bytes(rows, OC));
    kernels::bias_backward_cuda<T>(ddb.data(), scratch.data(), ddout.data(), rows, OC, nullptr);
    sync();
    expect_close<T>(ddb.get(), dbias_ref, naive_of<T>(dbias_ref), (tag + "dbias +=").c_str());
    EXPECT_EQ(ddb.guard_writes(), 0) << tag << "dbias: writes outside";
  }
}

TYPED_TEST(GemmTest, Gpt2LinearLayersAt256Rows) {
  for (const auto& [v, be] : default_runs<TypeParam>()) {
    SCOPED_TRACE(v.tag);
    check_linear<TypeParam>(be, 256, kC, 3 * kC, false, 10, v.hooks);  // attention QKV
    check_linear<TypeParam>(be, 256, kC, kC, false, 20, v.hooks);      // attention projection
    check_linear<TypeParam>(be, 256, kC, 4 * kC, true, 30, v.hooks);   // MLP up (+GELU)
    check_linear<TypeParam>(be, 256, 4 * kC, kC, false, 40, v.hooks);  // MLP down
  }
}

// The weight gradient with K = 4096 rows: the split-K path of the hand kernels.
TYPED_TEST(GemmTest, WeightGradientK4096) {
  for (const auto& [v, be] : default_runs<TypeParam>()) {
    SCOPED_TRACE(v.tag);
    check_linear<TypeParam>(be, 4096, kC, kC, false, 50, v.hooks);
  }
}

// Tied LM head: logits = lnf @ wte^T; dinp = dlogits @ wte; dwte += dlogits^T @ lnf.
TYPED_TEST(GemmTest, Gpt2LmHeadAt256Rows) {
  using T = TypeParam;
  const int rows = 256;
  const auto lnf = rnd_t<T>(static_cast<size_t>(rows) * kC, 60), wte = rnd_t<T>(static_cast<size_t>(kVp) * kC, 61),
             dlogits = rnd_t<T>(static_cast<size_t>(rows) * kVp, 62),
             dwte0 = rnd_t<T>(static_cast<size_t>(kVp) * kC, 63);
  std::vector<float> logits_ref(static_cast<size_t>(rows) * kVp), dinp_ref(static_cast<size_t>(rows) * kC),
      dwte_ref = dwte0;
  kernels::lm_head_forward_cpu(logits_ref.data(), lnf.data(), wte.data(), rows, kC, kVp);
  kernels::lm_head_backward_cpu(dinp_ref.data(), dwte_ref.data(), dlogits.data(), lnf.data(), wte.data(), rows, kC,
                                kVp);
  for (const auto& [v, be] : default_runs<T>()) {
    GemmContext ctx(be);
    ctx.test_hooks() = v.hooks;
    const std::string tag = std::string(name_of(be)) + " " + v.tag + "lm_head ";
    const auto logits = gpu_gemm<T>(ctx, std::vector<float>(logits_ref.size(), kNaN), lnf, wte, nullptr, nullptr, rows,
                                    kVp, kC, false, true, false, GemmEpilogue::kNone);
    expect_close<T>(logits, logits_ref, naive_of<T>(logits_ref), (tag + "logits").c_str());
    const auto dinp = gpu_gemm<T>(ctx, std::vector<float>(dinp_ref.size(), kNaN), dlogits, wte, nullptr, nullptr, rows,
                                  kC, kVp, false, false, false, GemmEpilogue::kNone);
    expect_close<T>(dinp, dinp_ref, naive_of<T>(dinp_ref), (tag + "dinp").c_str());
    const auto dwte =
        gpu_gemm<T>(ctx, dwte0, dlogits, lnf, nullptr, nullptr, kVp, kC, rows, true, false, true, GemmEpilogue::kNone);
    expect_close<T>(dwte, dwte_ref, naive_of<T>(dwte_ref), (tag + "dwte +=").c_str());
  }
}

// Same inputs, same bits: the split-K weight gradient (the hand kernels split it; the test checks that the
// one that runs does) and a forward product, twice each, for both backends.
TYPED_TEST(GemmTest, Deterministic) {
  using T = TypeParam;
  const int rows = 4096, IC = kC, OC = kC;  // the attention projection's dw: split on both types
  const auto inp = rnd_t<T>(static_cast<size_t>(rows) * IC, 70), dout = rnd_t<T>(static_cast<size_t>(rows) * OC, 71),
             dw0 = rnd_t<T>(static_cast<size_t>(IC) * OC, 72), w = rnd_t<T>(static_cast<size_t>(IC) * OC, 73),
             bias = rnd_t<T>(OC, 74);
  for (const auto& [v, be] : default_runs<T>()) {
    SCOPED_TRACE(v.tag);
    GemmContext ctx(be);
    ctx.test_hooks() = v.hooks;
    if (be == GemmBackend::kHand) {
      // 16-byte aligned operands (gpu_gemm's): wgmma wherever the context takes it for bf16
      const bool wgmma =
          std::is_same_v<T, bf16> && v.hooks.hand_path != kernels::GemmHandPath::kMmaSync && ctx.hand_wgmma_enabled();
      EXPECT_GT(kernels::gemm_hand_splits<T>(
                    ctx, IC, OC, rows, wgmma ? kernels::GemmHandPath::kWgmma : kernels::GemmHandPath::kMmaSync, true),
                1);
    }
    std::vector<float> runs[2], fwd[2];
    for (int r = 0; r < 2; ++r) {
      runs[r] =
          gpu_gemm<T>(ctx, dw0, inp, dout, nullptr, nullptr, IC, OC, rows, true, false, true, GemmEpilogue::kNone);
      std::vector<float> aux(static_cast<size_t>(rows) * OC, kNaN);
      fwd[r] = gpu_gemm<T>(ctx, std::vector<float>(aux.size(), kNaN), inp, w, &bias, &aux, rows, OC, IC, false, false,
                           false, GemmEpilogue::kBiasGelu);
    }
    EXPECT_EQ(bit_mismatches(runs[0], runs[1]), 0) << name_of(be) << " dw";
    EXPECT_EQ(bit_mismatches(fwd[0], fwd[1]), 0) << name_of(be) << " forward";
  }
}

// How far bf16 outputs are from their exact values rounded once. Not counted: outputs within `tol` of a
// rounding boundary (the fp32 evaluation's error) and those under 1% of the exact values' rms (cancellation).
// `twice` (optional): what C += A B gives when the product is rounded to bf16 before it is added,
// round(round(AB) + C), which cuBLASLt's non-split kernels do (H200, 2026-11-27: 23% of the outputs of a
// 128 x 512 C += over K = 1024, errors up to 2.6 ulp of the sum, all but 4 of 13118 this rounding, and
// those 4 with the product's fp32 sum on the other side of a bf16 boundary); an output equal to it (for
// the product at either end of its fp32 error) is `twice`, not missed, and not in max_ulps (its error may
// exceed an ulp of the sum where the sum cancels).
struct TwiceRounded {
  std::vector<float> lo, hi;  // round(round(AB -+ tol) + C)
};
struct RoundingMisses {
  long counted = 0, missed = 0, twice = 0;
  double max_ulps = 0;  // the largest error beyond tol, in bf16 ulps of the exact value: < 1 when rounded at all
  double share() const { return static_cast<double>(missed) / static_cast<double>(counted > 0 ? counted : 1); }
  double twice_share() const { return static_cast<double>(twice) / static_cast<double>(counted > 0 ? counted : 1); }
};

double rms_of(const std::vector<float>& v) {
  double sq = 0;
  for (float x : v) sq += static_cast<double>(x) * x;
  return std::sqrt(sq / static_cast<double>(v.empty() ? 1 : v.size()));
}

RoundingMisses rounding_misses(const std::vector<float>& gpu, const std::vector<float>& exact, float tol,
                               const TwiceRounded& twice = {}) {
  RoundingMisses r;
  const double floor = 1e-2 * rms_of(exact);
  for (size_t i = 0; i < exact.size(); ++i) {
    const float e = exact[i];
    if (std::fabs(e) < floor) continue;
    const bool as_twice =
        !twice.lo.empty() && (gpu[i] == twice.lo[i] || gpu[i] == twice.hi[i]) && gpu[i] != round_bf16(e);
    const double ulp = std::ldexp(1.0, std::ilogb(e) - 7);  // bf16 keeps 8 significant bits
    if (!as_twice) r.max_ulps = std::max(r.max_ulps, (std::fabs(static_cast<double>(gpu[i]) - e) - tol) / ulp);
    if (round_bf16(e - tol) != round_bf16(e + tol)) continue;
    ++r.counted;
    r.twice += as_twice;
    r.missed += gpu[i] != round_bf16(e) && !as_twice;
  }
  return r;
}

// round(round(product) + c0): C += A B with the product (within tol) rounded to bf16 first.
TwiceRounded rounded_twice(const std::vector<float>& product, const std::vector<float>& c0, float tol) {
  TwiceRounded out{std::vector<float>(product.size()), std::vector<float>(product.size())};
  for (size_t i = 0; i < product.size(); ++i) {
    out.lo[i] = round_bf16(round_bf16(product[i] - tol) + c0[i]);
    out.hi[i] = round_bf16(round_bf16(product[i] + tol) + c0[i]);
  }
  return out;
}

// The fp32 sum's error bound over K products of values whose exact sums have this rms.
float fp32_sum_tol(int K, const std::vector<float>& exact) {
  return static_cast<float>(2.0 * K * std::ldexp(1.0, -24) * rms_of(exact));
}

// One line a product; "unexplained" (neither rounded once nor the product rounded first) is what
// gpu-phase.sh's diagnose_lt_reduction reads. Flushed: cuBLASLt's plan lines go to stderr in between.
void report_misses(const char* backend, const std::string& what, const RoundingMisses& r) {
  std::printf("bf16 %s %s: %ld of %ld outputs not the exact value rounded once (%.2f%%), %ld the product rounded "
              "before C was added, unexplained (%.2f%%), worst %.2f ulp\n",
              backend, what.c_str(), r.missed + r.twice, r.counted, 100.0 * (r.share() + r.twice_share()), r.twice,
              100.0 * r.share(), r.max_ulps);
  std::fflush(stdout);
}

// C += A B's products: the hand kernels round once (an output that happens to equal the product rounded
// first is a miss for them); cuBLASLt may round the product first (above) but nothing else. Some outputs
// must have been counted at all.
void expect_rounded_once_or_product_first(GemmBackend be, const RoundingMisses& r, size_t outputs, const char* what) {
  EXPECT_GT(r.counted, static_cast<long>(outputs / 4)) << what << ": too few outputs away from a rounding boundary";
  if (be == GemmBackend::kHand) {
    EXPECT_LE(r.share() + r.twice_share(), 0.01) << what << ": the hand kernels round once";
  } else {
    EXPECT_LE(r.share(), 0.01) << what << ": outputs neither rounded once nor the product rounded first";
  }
}

// bf16 products are rounded once: each output is the exact C (+ C_old) rounded to bf16 (the tensor cores'
// fp32 sums are not correctly rounded: tol is 2 K 2^-24 rms(C)). A split-K that adds its parts in bf16
// (cuBLASLt's in-place and output-type reduction schemes, excluded by gemm_cublaslt.cu) would round once
// per part; the expect_close rule (the error against the largest |C|) hides that. Weight-gradient shapes,
// small M x N over a long K, are the ones a heuristic splits: 128 x 512 over 1024 rows and 64 x 64 over
// 8192 (H200, 2026-11-27: cuBLASLt split the second 6 ways, summed in fp32, and rounded it once, C += too;
// the first it did not split, and rounded its product before adding C: its C += is held to that, the
// hand kernels' to one rounding).
TEST(GemmRounding, Bf16ProductsAreRoundedOnce) {
  const GemmCase cases[] = {{128, 512, 1024, true, false, GemmEpilogue::kNone, true},
                            {64, 64, 8192, true, false, GemmEpilogue::kNone, true},
                            {64, 64, 8192, true, false, GemmEpilogue::kNone, false}};
  uint32_t seed = 2600;
  for (const GemmCase& g : cases) {
    const Inputs in = make_inputs<bf16>(g, seed);
    seed += 8;
    const std::vector<float> exact = reference(g, in, false).c;
    const GemmCase plain{g.M, g.N, g.K, g.trans_a, g.trans_b, GemmEpilogue::kNone, false};
    const std::vector<float> product = reference(plain, in, false).c;
    const TwiceRounded twice =
        g.accumulate ? rounded_twice(product, in.c0, fp32_sum_tol(g.K, product)) : TwiceRounded{};
    for (const auto& [v, be] : default_runs<bf16>()) {
      SCOPED_TRACE(std::string(name_of(be)) + " " + v.tag + g.str());
      const RoundingMisses r =
          rounding_misses(run_hooked<bf16>(be, v.hooks, g, in).c, exact, fp32_sum_tol(g.K, exact), twice);
      report_misses(name_of(be), v.tag + g.str(), r);
      expect_rounded_once_or_product_first(be, r, exact.size(), "C");
    }
  }
}

// Every product of test_gpu_train.py's model (2 layers, n_embd 128, 1024 rows a step, vocab 256) as
// gpt2_cuda.cu makes it, on each backend's default path: the products, the bias and the GELU's
// pre-activation rounded once (at most 1% missed); C += rounded once, or on cuBLASLt with its product
// rounded first; the GELU and its gradient, which each library may evaluate its own way in fp32, within
// one ulp; the weight gradient with its bias gradient (weight_bias_grad_cuda) the same as C +=.
// GPT2_CUBLASLT_LOG_PLANS=1 names the algorithm of each cuBLASLt product (cuBLASLt 13.1 on the H200,
// 2026-11-27: none split K; the bias gradient's epilogue had no algorithm at these shapes).
TEST(GemmRounding, TrainingTestModelProductsAreRoundedOnce) {
  constexpr int C = 128, rows = 1024, V = 256;
  constexpr GemmEpilogue kNone = GemmEpilogue::kNone, kBias = GemmEpilogue::kBias;
  const GemmCase cases[] = {
      {rows, 3 * C, C, false, false, kBias, false},                  // qkv
      {rows, C, C, false, false, kBias, false},                      // attention projection
      {rows, 4 * C, C, false, false, GemmEpilogue::kBiasGelu, false},  // MLP up, GELU
      {rows, C, 4 * C, false, false, kBias, false},                  // MLP down
      {rows, V, C, false, true, kNone, false},                       // logits (tied wte)
      {rows, C, V, false, false, kNone, false},                      // dlnf
      {V, C, rows, true, false, kNone, true},                        // dwte +=
      {rows, 4 * C, C, false, true, GemmEpilogue::kDGelu, false},    // MLP down's dinp, GELU gradient
      {rows, C, 4 * C, false, true, kNone, false},                   // MLP up's dinp
      {rows, C, C, false, true, kNone, false},                       // attention projection's dinp
      {rows, C, 3 * C, false, true, kNone, false},                   // qkv's dinp
  };
  uint32_t seed = 2700;
  for (const GemmCase& g : cases) {
    const Inputs in = make_inputs<bf16>(g, seed);
    seed += 8;
    const Outputs exact = reference(g, in, false);
    // the product's exact values (before any GELU): their rms sets the fp32 sum's error
    const GemmCase plain{g.M, g.N, g.K, g.trans_a, g.trans_b, kNone, false};
    const std::vector<float> product = reference(plain, in, false).c;
    const float tol = fp32_sum_tol(g.K, product);
    const TwiceRounded twice = g.accumulate ? rounded_twice(product, in.c0, tol) : TwiceRounded{};
    const bool gelu = g.ep == GemmEpilogue::kBiasGelu || g.ep == GemmEpilogue::kDGelu;
    for (const auto& [v, be] : default_runs<bf16>()) {
      SCOPED_TRACE(std::string(name_of(be)) + " " + v.tag + g.str());
      const Outputs gpu = run_hooked<bf16>(be, v.hooks, g, in);
      // The GELU of the exact pre-activation (cuBLASLt's fused epilogue) or of the stored one, rounded to
      // bf16 (the hand kernels: the backward sees the value the forward used); each output against the
      // nearer of the two.
      std::vector<float> expected = exact.c;
      if (g.ep == GemmEpilogue::kBiasGelu)
        for (size_t i = 0; i < expected.size(); ++i) {
          const float of_stored = static_cast<float>(gelu_host<double>(gpu.aux[i]));
          if (std::fabs(gpu.c[i] - of_stored) < std::fabs(gpu.c[i] - expected[i])) expected[i] = of_stored;
        }
      // GELU's slope is below 1.13 and its gradient's below 1.2: the product's error, scaled, plus fp32's own
      const RoundingMisses r =
          rounding_misses(gpu.c, expected, gelu ? 1.2f * tol + 1e-6f * rms_of(exact.c) : tol, twice);
      report_misses(name_of(be), v.tag + g.str(), r);
      EXPECT_LE(r.max_ulps, 1.0) << "an output off by more than a rounding";
      if (gelu) {
        EXPECT_GT(r.counted, static_cast<long>(exact.c.size() / 4)) << "too few outputs away from a boundary";
      } else {
        expect_rounded_once_or_product_first(be, r, exact.c.size(), "C");
      }
      if (g.ep == GemmEpilogue::kBiasGelu) {
        const RoundingMisses pre = rounding_misses(gpu.aux, exact.aux, tol);
        report_misses(name_of(be), g.str() + " pre-activation", pre);
        EXPECT_GT(pre.counted, static_cast<long>(exact.aux.size() / 4)) << "too few pre-activations counted";
        EXPECT_LE(pre.share(), 0.01) << "pre-activations rounded more than once";
        EXPECT_LE(pre.max_ulps, 1.0) << "a pre-activation off by more than a rounding";
      }
    }
  }
  // dw (IC,OC) += inp^T dout and dbias += column sums of dout, each layer's
  for (const auto& [IC, OC] : {std::pair{C, 3 * C}, std::pair{C, C}, std::pair{C, 4 * C}, std::pair{4 * C, C}}) {
    const std::vector<float> inp = round_bf16(random_vec(static_cast<size_t>(rows) * IC, seed)),
                             dout = round_bf16(random_vec(static_cast<size_t>(rows) * OC, seed + 1)),
                             dw0 = round_bf16(random_vec(static_cast<size_t>(IC) * OC, seed + 2)),
                             db0 = round_bf16(random_vec(OC, seed + 3));
    seed += 4;
    // dw is gemm_cuda's C += A^T B with A = inp, B = dout, K = rows
    Inputs in;
    in.a = inp, in.b = dout, in.c0 = dw0;
    const std::vector<float> product = reference({IC, OC, rows, true, false, kNone, false}, in, false).c;
    const std::vector<float> dw_exact = reference({IC, OC, rows, true, false, kNone, true}, in, false).c;
    const float dw_tol = fp32_sum_tol(rows, product);
    std::vector<float> column_sums(OC), db_exact(OC);
    for (int j = 0; j < OC; ++j) {
      double sum = 0;
      for (int r = 0; r < rows; ++r) sum += dout[static_cast<size_t>(r) * OC + j];
      column_sums[j] = static_cast<float>(sum);
      db_exact[j] = static_cast<float>(sum + db0[j]);
    }
    const std::string what = "weight and bias gradients IC=" + std::to_string(IC) + " OC=" + std::to_string(OC) +
                             " rows=" + std::to_string(rows);
    for (const auto& [v, be] : default_runs<bf16>()) {
      SCOPED_TRACE(std::string(name_of(be)) + " " + v.tag + what);
      Dev<bf16> d_dw(dw0, 0), d_db(db0, 0), d_inp(inp, 0), d_dout(dout, 0);
      DeviceBuffer<char> scratch(kernels::weight_bias_grad_scratch_bytes(rows, OC));
      GemmContext& ctx = shared_context(be);
      ctx.test_hooks() = v.hooks;
      kernels::weight_bias_grad_cuda<bf16>(ctx, d_dw.data(), d_db.data(), scratch.data(), d_inp.data(), d_dout.data(),
                                           rows, IC, OC, nullptr);
      ctx.test_hooks() = GemmTestHooks{};
      sync();
      const RoundingMisses dw = rounding_misses(d_dw.get(), dw_exact, dw_tol, rounded_twice(product, dw0, dw_tol));
      const RoundingMisses db = rounding_misses(d_db.get(), db_exact, fp32_sum_tol(rows, column_sums));
      report_misses(name_of(be), v.tag + what + " dw", dw);
      report_misses(name_of(be), v.tag + what + " dbias", db);
      expect_rounded_once_or_product_first(be, dw, dw_exact.size(), "dw");
      EXPECT_LE(dw.max_ulps, 1.0) << "dw off by more than a rounding";
      EXPECT_GT(db.counted, static_cast<long>(db_exact.size() / 4)) << "too few dbias outputs counted";
      EXPECT_LE(db.share(), 0.01) << "dbias rounded more than once";
      EXPECT_LE(db.max_ulps, 1.0) << "dbias off by more than a rounding";
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The hand bf16 GEMM's two kernels, each forced: mma.sync (sm_80, every GPU) and wgmma + TMA (sm_90a,
// compute capability 9.0 with a build for architecture 90; skipped elsewhere).

GemmTestHooks path_hooks(kernels::GemmHandPath path, int splits = 0,
                         GemmWgmmaKernel wgmma_kernel = GemmWgmmaKernel::kDefault) {
  GemmTestHooks h;
  h.hand_path = path;
  h.hand_force_splits = splits;
  h.wgmma_kernel = wgmma_kernel;
  return h;
}

// The wgmma kernel's tiles and schedules: every GemmWgmma test runs each.
struct WgmmaTile {
  GemmWgmmaKernel kernel;
  const char* tag;
};
const WgmmaTile kWgmmaTiles[] = {{GemmWgmmaKernel::k128x128, "[wgmma 128x128] "},
                                 {GemmWgmmaKernel::k128x256, "[wgmma 128x256] "},
                                 {GemmWgmmaKernel::k128x128PingPong, "[wgmma 128x128-pingpong] "}};

// Shapes whose every leading dimension is a multiple of 8 (TMA takes them, so the wgmma path cannot fall
// back), none a multiple of the 128x128x64 tile; a single 8x8x8 tile (boxes mostly out of bounds); a long
// K on a small output (split-K); and 110 tiles, which on fewer SMs than that (or with the grid capped:
// ManyUnitsPerBlock) makes persistent blocks take several tiles.
const Shape kTmaShapes[] = {{136, 72, 72}, {8, 8, 8}, {200, 136, 104}, {72, 104, 4104}, {1160, 1288, 200}};

// The cuBLASLt diagnosis switches (and the hand GEMM's A/B switch) take only their documented values: a typo
// is an error that names the variable, not a run of the default that looks like the diagnosis.
TEST(GemmCublasLtEnvironment, UnknownValuesAreErrors) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the binary: no fork of a CUDA process
  struct Case {
    const char* var;
    const char* bad;
    GemmBackend backend;  // the context that reads it
  };
  const Case cases[] = {{"GPT2_CUBLASLT_REDUCTION", "fp16", GemmBackend::kCublasLt},
                        {"GPT2_CUBLASLT_LOG_PLANS", "yes", GemmBackend::kCublasLt},
                        {"GPT2_CUBLASLT_EPILOGUES", "none", GemmBackend::kCublasLt},
                        {"GPT2_CUBLASLT_BIAS_GRAD", "fp16", GemmBackend::kCublasLt},
                        {"GPT2_GEMM_AUX_PREFETCH", "off", GemmBackend::kHand},
                        {"GPT2_GEMM_STORE", "tma", GemmBackend::kHand}};
  for (const auto& [var, bad, backend] : cases) {
    const char* was = std::getenv(var);
    const std::string saved = was != nullptr ? was : "";
    ASSERT_EQ(setenv(var, bad, 1), 0);
    EXPECT_DEATH(GemmContext ctx(backend), std::string(var) + "='" + bad + "'");
    was != nullptr ? setenv(var, saved.c_str(), 1) : unsetenv(var);
  }
}

// A new context of `be` under each of `values` of the environment variable `var` in turn ("": unset): the
// test hook `hook_of` reads must be set for the value `on` alone. The variable is restored after.
template <class HookOf>
void expect_env_sets_hook(const char* var, GemmBackend be, std::initializer_list<const char*> values, const char* on,
                          HookOf hook_of) {
  const char* was = std::getenv(var);
  const std::string saved = was != nullptr ? was : "";
  for (const char* value : values) {
    SCOPED_TRACE(std::string(var) + "='" + value + "'");
    ASSERT_EQ(*value ? setenv(var, value, 1) : unsetenv(var), 0);
    const GemmContext ctx(be);
    EXPECT_EQ(hook_of(ctx.test_hooks()), std::string(value) == on);
  }
  was != nullptr ? setenv(var, saved.c_str(), 1) : unsetenv(var);
}

// GPT2_CUBLASLT_BIAS_GRAD=bf16 asks a cuBLASLt context for the bias-gradient epilogue's bf16 sums (the test
// hook it sets); fp32 and unset leave the default.
TEST(GemmCublasLtEnvironment, BiasGradSums) {
  expect_env_sets_hook("GPT2_CUBLASLT_BIAS_GRAD", GemmBackend::kCublasLt, {"bf16", "fp32", ""}, "bf16",
                       [](const GemmTestHooks& h) { return h.lt_bias_grad_bf16; });
}

// GPT2_GEMM_AUX_PREFETCH=0 turns the wgmma kernels' L2 prefetch of the GELU gradient's pre-activations off (the
// hook it sets), 1 and unset leave it on (another value: UnknownValuesAreErrors).
TEST(GemmHandEnvironment, AuxPrefetchSetting) {
  expect_env_sets_hook("GPT2_GEMM_AUX_PREFETCH", GemmBackend::kHand, {"0", "1", ""}, "0",
                       [](const GemmTestHooks& h) { return h.wgmma_no_aux_prefetch; });
}

// GPT2_GEMM_STORE=bulk asks for the wgmma epilogue's bulk stores (the hook it sets); threads and unset leave the
// threads' stores.
TEST(GemmHandEnvironment, StoreSetting) {
  expect_env_sets_hook("GPT2_GEMM_STORE", GemmBackend::kHand, {"bulk", "threads", ""}, "bulk",
                       [](const GemmTestHooks& h) { return h.wgmma_bulk_store; });
}

TEST(GemmHandPaths, ForcedMmaSyncOnEveryGpu) {
  const std::vector<Variant> v = {{"[mma.sync] ", path_hooks(kernels::GemmHandPath::kMmaSync)}};
  GemmContext& ctx = shared_context(GemmBackend::kHand);
  ctx.test_hooks() = v[0].hooks;
  Dev<bf16> a(std::vector<float>(64 * 64, 1.0f), 0);
  EXPECT_EQ(kernels::gemm_hand_path(ctx, a.data(), a.data(), 64, 64, 64, false, false),
            kernels::GemmHandPath::kMmaSync);
  ctx.test_hooks() = GemmTestHooks{};
  uint32_t seed = 1100;
  for (const Shape& s : {Shape{136, 72, 72}, Shape{200, 136, 104}})
    for (int t = 0; t < 4; ++t)
      check_case<bf16>({s.M, s.N, s.K, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kBiasGelu, false}, seed++, v);
}

class GemmWgmma : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::gemm_hand_wgmma_available())
      GTEST_SKIP() << "the wgmma GEMM needs a compute capability 9.0 GPU and a build for architecture 90";
  }
};

// Every wgmma kernel as a variant of each case: one CPU reference serves them all.
std::vector<Variant> wgmma_tile_variants(int splits = 0) {
  std::vector<Variant> v;
  for (const WgmmaTile& tile : kWgmmaTiles)
    v.push_back({tile.tag, path_hooks(kernels::GemmHandPath::kWgmma, splits, tile.kernel)});
  return v;
}

// Every transpose combination (K-major and MN-major operands in both positions), epilogue and C +=.
TEST_F(GemmWgmma, AllTransposesAndEpiloguesAgainstDoubleLoop) {
  const std::vector<Variant> v = wgmma_tile_variants();
  uint32_t seed = 1200;
  for (const Shape& s : kTmaShapes) {
    if (static_cast<double>(s.M) * s.N * s.K > 1e8) continue;  // the largest: in Gpt2LinearLayersAndPersistentTiles
    for (int t = 0; t < 4; ++t) {
      for (GemmEpilogue ep : kEpilogues)
        check_case<bf16>({s.M, s.N, s.K, (t & 1) != 0, (t & 2) != 0, ep, false}, seed++, v);
      check_case<bf16>({s.M, s.N, s.K, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kNone, true}, seed++, v);
    }
  }
  // 128x256: three tiles across N, the last 8 columns wide
  for (int t = 0; t < 4; ++t)
    check_case<bf16>({136, 520, 136, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kBiasGelu, false}, seed++, v);
}

// The persistent grid capped at 3 blocks (GemmTestHooks::wgmma_max_blocks), so each block takes 20-40
// units whatever the SM count: the stage and phase counters run on across many units, and a ping-pong
// warpgroup skips more than a round of the stage ring for each unit of the other's (9 k-steps: the shape
// on which the emulator found the missing mainloop order).
TEST_F(GemmWgmma, ManyUnitsPerBlock) {
  std::vector<Variant> v = wgmma_tile_variants();
  for (Variant& x : v) x.hooks.wgmma_max_blocks = 3;
  check_case<bf16>({1160, 1288, 520, false, false, GemmEpilogue::kBias, false}, 1290, v);
  check_case<bf16>({1160, 1288, 520, true, true, GemmEpilogue::kNone, true}, 1291, v);
}

// The GELU gradient's pre-activations three ways: loaded by TMA during the products (the 128x128 kernels'
// default), prefetched into L2 by TMA during the products and read by the epilogue (the 128x256 kernel's
// default, and the 128x128 kernels' under the hook wgmma_aux_from_global), and read by the epilogue alone (the
// hook wgmma_no_aux_prefetch as well): the same bits every way, and against the CPU. 12 units on 3 blocks
// (8 on 128x256), so each consumer reloads its tile 2-4 times (the tile's barrier phases and its reuse after
// the previous epilogue; ping-pong's every other unit); row and column tails (zero-filled boxes, and boxes
// wholly past N that the prefetch skips: the emulator fails one that lies outside the tensor); 3 k-steps,
// fewer than the stages. The launch counters say which way ran.
TEST_F(GemmWgmma, DGeluPreActivationsByTmaMatchGlobalReads) {
  const int M = 392, N = 264, K = 136;
  const auto a = rnd_t<bf16>(static_cast<size_t>(M) * K, 1700), b = rnd_t<bf16>(static_cast<size_t>(N) * K, 1701);
  auto pre = rnd_t<bf16>(static_cast<size_t>(M) * N, 1702);
  for (GemmWgmmaKernel kernel : {GemmWgmmaKernel::k128x128, GemmWgmmaKernel::k128x128PingPong,
                                 GemmWgmmaKernel::k128x256}) {
    SCOPED_TRACE(kernels::gemm_wgmma_kernel_name(kernel));
    const bool room = kernel != GemmWgmmaKernel::k128x256;  // shared memory for the pre-activation tiles
    GemmContext ctx(GemmBackend::kHand);
    std::vector<float> runs[3];
    for (int way = 0; way < 3; ++way) {  // 0: the default; 1: not by TMA into shared memory; 2: nor prefetched
      SCOPED_TRACE("way " + std::to_string(way));
      ctx.test_hooks() = path_hooks(kernels::GemmHandPath::kWgmma, 0, kernel);
      ctx.test_hooks().wgmma_max_blocks = 3;
      ctx.test_hooks().wgmma_aux_from_global = way >= 1;
      ctx.test_hooks().wgmma_no_aux_prefetch = way == 2;
      runs[way] = gpu_gemm<bf16>(ctx, std::vector<float>(static_cast<size_t>(M) * N, kNaN), a, b, nullptr, &pre, M,
                                 N, K, false, true, false, GemmEpilogue::kDGelu);
      const bool by_tma = way == 0 && room, prefetched = way < 2 && !by_tma;
      EXPECT_EQ(ctx.test_hooks().wgmma_aux_tma_launches, by_tma ? 1 : 0);
      EXPECT_EQ(ctx.test_hooks().wgmma_aux_prefetch_launches, prefetched ? 1 : 0);
    }
    EXPECT_EQ(bit_mismatches(runs[0], runs[1]), 0);
    EXPECT_EQ(bit_mismatches(runs[0], runs[2]), 0);
    GemmTestHooks h = path_hooks(kernels::GemmHandPath::kWgmma, 0, kernel);
    h.wgmma_max_blocks = 3;
    check_case<bf16>({M, N, K, false, true, GemmEpilogue::kDGelu, false}, 1703,
                     {{room ? "[wgmma, aux by TMA] " : "[wgmma, aux prefetched into L2] ", h}});
  }
}

// The bulk-store epilogue (GPT2_GEMM_STORE=bulk, hook wgmma_bulk_store): the same bits as the threads' stores in
// C and the pre-activations, for each epilogue it takes (none, bias, bias + GELU) on both cooperative kernels,
// with 12 units on 3 blocks (each consumer stages rows again after its copies of the unit before: the wait
// for their reads), a row tail and a column tail (8 columns of the last tile: short copies); against the CPU,
// with nothing written outside C and the pre-activations. Where it does not apply the launch counter says so:
// ping-pong, C +=, the GELU gradient, and N not a multiple of 8 (rows of 260 bf16 are no whole 16-byte
// copies), which store as before.
TEST_F(GemmWgmma, BulkStoreMatchesThreadStores) {
  const int M = 392, K = 136;
  uint32_t seed = 1750;
  for (GemmWgmmaKernel kernel :
       {GemmWgmmaKernel::k128x128, GemmWgmmaKernel::k128x256, GemmWgmmaKernel::k128x128PingPong}) {
    SCOPED_TRACE(kernels::gemm_wgmma_kernel_name(kernel));
    const bool cooperative = kernel != GemmWgmmaKernel::k128x128PingPong;
    struct Case {
      GemmEpilogue ep;
      bool acc;
      int N;
      bool bulk;       // where the kernel is cooperative
      size_t off = 0;  // C, bias and pre-activations this many elements past a 16-byte boundary
    };
    // N = 200: a 72- or 200-column tail (partial copies); offset 4 (8 bytes): whole 4-vectors, no 16-byte copies
    const Case cases[] = {{GemmEpilogue::kNone, false, 264, true},     {GemmEpilogue::kBias, false, 264, true},
                          {GemmEpilogue::kBiasGelu, false, 264, true}, {GemmEpilogue::kNone, true, 264, false},
                          {GemmEpilogue::kDGelu, false, 264, false},   {GemmEpilogue::kBias, false, 260, false},
                          {GemmEpilogue::kBias, false, 200, true},     {GemmEpilogue::kBiasGelu, false, 264, false, 4}};
    for (const Case& cs : cases) {
      SCOPED_TRACE("epilogue " + std::to_string(static_cast<int>(cs.ep)) + (cs.acc ? " C +=" : "") + " N " +
                   std::to_string(cs.N) + " offset " + std::to_string(cs.off));
      const int N = cs.N;
      // B transposed (N x K): its leading dimension is K, so N = 260 still takes the wgmma kernel
      const auto a = rnd_t<bf16>(static_cast<size_t>(M) * K, seed),
                 b = rnd_t<bf16>(static_cast<size_t>(N) * K, seed + 1);
      const auto bias = rnd_t<bf16>(N, seed + 2), c0 = rnd_t<bf16>(static_cast<size_t>(M) * N, seed + 3);
      const auto pre = rnd_t<bf16>(static_cast<size_t>(M) * N, seed + 4);
      seed += 5;
      GemmContext ctx(GemmBackend::kHand);
      std::vector<float> c[2], aux[2];
      for (int bulk = 0; bulk < 2; ++bulk) {
        ctx.test_hooks() = path_hooks(kernels::GemmHandPath::kWgmma, 0, kernel);
        ctx.test_hooks().wgmma_max_blocks = 3;
        ctx.test_hooks().wgmma_bulk_store = bulk == 1;
        aux[bulk] = cs.ep == GemmEpilogue::kBiasGelu ? std::vector<float>(static_cast<size_t>(M) * N, kNaN) : pre;
        c[bulk] = gpu_gemm<bf16>(ctx, cs.acc ? c0 : std::vector<float>(static_cast<size_t>(M) * N, kNaN), a, b, &bias,
                                 &aux[bulk], M, N, K, false, true, cs.acc, cs.ep, cs.off);
        EXPECT_EQ(ctx.test_hooks().wgmma_bulk_store_launches, bulk == 1 && cs.bulk && cooperative ? 1 : 0);
      }
      EXPECT_EQ(bit_mismatches(c[0], c[1]), 0) << "C";
      EXPECT_EQ(bit_mismatches(aux[0], aux[1]), 0) << "pre-activations";
      GemmTestHooks h = path_hooks(kernels::GemmHandPath::kWgmma, 0, kernel);
      h.wgmma_max_blocks = 3;
      h.wgmma_bulk_store = true;
      if (cs.off == 0) check_case<bf16>({M, N, K, false, true, cs.ep, cs.acc}, seed++, {{"[wgmma, bulk stores] ", h}});
    }
  }
  // A split tail: the whole tiles' launch stores with bulk copies, the split tiles' partials do not (the
  // reduction finishes them): every tile against the CPU.
  GemmTestHooks h = path_hooks(kernels::GemmHandPath::kWgmma, 2, GemmWgmmaKernel::k128x256);
  h.hand_force_tail_from = 2;
  h.wgmma_bulk_store = true;
  check_case<bf16>({392, 776, 264, false, false, GemmEpilogue::kBiasGelu, false}, seed,
                   {{"[wgmma, bulk, split tail] ", h}});
}

// The forced path really is wgmma for TMA-friendly operands, and mma.sync (the fallback) for a base one
// element off 16-byte alignment or a leading dimension that is not a multiple of 8.
TEST_F(GemmWgmma, PathSelectionAndFallback) {
  GemmContext ctx(GemmBackend::kHand);
  ctx.test_hooks() = path_hooks(kernels::GemmHandPath::kWgmma);
  Dev<bf16> x(std::vector<float>(4096, 1.0f), 0), y(std::vector<float>(4096, 1.0f), 1);
  using kernels::GemmHandPath;
  for (int t = 0; t < 4; ++t) {
    const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
    EXPECT_EQ(kernels::gemm_hand_path(ctx, x.data(), x.data(), 64, 64, 64, ta, tb), GemmHandPath::kWgmma) << t;
    EXPECT_EQ(kernels::gemm_hand_path(ctx, y.data(), x.data(), 64, 64, 64, ta, tb), GemmHandPath::kMmaSync) << t;
    EXPECT_EQ(kernels::gemm_hand_path(ctx, x.data(), x.data(), 63, 63, 63, ta, tb), GemmHandPath::kMmaSync) << t;
  }
  // Misaligned operands under the forced wgmma path: computed right by the fallback.
  const std::vector<Variant> v = {{"[wgmma->fallback] ", path_hooks(GemmHandPath::kWgmma)}};
  check_case<bf16>({136, 264, 72, false, false, GemmEpilogue::kBias, false}, 1300, v, 1);
  check_case<bf16>({136, 264, 72, true, true, GemmEpilogue::kNone, true}, 1301, v, 1);
}

// by-shape runs each product on the kernel gemm_wgmma_kernel_for names (weight gradients 128x256, the
// GELU gradient 128x128, the rest ping-pong), says so in the kernel paths, and computes what that kernel
// computes: the same bits.
TEST_F(GemmWgmma, ByShapeRunsTheKernelItNames) {
  using kernels::gemm_wgmma_kernel_for;
  constexpr GemmWgmmaKernel kBy = GemmWgmmaKernel::kByShape;
  EXPECT_EQ(gemm_wgmma_kernel_for(kBy, true, GemmEpilogue::kNone), GemmWgmmaKernel::k128x256);
  EXPECT_EQ(gemm_wgmma_kernel_for(kBy, false, GemmEpilogue::kDGelu), GemmWgmmaKernel::k128x128);
  EXPECT_EQ(gemm_wgmma_kernel_for(kBy, false, GemmEpilogue::kBiasGelu), GemmWgmmaKernel::k128x128PingPong);
  EXPECT_EQ(gemm_wgmma_kernel_for(kBy, false, GemmEpilogue::kNone), GemmWgmmaKernel::k128x128PingPong);
  EXPECT_EQ(gemm_wgmma_kernel_for(GemmWgmmaKernel::k128x256, false, GemmEpilogue::kDGelu), GemmWgmmaKernel::k128x256);
  const GemmCase cases[] = {{200, 264, 136, true, false, GemmEpilogue::kNone, true},    // a weight gradient
                            {200, 264, 136, false, true, GemmEpilogue::kDGelu, false},  // the GELU gradient
                            {200, 264, 136, false, false, GemmEpilogue::kBias, false}};
  const char* paths[] = {"hand wgmma 128x256", "hand wgmma 128x128", "hand wgmma 128x128-pingpong"};
  uint32_t seed = 1400;
  for (int i = 0; i < 3; ++i) {
    const GemmCase& g = cases[i];
    SCOPED_TRACE(g.str());
    const Inputs in = make_inputs<bf16>(g, seed++);
    GemmContext& ctx = shared_context(GemmBackend::kHand);
    ctx.test_hooks() = path_hooks(kernels::GemmHandPath::kWgmma);
    ctx.test_hooks().wgmma_kernel = kBy;
    kernels::reset_kernel_paths();
    const Outputs by_shape = run_gpu<bf16>(ctx, g, in, 0);
    EXPECT_EQ(kernels::kernel_paths_used(), std::string("gemm: ") + paths[i]);
    ctx.test_hooks().wgmma_kernel = gemm_wgmma_kernel_for(kBy, g.trans_a, g.ep);
    const Outputs named = run_gpu<bf16>(ctx, g, in, 0);
    ctx.test_hooks() = GemmTestHooks{};
    EXPECT_EQ(bit_mismatches(by_shape.c, named.c), 0);
  }
}

// GPT2_GEMM_SM90 picks the kernel (unset and 128x256: 128x256; 1 and 128x128: 128x128; 128x128-pingpong;
// by-shape; 0: none, mma.sync), the test hook overrides it, and any other value is an error that names the
// variable.
TEST_F(GemmWgmma, EnvironmentPicksTheTile) {
  struct Restore {  // the later tests' contexts see the caller's value again, whatever fails here
    const char* v = std::getenv("GPT2_GEMM_SM90");
    std::string saved = v != nullptr ? v : "";
    bool was_set = v != nullptr;
    ~Restore() { was_set ? setenv("GPT2_GEMM_SM90", saved.c_str(), 1) : unsetenv("GPT2_GEMM_SM90"); }
  } restore;
  struct Case {
    const char* env;
    bool enabled;
    GemmWgmmaKernel kernel;
  };
  for (const Case& c : {Case{nullptr, true, GemmWgmmaKernel::k128x256}, Case{"0", false, GemmWgmmaKernel::k128x128},
                        Case{"1", true, GemmWgmmaKernel::k128x128}, Case{"128x128", true, GemmWgmmaKernel::k128x128},
                        Case{"128x256", true, GemmWgmmaKernel::k128x256},
                        Case{"128x128-pingpong", true, GemmWgmmaKernel::k128x128PingPong},
                        Case{"by-shape", true, GemmWgmmaKernel::kByShape}}) {
    ASSERT_EQ(c.env != nullptr ? setenv("GPT2_GEMM_SM90", c.env, 1) : unsetenv("GPT2_GEMM_SM90"), 0);
    const char* what = c.env != nullptr ? c.env : "(unset)";
    GemmContext ctx(GemmBackend::kHand);
    EXPECT_EQ(ctx.hand_wgmma_enabled(), c.enabled) << what;
    EXPECT_EQ(ctx.hand_wgmma_kernel(), c.kernel) << what;
    ctx.test_hooks().wgmma_kernel = GemmWgmmaKernel::k128x128PingPong;
    EXPECT_EQ(ctx.hand_wgmma_kernel(), GemmWgmmaKernel::k128x128PingPong) << what;
  }
  ASSERT_EQ(setenv("GPT2_GEMM_SM90", "256", 1), 0);
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the binary: no fork of a CUDA process
  EXPECT_DEATH(GemmContext ctx(GemmBackend::kHand), "GPT2_GEMM_SM90='256'");
}

// A forced split (3: the last split short, in 64-wide K steps) through the split-K reduction's epilogues.
TEST_F(GemmWgmma, ForcedSplitK) {
  SCOPED_TRACE("split 3");
  const std::vector<Variant> v = wgmma_tile_variants(3);
  uint32_t seed = 1400;
  for (int t = 0; t < 4; ++t) {
    for (GemmEpilogue ep : kEpilogues)
      check_case<bf16>({200, 136, 392, (t & 1) != 0, (t & 2) != 0, ep, false}, seed++, v);
    check_case<bf16>({200, 136, 392, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kNone, true}, seed++, v);
  }
}

// A split tail (GemmSplitPlan; gemm.cu gemm_hand): tiles [0, tail_from) whole in one launch, the rest split
// 3 ways in a second, and only the tail's partials reduced. 296 x 264 has 9 tiles of 128x128 (6 of 128x256):
// tail_from 5 leaves 4 (1) in the tail, with tails of rows and columns; every transpose and epilogue, C +=,
// and the same bits twice. The model gives a tail only to over 132 tiles, hence the hooks.
TEST_F(GemmWgmma, SplitTail) {
  std::vector<Variant> v = wgmma_tile_variants(3);
  for (Variant& x : v) x.hooks.hand_force_tail_from = 5;
  uint32_t seed = 1450;
  for (int t = 0; t < 4; ++t) {
    for (GemmEpilogue ep : kEpilogues)
      check_case<bf16>({296, 264, 392, (t & 1) != 0, (t & 2) != 0, ep, false}, seed++, v);
    check_case<bf16>({296, 264, 392, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kNone, true}, seed++, v);
  }
  GemmContext ctx(GemmBackend::kHand);
  const auto a = rnd_t<bf16>(296 * 392, 1470), b = rnd_t<bf16>(392 * 264, 1471), c0 = rnd_t<bf16>(296 * 264, 1472);
  for (const Variant& x : v) {
    ctx.test_hooks() = x.hooks;
    const auto r0 = gpu_gemm<bf16>(ctx, c0, a, b, nullptr, nullptr, 296, 264, 392, true, false, true, GemmEpilogue::kNone);
    const auto r1 = gpu_gemm<bf16>(ctx, c0, a, b, nullptr, nullptr, 296, 264, 392, true, false, true, GemmEpilogue::kNone);
    EXPECT_EQ(bit_mismatches(r0, r1), 0) << x.tag << "two runs differ";
    EXPECT_EQ(ctx.test_hooks().wgmma_split_tails, 2) << x.tag << "the products did not run as a split tail";
  }
}

// The model's split tail: a weight gradient of GPT-2's MLP at 16384 rows has 144 tiles of 128x128 (132 in
// the whole wave, 12 in the tail) and takes it, split; on 128x256 tiles (72) and for qkv's (108 tiles) there
// is no tail to split. It depends on the shape and kernel alone (the bits do not depend on the device).
TEST_F(GemmWgmma, SplitTailPlan) {
  GemmContext ctx(GemmBackend::kHand);
  const auto plan = [&](GemmWgmmaKernel k, int M, int N, int K) {
    ctx.test_hooks() = path_hooks(kernels::GemmHandPath::kWgmma, 0, k);
    const kernels::GemmSplitPlan p =
        kernels::gemm_hand_split_plan<bf16>(ctx, M, N, K, kernels::GemmHandPath::kWgmma, true, GemmEpilogue::kNone);
    ctx.test_hooks() = GemmTestHooks{};
    return p;
  };
  for (int K : {8192, 16384, 65536}) {
    SCOPED_TRACE("K=" + std::to_string(K));
    for (auto [M, N] : {std::pair{4 * kC, kC}, std::pair{kC, 4 * kC}}) {
      const kernels::GemmSplitPlan p = plan(GemmWgmmaKernel::k128x128, M, N, K);
      EXPECT_EQ(p.tail_from, 132);
      EXPECT_GT(p.splits, 1);
      EXPECT_EQ(plan(GemmWgmmaKernel::k128x256, M, N, K).tail_from, 0);
    }
    EXPECT_EQ(plan(GemmWgmmaKernel::k128x128, 3 * kC, kC, K).tail_from, 0);
  }
}

// GPT-2 124M's linear layers forward and backward (dinp, dinp*gelu', dw += with split-K at 4096 rows)
// against the CPU reference, and more tiles than SMs (persistent blocks loop over tiles).
TEST_F(GemmWgmma, Gpt2LinearLayersAndPersistentTiles) {
  for (const WgmmaTile& tile : kWgmmaTiles) {
    SCOPED_TRACE(tile.tag);
    const GemmTestHooks h = path_hooks(kernels::GemmHandPath::kWgmma, 0, tile.kernel);
    check_linear<bf16>(GemmBackend::kHand, 256, kC, 3 * kC, false, 1500, h);
    check_linear<bf16>(GemmBackend::kHand, 256, kC, 4 * kC, true, 1510, h);
    check_linear<bf16>(GemmBackend::kHand, 4096, kC, kC, false, 1520, h);
    const std::vector<Variant> v = {{tile.tag, h}};
    check_case<bf16>({1160, 1288, 200, false, false, GemmEpilogue::kBiasGelu, false}, 1530, v);
    check_case<bf16>({1160, 1288, 200, true, false, GemmEpilogue::kNone, true}, 1531, v);
  }
}

// Same inputs, same bits on the wgmma path too (split-K weight gradient and a forward product).
TEST_F(GemmWgmma, Deterministic) {
  const int rows = 4096;
  const auto inp = rnd_t<bf16>(static_cast<size_t>(rows) * kC, 1600),
             dout = rnd_t<bf16>(static_cast<size_t>(rows) * kC, 1601),
             dw0 = rnd_t<bf16>(static_cast<size_t>(kC) * kC, 1602);
  GemmContext ctx(GemmBackend::kHand);
  for (const WgmmaTile& tile : kWgmmaTiles) {
    ctx.test_hooks() = path_hooks(kernels::GemmHandPath::kWgmma, 0, tile.kernel);
    std::vector<float> runs[2];
    for (auto& r : runs)
      r = gpu_gemm<bf16>(ctx, dw0, inp, dout, nullptr, nullptr, kC, kC, rows, true, false, true, GemmEpilogue::kNone);
    EXPECT_EQ(bit_mismatches(runs[0], runs[1]), 0) << tile.tag;
  }
}

// ---------------------------------------------------------------------------------------------------
// Bias gradient.

TYPED_TEST(GemmTest, BiasBackwardAccumulatesDeterministically) {
  using T = TypeParam;
  struct BShape {
    int N, OC;
  };
  uint32_t seed = 1000;
  for (const BShape& s :
       {BShape{1, 1}, BShape{111, 72}, BShape{111, 37}, BShape{300, 2304}, BShape{4096, 768}, BShape{513, 3 * 768 + 4}})
    for (size_t offset : {size_t{0}, size_t{1}}) {
      const std::string tag = "bias_backward N=" + std::to_string(s.N) + " OC=" + std::to_string(s.OC) + " offset " +
                              std::to_string(offset);
      const auto dout = rnd_t<T>(static_cast<size_t>(s.N) * s.OC, seed++), dbias0 = rnd_t<T>(s.OC, seed++);
      std::vector<float> ref = dbias0;
      kernels::bias_backward_cpu(ref.data(), dout.data(), s.N, s.OC);
      std::vector<float> got[2];
      for (int r = 0; r < 2; ++r) {
        Dev<T> db(dbias0, offset), dd(dout, offset);
        DeviceBuffer<char> scratch(kernels::bias_backward_scratch_bytes(s.N, s.OC));
        kernels::bias_backward_cuda<T>(db.data(), scratch.data(), dd.data(), s.N, s.OC, nullptr);
        sync();
        got[r] = db.get();
        EXPECT_EQ(db.guard_writes(), 0) << tag;
      }
      expect_close<T>(got[0], ref, naive_of<T>(ref), tag.c_str());
      EXPECT_EQ(bit_mismatches(got[0], got[1]), 0) << tag << ": two runs differ";
    }
}

// ---------------------------------------------------------------------------------------------------
// Weight and bias gradients in one pass (weight_bias_grad_cuda).

// weight_bias_grad_cuda on one shape and variant: dw must be gemm_cuda's product with the same hooks bit
// for bit on the hand kernels (within one bf16 ulp on cuBLASLt, whose bias-gradient epilogue may run
// another algorithm), dbias the CPU's column sums, and two runs the same bits. must_fuse: the call has
// to report the fused path (the hand kernels that sum in the GEMM).
template <class T>
void check_weight_bias_grad(GemmBackend be, const Variant& v, int rows, int IC, int OC, size_t offset, uint32_t seed,
                            bool must_fuse) {
  const std::string tag = std::string(name_of(be)) + " " + v.tag + "rows=" + std::to_string(rows) +
                          " IC=" + std::to_string(IC) + " OC=" + std::to_string(OC) + (offset ? " [offset 1]" : "");
  SCOPED_TRACE(tag);
  const size_t n_in = static_cast<size_t>(rows) * IC, n_out = static_cast<size_t>(rows) * OC;
  const size_t n_w = static_cast<size_t>(IC) * OC;
  const auto inp = rnd_t<T>(n_in, seed), dout = rnd_t<T>(n_out, seed + 1);
  const auto dw0 = rnd_t<T>(n_w, seed + 2), db0 = rnd_t<T>(OC, seed + 3);
  std::vector<float> db_ref = db0;
  kernels::bias_backward_cpu(db_ref.data(), dout.data(), rows, OC);

  GemmContext& ctx = shared_context(be);
  ctx.test_hooks() = v.hooks;
  // the plain product, for dw's bits
  Dev<T> dw_plain(dw0, offset), d_inp(inp, offset), d_dout(dout, offset);
  kernels::gemm_cuda<T>(ctx, dw_plain.data(), d_inp.data(), d_dout.data(), nullptr, nullptr, IC, OC, rows, true, false,
                        true, GemmEpilogue::kNone, nullptr);
  std::vector<float> dw[2], db[2];
  for (int run = 0; run < 2; ++run) {
    Dev<T> d_dw(dw0, offset), d_db(db0, offset);
    DeviceBuffer<char> scratch(kernels::weight_bias_grad_scratch_bytes(rows, OC));
    CUDA_CHECK(cudaMemset(scratch.data(), 0xff, scratch.bytes()));  // NaN: the sums must not read it unwritten
    kernels::reset_kernel_paths();
    const bool fused = kernels::weight_bias_grad_cuda<T>(ctx, d_dw.data(), d_db.data(), scratch.data(), d_inp.data(),
                                                         d_dout.data(), rows, IC, OC, nullptr);
    if (v.hooks.unfused_bias_grad) {
      EXPECT_FALSE(fused) << "the hook asked for GEMM + bias kernel";
    }
    if (must_fuse) {
      EXPECT_TRUE(fused) << "this kernel sums the bias gradient in the GEMM";
    }
    if (be == GemmBackend::kCublasLt && std::is_same_v<T, bf16>) {  // what ran is what the kernels line says
      const std::string paths = kernels::kernel_paths_used();
      const char* fused_path = !v.hooks.lt_bias_grad_bf16       ? "cublaslt epilogue fp32"
                               : v.hooks.lt_bias_grad_row_major ? "cublaslt row-major epilogue bf16"
                                                                : "cublaslt epilogue bf16";
      if (!v.hooks.unfused_bias_grad) {
        EXPECT_NE(paths.find(std::string("bias gradient: ") + (fused ? fused_path : "bias kernel")), std::string::npos)
            << paths;
      }
    }
    if (run == 0 && be == GemmBackend::kCublasLt && offset == 0 && (v.tag.empty() || v.hooks.lt_bias_grad_bf16))
      std::printf("cuBLASLt bias-gradient epilogue (%s, %s sums) for %s: %s\n",
                  v.hooks.lt_bias_grad_row_major ? "BGRADB, row-major" : "BGRADA",
                  std::is_same_v<T, bf16> && v.hooks.lt_bias_grad_bf16 ? "bf16" : "fp32", tag.c_str(),
                  fused ? "fused" : "no algorithm, GEMM + bias kernel");
    sync();
    dw[run] = d_dw.get();
    db[run] = d_db.get();
    EXPECT_EQ(d_dw.guard_writes(), 0) << "dw: writes outside";
    EXPECT_EQ(d_db.guard_writes(), 0) << "dbias: writes outside";
  }
  ctx.test_hooks() = GemmTestHooks{};
  if (be == GemmBackend::kHand || v.hooks.unfused_bias_grad) {
    EXPECT_EQ(bit_mismatches(dw[0], dw_plain.get()), 0) << "dw differs from gemm_cuda's";
  } else {
    expect_close_fp32(dw[0], dw_plain.get(), "dw vs gemm_cuda's", std::is_same_v<T, bf16> ? 1.0 / 128 : 1e-5);
  }
  expect_close<T>(db[0], db_ref, naive_of<T>(db_ref), "dbias +=");
  EXPECT_EQ(bit_mismatches(dw[0], dw[1]), 0) << "dw: two runs differ";
  EXPECT_EQ(bit_mismatches(db[0], db[1]), 0) << "dbias: two runs differ";
}

// dw must have gemm_cuda's bits (the bias sums ride along and must not disturb the product), dbias the
// CPU's column sums within the bf16 rule, both deterministic, nothing written outside. The hand backend
// runs fused on its default path (fp32: also at offset 1), with a forced split-K of 3 (per-split sums
// added in order), and unfused through the hook and on bf16's register-staged loaders (offset 1, the
// scalar-load hook), which leave the bias to bias_backward_cuda; cuBLASLt runs its bias-gradient
// epilogue where it has one, with fp32 sums and (bf16, the hook lt_bias_grad_bf16) with bf16 sums, BGRADA's or
// (the hook lt_bias_grad_row_major, its fallback) BGRADB's on row-ordered layouts.
TYPED_TEST(GemmTest, WeightBiasGradMatchesGemmAndCpu) {
  using T = TypeParam;
  struct LShape {
    int rows, IC, OC;
  };
  std::vector<Variant> variants(4);
  variants[0].tag = "";
  variants[1].tag = "[split 3] ";
  variants[1].hooks.hand_force_splits = 3;
  variants[2].tag = "[scalar loads] ";
  variants[2].hooks.hand_force_scalar_loads = true;
  variants[3].tag = "[unfused] ";
  variants[3].hooks.unfused_bias_grad = true;
  variants = with_mma_sync<T>(variants);
  if constexpr (std::is_same_v<T, bf16>) {  // cuBLASLt only (variant_changes): its epilogue's bf16 sums
    variants.emplace_back();
    variants.back().tag = "[bf16 bias sums] ";
    variants.back().hooks.lt_bias_grad_bf16 = true;
    variants.push_back(variants.back());
    variants.back().tag = "[bf16 bias sums, row-major BGRADB] ";
    variants.back().hooks.lt_bias_grad_row_major = true;
  }
  uint32_t seed = 1200;
  for (const LShape& s : {LShape{1, 1, 1}, LShape{111, 72, 37}, LShape{300, 72, 2304}, LShape{513, 200, 3 * kC + 4},
                          LShape{4096, kC, kC}})
    for (size_t offset : {size_t{0}, size_t{1}})
      for (const auto& [v, be] : runs_of(variants)) {
        check_weight_bias_grad<T>(be, v, s.rows, s.IC, s.OC, offset, seed, false);
        seed += 4;
      }
}

// gemm_dgelu_bias_grad_cuda on one shape and variant: c must be the GELU gradient's product (the reference of
// the kDGelu case) and, where the call says it summed the bias gradient (cuBLASLt's DGELU_BGRAD, bf16 with the
// hook lt_bias_grad_bf16), dbias += c's column sums against the CPU; where it says not, dbias untouched and c
// gemm_cuda's bits. Two runs the same bits, nothing written outside, the kernels line naming the path.
template <class T>
void check_dgelu_bias_grad(GemmBackend be, const Variant& v, int M, int N, int K, size_t offset, uint32_t seed) {
  const GemmCase g{M, N, K, false, true, GemmEpilogue::kDGelu, false};
  const std::string tag = std::string(name_of(be)) + " " + v.tag + g.str() + (offset ? " [offset 1]" : "");
  SCOPED_TRACE(tag);
  const Inputs in = make_inputs<T>(g, seed);
  const Outputs ref = reference(g, in, false);
  // cuBLASLt's fallback (no DGELU_BGRAD) may be its unfused dgelu: the naive chain that stores the product
  const Outputs naive = std::is_same_v<T, bf16> ? reference(g, in, true, be == GemmBackend::kCublasLt) : Outputs{};
  const auto db0 = rnd_t<T>(N, seed + 7);
  // dbias: the exact column sums of c added; naive bf16: c's stored values summed in fp32, the sum rounded to
  // bf16 (cuBLASLt's bias-gradient type), then added and rounded again
  std::vector<float> db_ref(N), db_naive(N);
  for (int j = 0; j < N; ++j) {
    double s = 0;
    float sn = 0;
    for (int i = 0; i < M; ++i) {
      s += ref.c[static_cast<size_t>(i) * N + j];
      if (!naive.c.empty()) sn += naive.c[static_cast<size_t>(i) * N + j];
    }
    db_ref[j] = static_cast<float>(db0[j] + s);
    db_naive[j] = naive.c.empty() ? db_ref[j] : round_bf16(db0[j] + round_bf16(sn));
  }
  GemmContext& ctx = shared_context(be);
  ctx.test_hooks() = v.hooks;
  Dev<T> plain(in.c0, offset), d_a(in.a, offset), d_b(in.b, offset), d_pre(in.aux, offset);
  kernels::gemm_cuda<T>(ctx, plain.data(), d_a.data(), d_b.data(), nullptr, d_pre.data(), M, N, K, false, true, false,
                        GemmEpilogue::kDGelu, nullptr);
  const bool can_fuse = be == GemmBackend::kCublasLt && std::is_same_v<T, bf16> && v.hooks.lt_bias_grad_bf16;
  std::vector<float> c[2], db[2];
  bool fused[2] = {false, false};
  for (int run = 0; run < 2; ++run) {
    Dev<T> d_c(in.c0, offset), d_db(db0, offset);
    DeviceBuffer<char> scratch(kernels::weight_bias_grad_scratch_bytes(M, N));
    CUDA_CHECK(cudaMemset(scratch.data(), 0xff, scratch.bytes()));  // NaN: the sums must not read it unwritten
    kernels::reset_kernel_paths();
    fused[run] = kernels::gemm_dgelu_bias_grad_cuda<T>(ctx, d_c.data(), d_db.data(), scratch.data(), d_a.data(),
                                                       d_b.data(), d_pre.data(), M, N, K, false, true, nullptr);
    const std::string paths = kernels::kernel_paths_used();
    EXPECT_EQ(paths.find("bias gradient: cublaslt dgelu epilogue bf16") != std::string::npos, fused[run]) << paths;
    if (!can_fuse) {
      EXPECT_FALSE(fused[run]) << "only cuBLASLt's bf16 sums, asked for, ride on the GELU gradient";
    }
    if (run == 0 && can_fuse && offset == 0)
      std::printf("cuBLASLt GELU gradient with the bias gradient (DGELU_BGRAD, bf16 sums) for %s: %s\n", tag.c_str(),
                  fused[run] ? "fused" : "no algorithm, the product alone");
    sync();
    c[run] = d_c.get();
    db[run] = d_db.get();
    EXPECT_EQ(d_c.guard_writes(), 0) << "c: writes outside";
    EXPECT_EQ(d_db.guard_writes(), 0) << "dbias: writes outside";
  }
  ctx.test_hooks() = GemmTestHooks{};
  EXPECT_EQ(fused[0], fused[1]) << "two runs took different paths";
  expect_close<T>(c[0], ref.c, naive.c, "c (the GELU gradient's product)");
  if (fused[0]) {
    expect_close<T>(db[0], db_ref, db_naive, "dbias += column sums of c");
  } else {
    EXPECT_EQ(bit_mismatches(c[0], plain.get()), 0) << "c differs from gemm_cuda's kDGelu";
    EXPECT_EQ(bit_mismatches(db[0], db0), 0) << "dbias changed where the call says it did nothing";
  }
  EXPECT_EQ(bit_mismatches(c[0], c[1]), 0) << "c: two runs differ";
  EXPECT_EQ(bit_mismatches(db[0], db[1]), 0) << "dbias: two runs differ";
}

// MLP down's input gradient carrying MLP up's bias gradient (gemm_dgelu_bias_grad_cuda): cuBLASLt with bf16
// sums (the hook lt_bias_grad_bf16) sums the columns of its GELU gradient's result in the epilogue where it
// has DGELU_BGRAD; every other run (fp32, the hand kernels, cuBLASLt without the hook, N not a multiple of 8)
// is gemm_cuda's kDGelu alone, dbias left to the caller.
TYPED_TEST(GemmTest, DGeluBiasGradMatchesGemmAndCpu) {
  using T = TypeParam;
  std::vector<Variant> variants = default_paths<T>();
  if constexpr (std::is_same_v<T, bf16>) {
    variants.emplace_back();
    variants.back().tag = "[bf16 bias sums] ";
    variants.back().hooks.lt_bias_grad_bf16 = true;
  }
  struct DShape {
    int M, N, K;  // rows, MLP up's outputs (N % 8 != 0: no DGELU_BGRAD, cuBLASLt's aux rule), MLP down's outputs
  };
  uint32_t seed = 1300;
  for (const DShape& s : {DShape{1, 8, 1}, DShape{111, 72, 37}, DShape{300, 1024, 192}, DShape{513, 3 * kC + 4, 64}})
    for (size_t offset : {size_t{0}, size_t{1}})
      for (const auto& [v, be] : runs_of(variants)) {
        check_dgelu_bias_grad<T>(be, v, s.M, s.N, s.K, offset, seed);
        seed += 8;
      }
}

// The bias gradient fused into the wgmma weight gradient (gemm_sm90.cu): every kernel, with and without
// split-K, and with 3 persistent blocks (many units each); the rows past a 64-row k-step and columns past
// a tile are tails. The same hooks' plain product gives dw's bits.
TEST_F(GemmWgmma, WeightBiasGradMatchesGemmAndCpu) {
  std::vector<Variant> variants = wgmma_tile_variants();
  const std::vector<Variant> split = wgmma_tile_variants(3);
  for (const Variant& v : split) variants.push_back({v.tag + "[split 3] ", v.hooks});
  Variant few = variants[0];
  few.tag = "[wgmma 128x128, 3 blocks] ";
  few.hooks.wgmma_max_blocks = 3;
  variants.push_back(few);
  struct LShape {
    int rows, IC, OC;
  };
  uint32_t seed = 1400;
  for (const LShape& s : {LShape{300, 72, 2304}, LShape{520, 200, 3 * kC + 8}, LShape{4096, kC, kC}})
    for (const Variant& v : variants) {
      check_weight_bias_grad<bf16>(GemmBackend::kHand, v, s.rows, s.IC, s.OC, 0, seed, true);
      seed += 4;
    }
  // A split tail (GemmWgmma.SplitTail): dW is 2 x 19 tiles of 128x128 (2 x 10 of 128x256); from tile 7 on
  // split, so row tile 0's column tiles 4 and up are summed in the tail's
  // splits and the others in the first launch.
  for (const Variant& v : split) {
    Variant tail{v.tag + "[split 3, tail from 7] ", v.hooks};
    tail.hooks.hand_force_tail_from = 7;
    check_weight_bias_grad<bf16>(GemmBackend::kHand, tail, 520, 200, 3 * kC + 8, 0, seed, true);
    seed += 4;
  }
}

}  // namespace
}  // namespace gpt2::test
