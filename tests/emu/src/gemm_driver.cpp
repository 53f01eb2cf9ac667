// Test driver: calls the repository's wgmma host launcher gemm_detail::gemm_bf16_wgmma (which encodes
// the tensor maps through the repository's sm90a_host.cu and launches the kernel in the emulator) the way
// gemm.cu's gemm_hand does for the wgmma path (split-K range, partial workspace, epilogue choice), then
// finishes split-K with the reduction gemm_splitk_reduce_epilogue performs (sum of the splits in order,
// then the repository's apply_epilogue4), and compares C (and aux) with a double-precision loop at
// tests/gpu/test_gemm.cpp's bf16 tolerance: max|gpu-ref| <= 2*max|naive_bf16-ref| + max|ref|/512.
// Weight-gradient cases (A^T, B, C +=) can ask for the fused bias gradient: dbias += B's column sums,
// through dbias_partial and the split-order addition of gemm.cu's bias_backward_add_chunks with split-K,
// checked against a double sum at the same tolerance.
// Every case runs on each wgmma kernel: 128x128 tiles, 128x256, 128x128 ping-pong (--kernel NAME: one).
#include "emu/prelude.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "kernels/gemm/gemm_common.cuh"
#include "kernels/gemm/gemm_sm90.cuh"

using bf16 = __nv_bfloat16;
using gpt2::kernels::GemmEpilogue;
namespace gd = gpt2::kernels::gemm_detail;

namespace {

constexpr size_t kGuard = 64;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 12288.0f;

float rbf(float x) { return __bfloat162float(__float2bfloat16(x)); }
std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = rbf(d(gen));
  return v;
}
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
const char* ep_name(GemmEpilogue ep) {
  switch (ep) {
    case GemmEpilogue::kNone: return "none";
    case GemmEpilogue::kBias: return "bias";
    case GemmEpilogue::kBiasGelu: return "bias_gelu";
    case GemmEpilogue::kDGelu: return "dgelu";
  }
  return "?";
}

struct Case {
  int M, N, K;
  bool ta, tb;
  GemmEpilogue ep;
  bool acc;
  int splits = 1;    // forced split-K factor (GemmTestHooks::hand_force_splits)
  gpt2::kernels::GemmWgmmaKernel kernel = gpt2::kernels::GemmWgmmaKernel::k128x128;  // tiles and schedule
  bool bias_grad = false;  // the fused bias gradient (ta, !tb, kNone only)
  int tail_from = 0;       // > 0 with splits > 1: a split tail (GemmTestHooks::hand_force_tail_from)
  bool bulk_store = false;  // the epilogue's bulk stores, where they apply (GemmTestHooks::wgmma_bulk_store)
  int tile_n() const { return gd::wgmma_tile_n(kernel); }
  std::string str() const {
    char b[224];
    snprintf(b, sizeof b, "%s M=%d N=%d K=%d%s%s ep=%s%s split=%d%s%s%s", gpt2::kernels::gemm_wgmma_kernel_name(kernel),
             M, N, K, ta ? " A^T" : "", tb ? " B^T" : "", ep_name(ep), acc ? " C+=" : "", splits,
             tail_from > 0 ? (" tail from " + std::to_string(tail_from)).c_str() : "", bias_grad ? " +dbias" : "",
             bulk_store ? " bulk" : "");
    return b;
  }
};
Case bulk(Case c) {
  c.bulk_store = true;
  return c;
}
// A weight gradient with its bias gradient fused: dW (M x N) += inp^T (M x K rows) dout (K rows x N).
Case bias_grad_case(int M, int N, int K, int splits, int tail_from = 0) {
  Case c{M, N, K, true, false, GemmEpilogue::kNone, true, splits};
  c.bias_grad = true;
  c.tail_from = tail_from;
  return c;
}
// A split tail: tiles [0, tail_from) whole, the rest split `splits` ways.
Case tail_case(int M, int N, int K, bool ta, bool tb, GemmEpilogue ep, bool acc, int splits, int tail_from) {
  Case c{M, N, K, ta, tb, ep, acc, splits};
  c.tail_from = tail_from;
  return c;
}

struct Inputs {
  std::vector<float> a, b, bias, aux, c0, dbias0;
};
struct Outputs {
  std::vector<float> c, aux, dbias;
};

Inputs make_inputs(const Case& g, uint32_t seed) {
  Inputs in;
  in.a = random_vec(static_cast<size_t>(g.M) * g.K, seed);
  in.b = random_vec(static_cast<size_t>(g.K) * g.N, seed + 1);
  const size_t mn = static_cast<size_t>(g.M) * g.N;
  if (g.ep == GemmEpilogue::kBias || g.ep == GemmEpilogue::kBiasGelu) in.bias = random_vec(g.N, seed + 2);
  if (g.ep == GemmEpilogue::kDGelu) in.aux = random_vec(mn, seed + 3);
  in.c0 = g.acc ? random_vec(mn, seed + 4) : std::vector<float>(mn, kNaN);
  if (g.bias_grad) in.dbias0 = random_vec(g.N, seed + 5);
  return in;
}

// tests/gpu/test_gemm.cpp reference(): exact (double) or the naive bf16 chain.
Outputs reference(const Case& g, const Inputs& in, bool naive) {
  const size_t mn = static_cast<size_t>(g.M) * g.N;
  Outputs out;
  out.c.resize(mn);
  if (g.ep == GemmEpilogue::kBiasGelu) out.aux.resize(mn);
  auto rnd = [&](double v) { return naive ? static_cast<double>(rbf(static_cast<float>(v))) : v; };
  for (int i = 0; i < g.M; ++i)
    for (int j = 0; j < g.N; ++j) {
      double s = 0;
      float sf = 0;
      for (int k = 0; k < g.K; ++k) {
        const float av = g.ta ? in.a[static_cast<size_t>(k) * g.M + i] : in.a[static_cast<size_t>(i) * g.K + k];
        const float bv = g.tb ? in.b[static_cast<size_t>(j) * g.K + k] : in.b[static_cast<size_t>(k) * g.N + j];
        if (naive)
          sf = std::fma(av, bv, sf);
        else
          s += static_cast<double>(av) * bv;
      }
      if (naive) s = sf;
      const size_t idx = static_cast<size_t>(i) * g.N + j;
      double v = s;
      switch (g.ep) {
        case GemmEpilogue::kNone:
          if (g.acc) v += in.c0[idx];
          break;
        case GemmEpilogue::kBias: v += in.bias[j]; break;
        case GemmEpilogue::kBiasGelu: {
          const double pre = rnd(v + in.bias[j]);
          out.aux[idx] = static_cast<float>(pre);
          v = naive ? gelu_host<float>(static_cast<float>(pre)) : gelu_host<double>(pre);
          break;
        }
        case GemmEpilogue::kDGelu:
          v *= naive ? gelu_grad_host<float>(in.aux[idx]) : gelu_grad_host<double>(in.aux[idx]);
          break;
      }
      out.c[idx] = static_cast<float>(rnd(v));
    }
  if (g.bias_grad) {  // dbias += column sums of B (not transposed): in double, or fp32 in K order
    out.dbias.resize(g.N);
    for (int j = 0; j < g.N; ++j) {
      double s = 0;
      float sf = 0;
      for (int k = 0; k < g.K; ++k) {
        s += in.b[static_cast<size_t>(k) * g.N + j];
        sf += in.b[static_cast<size_t>(k) * g.N + j];
      }
      out.dbias[j] = naive ? rbf(in.dbias0[j] + sf) : static_cast<float>(in.dbias0[j] + s);
    }
  }
  return out;
}

// A "device" buffer: kGuard sentinels on both sides; 16-byte aligned data (as cudaMalloc gives 256).
template <class T>
struct Dev {
  std::vector<T> store;
  size_t n = 0, lead = 0;
  Dev() = default;
  Dev(const std::vector<float>& v, float fill = kSentinel) : n(v.size()) {
    lead = kGuard;
    store.assign(lead + n + kGuard + 64, T(fill));
    // align data() to 256 bytes
    while (reinterpret_cast<uintptr_t>(store.data() + lead) % 256) ++lead;
    for (size_t i = 0; i < store.size(); ++i) store[i] = T(fill);
    for (size_t i = 0; i < n; ++i) store[lead + i] = T(v[i]);
  }
  T* data() { return n ? store.data() + lead : nullptr; }
  float at(size_t i) const { return static_cast<float>(store[lead + i]); }
  std::vector<float> get() const {
    std::vector<float> r(n);
    for (size_t i = 0; i < n; ++i) r[i] = at(i);
    return r;
  }
  long guard_writes(float fill = kSentinel) const {
    long bad = 0;
    for (size_t i = 0; i < store.size(); ++i)
      if ((i < lead || i >= lead + n)) {
        const float x = static_cast<float>(store[i]);
        bad += !(x == fill || (std::isnan(x) && std::isnan(fill)));
      }
    return bad;
  }
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

// gemm.cu gemm_splitk_reduce_epilogue (tail_from 0), or gemm_splitk_reduce_tiles over the tiles from
// tail_from on (a split tail), one "thread" per 4 columns, on the host.
template <GemmEpilogue kEp>
void reduce_splits(const float* partial, int splits, const gd::EpilogueParams<bf16>& ep, int tail_from, int tile_n) {
  const int n4 = static_cast<int>((ep.N + 3) / 4);
  const size_t slice = static_cast<size_t>(ep.M) * ep.N;
  const int tiles_m = (ep.M + 127) / 128, tiles_n = (ep.N + tile_n - 1) / tile_n;
  std::vector<char> in_tail(static_cast<size_t>(tiles_m) * tiles_n, tail_from == 0);
  for (int t = tail_from; tail_from > 0 && t < tiles_m * tiles_n; ++t) {
    int tm, tn;
    gd::tile_coords(t, tiles_m, tiles_n, tm, tn);
    in_tail[static_cast<size_t>(tm) * tiles_n + tn] = 1;
  }
  for (long i = 0; i < static_cast<long>(ep.M) * n4; ++i) {
    const int row = static_cast<int>(i / n4), col = static_cast<int>(i % n4) * 4;
    if (!in_tail[static_cast<size_t>(row / 128) * tiles_n + col / tile_n]) continue;
    const size_t idx = static_cast<size_t>(row) * ep.N + col;
    float v[4] = {0, 0, 0, 0};
    for (int s = 0; s < splits; ++s) {
      const float* src = partial + s * slice + idx;
      if (ep.vec4) {
        float x[4];
        gd::load4(src, x);
        for (int j = 0; j < 4; ++j) v[j] += x[j];
      } else {
        for (int j = 0; j < 4; ++j)
          if (col + j < ep.N) v[j] += src[j];
      }
    }
    gd::apply_epilogue4<bf16, kEp>(ep, row, col, v);
  }
}

struct Result {
  bool pass;
  double err_c, allowed_c, err_aux, allowed_aux, err_db, allowed_db;
  long guard;
  double secs;
};

Result run_case(const Case& g, uint32_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  const Inputs in = make_inputs(g, seed);
  const Outputs ref = reference(g, in, false), naive = reference(g, in, true);
  const size_t mn = static_cast<size_t>(g.M) * g.N;
  Dev<bf16> a(in.a), b(in.b), bias(in.bias), c(in.c0);
  Dev<bf16> aux(g.ep == GemmEpilogue::kDGelu ? in.aux
                                             : (g.ep == GemmEpilogue::kBiasGelu ? std::vector<float>(mn, kNaN)
                                                                                : std::vector<float>()));
  emu::clear_globals();
  emu::register_global(a.data(), in.a.size() * 2);
  emu::register_global(b.data(), in.b.size() * 2);
  if (g.ep == GemmEpilogue::kDGelu) emu::register_global(aux.data(), mn * 2);  // the 128x128 kernel's TMA reads it
  const int lda = g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N;
  if (!gd::wgmma_takes(a.data(), b.data(), lda, ldb)) {
    printf("SKIP %s: TMA cannot describe it (the launcher would fall back to mma.sync)\n", g.str().c_str());
    return Result{true, 0, 0, 0, 0, 0, 0, 0, 0};
  }
  // gemm.cu gemm_hand: epilogue parameters and the wgmma split-K range.
  gd::EpilogueParams<bf16> epp;
  epp.c = c.data(), epp.bias = bias.data(), epp.aux = aux.data(), epp.M = g.M, epp.N = g.N, epp.accumulate = g.acc;
  auto aligned = [](const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  epp.vec4 = g.N % 4 == 0 && aligned(epp.c, 8) && (epp.bias == nullptr || aligned(epp.bias, 8)) &&
             (epp.aux == nullptr || aligned(epp.aux, 8));
  const int splits = g.splits;
  const int k_per_split = static_cast<int>(gpt2::cuda::ceil_div(gpt2::cuda::ceil_div(g.K, splits), gd::kWgmmaBK) * gd::kWgmmaBK);
  const int used = static_cast<int>(gpt2::cuda::ceil_div(g.K, k_per_split));
  const int tiles = gd::wgmma_tiles(g.kernel, g.M, g.N);
  const int tail_from = used > 1 && g.tail_from > 0 && g.tail_from < tiles ? g.tail_from : 0;
  Dev<float> ws(std::vector<float>(used > 1 ? static_cast<size_t>(used) * mn : 0, kNaN), kNaN);
  // gemm.cu gemm_hand with a dbias: the kernel adds into it, or with split-K writes each split's column
  // sums into the bias scratch, which bias_backward_add_chunks adds into it in split order.
  Dev<bf16> dbias(in.dbias0);
  Dev<float> dbias_ws(std::vector<float>(g.bias_grad && used > 1 ? static_cast<size_t>(used) * g.N : 0, kNaN), kNaN);
  (void)emu::take_prefetches();  // from here on, this case's
  bool bulk_stored = false;
  if (tail_from > 0) {  // gemm.cu gemm_hand's split tail: the whole tiles first, finished by the kernel
    const int k_whole = static_cast<int>(gpt2::cuda::ceil_div(g.K, gd::kWgmmaBK) * gd::kWgmmaBK);
    bulk_stored = gd::gemm_bf16_wgmma(g.kernel, 0, true, true, g.bulk_store, a.data(), b.data(), g.M, g.N, g.K, g.ta,
                                      g.tb, k_whole, 1, 0, tail_from, nullptr, epp, g.ep,
                                      g.bias_grad ? dbias.data() : nullptr, nullptr, nullptr)
                      .bulk_store;
  }
  const gd::WgmmaRan ran = gd::gemm_bf16_wgmma(
      g.kernel, 0, true, true, g.bulk_store, a.data(), b.data(), g.M, g.N, g.K, g.ta, g.tb, k_per_split, used,
      tail_from, tiles - tail_from, used > 1 ? ws.data() : nullptr, epp, used > 1 ? GemmEpilogue::kNone : g.ep,
      g.bias_grad && used == 1 ? dbias.data() : nullptr, g.bias_grad && used > 1 ? dbias_ws.data() : nullptr, nullptr);
  const gd::WgmmaAuxRead aux_read = ran.aux;
  bulk_stored = bulk_stored || ran.bulk_store;
  // Where the bulk stores apply (gemm_sm90.cuh): asked for, a cooperative kernel, an epilogue that writes rows
  // without reading C or the pre-activations, whole 16-byte rows, and a launch that finishes tiles.
  const bool bulk_expected =
      g.bulk_store && g.kernel != gpt2::kernels::GemmWgmmaKernel::k128x128PingPong &&
      (g.ep == GemmEpilogue::kBias || g.ep == GemmEpilogue::kBiasGelu || (g.ep == GemmEpilogue::kNone && !g.acc)) &&
      epp.vec4 && g.N % 8 == 0 && (used == 1 || tail_from > 0);
  long guard = c.guard_writes() + (g.ep == GemmEpilogue::kBiasGelu ? aux.guard_writes() : 0) +
               (used > 1 ? ws.guard_writes(kNaN) : 0) + (g.bias_grad ? dbias.guard_writes() : 0) +
               (g.bias_grad && used > 1 ? dbias_ws.guard_writes(kNaN) : 0);
  if (g.bias_grad && used > 1) {
    // A split tail's partial column sums are those of the columns whose row-0 tile is in the tail.
    int col0 = 0;
    if (tail_from > 0) {
      const int tiles_m = (g.M + 127) / 128, tiles_n = (g.N + g.tile_n() - 1) / g.tile_n();
      col0 = std::min(g.N, gd::first_row0_tile_from(tail_from, tiles_m, tiles_n) * g.tile_n());
    }
    for (int j = col0; j < g.N; ++j) {
      float sum = 0.0f;
      for (int sp = 0; sp < used; ++sp) sum += dbias_ws.data()[static_cast<size_t>(sp) * g.N + j];
      dbias.data()[j] = __float2bfloat16(__bfloat162float(dbias.data()[j]) + sum);
    }
  }
  if (used > 1) {
    switch (g.ep) {
      case GemmEpilogue::kNone: reduce_splits<GemmEpilogue::kNone>(ws.data(), used, epp, tail_from, g.tile_n()); break;
      case GemmEpilogue::kBias: reduce_splits<GemmEpilogue::kBias>(ws.data(), used, epp, tail_from, g.tile_n()); break;
      case GemmEpilogue::kBiasGelu:
        reduce_splits<GemmEpilogue::kBiasGelu>(ws.data(), used, epp, tail_from, g.tile_n());
        break;
      case GemmEpilogue::kDGelu: reduce_splits<GemmEpilogue::kDGelu>(ws.data(), used, epp, tail_from, g.tile_n()); break;
    }
  }
  Result r{};
  const std::vector<float> gc = c.get();
  r.err_c = max_abs_diff(gc, ref.c);
  r.allowed_c = 2.0 * max_abs_diff(naive.c, ref.c) + max_abs(ref.c) / 512.0;
  if (getenv("EMU_DUMP")) {  // where the wrong elements are (tile coordinates of the first few)
    int shown = 0;
    long bad = 0;
    for (int i = 0; i < g.M; ++i)
      for (int j = 0; j < g.N; ++j) {
        const size_t idx = static_cast<size_t>(i) * g.N + j;
        const double d = std::fabs(static_cast<double>(gc[idx]) - ref.c[idx]);
        if (!(d <= r.allowed_c)) {
          ++bad;
          if (shown++ < 12)
            printf("  bad C[%d][%d] = %g (ref %g) tile (%d,%d) local (%d,%d)\n", i, j, gc[idx], ref.c[idx], i / 128,
                   j / g.tile_n(), i % 128, j % g.tile_n());
        }
      }
    printf("  %ld bad elements of %zu\n", bad, mn);
  }
  r.pass = r.err_c <= r.allowed_c;
  if (g.ep == GemmEpilogue::kBiasGelu) {
    r.err_aux = max_abs_diff(aux.get(), ref.aux);
    r.allowed_aux = 2.0 * max_abs_diff(naive.aux, ref.aux) + max_abs(ref.aux) / 512.0;
    r.pass = r.pass && r.err_aux <= r.allowed_aux;
  }
  if (g.bias_grad) {
    r.err_db = max_abs_diff(dbias.get(), ref.dbias);
    r.allowed_db = 2.0 * max_abs_diff(naive.dbias, ref.dbias) + max_abs(ref.dbias) / 512.0;
    r.pass = r.pass && r.err_db <= r.allowed_db;
  }
  // The L2 prefetch of the GELU gradient's pre-activations (gemm_sm90.cu, where they are read in the epilogue):
  // every 64 x 64 box of them that holds an element, each exactly once (a consumer's own rows of each unit),
  // and nothing else; no prefetch at all where the launch says it made none.
  const std::vector<emu::PrefetchRec> prefetched = emu::take_prefetches();
  if (tail_from == 0) {
    std::map<std::pair<int, int>, int> boxes;  // (column, row) -> times prefetched
    bool stray = false;
    for (const emu::PrefetchRec& p : prefetched) {
      if (p.base != aux.data() || p.rank != 2) stray = true;
      else ++boxes[{p.coords[0], p.coords[1]}];
    }
    long missing = 0, twice = 0;
    if (aux_read == gd::WgmmaAuxRead::kPrefetchL2) {
      for (int r0 = 0; r0 < g.M; r0 += 64)
        for (int c0 = 0; c0 < g.N; c0 += 64) {
          const auto it = boxes.find({c0, r0});
          if (it == boxes.end()) ++missing;
          else if (it->second != 1) ++twice;
          if (it != boxes.end()) boxes.erase(it);
        }
    }
    if (stray || missing || twice || !boxes.empty()) {
      printf("  L2 prefetch of the pre-activations: %ld box(es) missing, %ld prefetched more than once, %zu not "
             "theirs%s\n", missing, twice, boxes.size(), stray ? ", and prefetches of another tensor" : "");
      r.pass = false;
    }
  }
  if (bulk_stored != bulk_expected) {
    printf("  bulk stores: the launches %s them, where they %s\n", bulk_stored ? "made" : "did not make",
           bulk_expected ? "apply" : "do not apply");
    r.pass = false;
  }
  r.guard = guard;
  r.pass = r.pass && guard == 0;
  r.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, stop = false, gpt2 = false;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    if (!strcmp(argv[i], "--stop-on-fail")) stop = true;
    if (!strcmp(argv[i], "--gpt2")) gpt2 = true;
  }
  // Every case runs on every wgmma kernel unless --kernel names one (128x128, 128x256, 128x128-pingpong).
  using gpt2::kernels::GemmWgmmaKernel;
  std::vector<GemmWgmmaKernel> kernels = {GemmWgmmaKernel::k128x128, GemmWgmmaKernel::k128x256,
                                          GemmWgmmaKernel::k128x128PingPong};
  for (int i = 1; i + 1 < argc; ++i)
    if (!strcmp(argv[i], "--kernel")) {
      std::vector<GemmWgmmaKernel> one;
      for (GemmWgmmaKernel k : kernels)
        if (!strcmp(argv[i + 1], gpt2::kernels::gemm_wgmma_kernel_name(k))) one.push_back(k);
      if (one.empty()) {
        fprintf(stderr, "--kernel %s: use 128x128, 128x256 or 128x128-pingpong\n", argv[i + 1]);
        return 2;
      }
      kernels = one;
    }
  const GemmEpilogue eps[] = {GemmEpilogue::kNone, GemmEpilogue::kBias, GemmEpilogue::kBiasGelu, GemmEpilogue::kDGelu};
  std::vector<Case> cases;
  auto all_eps = [&](int M, int N, int K, int t, int splits) {
    for (GemmEpilogue ep : eps) cases.push_back({M, N, K, (t & 1) != 0, (t & 2) != 0, ep, false, splits});
    cases.push_back({M, N, K, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kNone, true, splits});
  };
  for (int i = 1; i + 8 < argc + 0 && i < argc; ++i)
    if (!strcmp(argv[i], "--case")) {  // --case M N K ta tb ep(0..3) acc splits
      Case c{atoi(argv[i + 1]), atoi(argv[i + 2]), atoi(argv[i + 3]), atoi(argv[i + 4]) != 0, atoi(argv[i + 5]) != 0,
             eps[atoi(argv[i + 6])], atoi(argv[i + 7]) != 0, atoi(argv[i + 8])};
      cases.push_back(c);
    }
  if (!cases.empty()) {
  } else if (gpt2) {
    // GPT-2 124M linear layers at 256 rows (C = 768), and GemmWgmma.Gpt2LinearLayersAndPersistentTiles'
    // 110-tile shape: many units per persistent block.
    cases.push_back({256, 2304, 768, false, false, GemmEpilogue::kBias, false, 1});      // qkv forward
    cases.push_back({256, 3072, 768, false, false, GemmEpilogue::kBiasGelu, false, 1});  // fc forward
    cases.push_back({256, 3072, 768, false, true, GemmEpilogue::kDGelu, false, 1});      // dinp of fc_proj * gelu'
    cases.push_back({768, 768, 1024, true, false, GemmEpilogue::kNone, true, 2});        // dw += inp^T dout, split 2
    cases.push_back(bias_grad_case(768, 2304, 256, 1));  // qkv's dw and dbias, fused (split-K: the full set)
    cases.push_back(
        bulk({256, 3072, 768, false, false, GemmEpilogue::kBiasGelu, false, 1}));  // fc forward, bulk stores
    cases.push_back({1160, 1288, 200, false, false, GemmEpilogue::kBiasGelu, false, 1});
    cases.push_back({1160, 1288, 200, true, false, GemmEpilogue::kNone, true, 1});
    // the MLP's weight gradients as the model splits them on 128x128 tiles: 144 tiles, 132 whole, 12 split
    // (mlp_up's 24 row tiles put the tail past the first group of the tile order, so no bias column in it)
    Case up = bias_grad_case(4 * 768, 768, 256, 2, 132), down = bias_grad_case(768, 4 * 768, 256, 2, 132);
    cases.push_back(up);
    cases.push_back(down);
  } else if (quick) {
    // every transpose combination, with several output tiles per block and split-K
    for (int t = 0; t < 4; ++t) cases.push_back({200, 136, 104, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kBiasGelu, false, 1});
    for (int t = 0; t < 4; ++t) cases.push_back({200, 136, 392, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kNone, true, 3});
    cases.push_back({296, 264, 136, false, false, GemmEpilogue::kBias, false, 1});
    // the GELU gradient: its pre-activations by TMA (128x128, ping-pong) or read in the epilogue (128x256)
    cases.push_back({200, 136, 104, false, true, GemmEpilogue::kDGelu, false, 1});
    // 2 units per block of 9 k-steps: a ping-pong warpgroup skips more than a round of the 4-stage ring
    cases.push_back({256, 384, 520, false, false, GemmEpilogue::kBias, false, 1});
    // the fused bias gradient: 3 column tiles of 128 (2 of 256, the last 8 wide), 2 row tiles; split-K
    cases.push_back(bias_grad_case(200, 264, 392, 1));
    cases.push_back(bias_grad_case(200, 264, 392, 3));
    // a split tail (gemm.cu gemm_hand): the whole tiles in one launch, the others split 3 ways in a second,
    // and the tail's tiles alone reduced; with the fused bias gradient, its columns in both launches
    cases.push_back(tail_case(296, 264, 392, false, false, GemmEpilogue::kBiasGelu, false, 3, 5));
    cases.push_back(tail_case(200, 136, 392, true, true, GemmEpilogue::kNone, true, 3, 1));
    cases.push_back(bias_grad_case(200, 520, 392, 3, 2));
    // the bulk-store epilogue: tails in both dimensions (the last 256-wide tile 8 columns wide), 9 units on 3
    // blocks (the staging written again after its copies of the unit before), a split tail
    cases.push_back(bulk({296, 264, 136, false, false, GemmEpilogue::kBiasGelu, false, 1}));
    cases.push_back(bulk({296, 264, 136, false, true, GemmEpilogue::kBias, false, 1}));
    cases.push_back(bulk(tail_case(296, 264, 392, false, false, GemmEpilogue::kBiasGelu, false, 3, 5)));
  } else {
    for (int t = 0; t < 4; ++t) all_eps(136, 72, 72, t, 1);      // kTmaShapes[0]: one 128x128 tile + tails
    for (int t = 0; t < 4; ++t) all_eps(200, 136, 104, t, 1);    // kTmaShapes[2]: 4 tiles on 3 blocks
    for (int t = 0; t < 4; ++t) {                                // kTmaShapes[1]: boxes mostly out of bounds
      cases.push_back({8, 8, 8, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kBiasGelu, false, 1});
      cases.push_back({8, 8, 8, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kNone, true, 1});
    }
    for (int t = 0; t < 4; ++t) all_eps(200, 136, 392, t, 3);    // GemmWgmma.ForcedSplitK: 12 units on 3 blocks
    for (int t = 0; t < 4; ++t)                                  // 3 tiles of 128x256 across N, the last 8 wide
      cases.push_back({136, 520, 136, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kBiasGelu, false, 1});
    for (int t = 0; t < 4; ++t) {                                // 9 tiles on 3 blocks: the ring runs across tiles
      cases.push_back({296, 264, 136, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kBiasGelu, false, 1});
      cases.push_back({296, 264, 136, (t & 1) != 0, (t & 2) != 0, GemmEpilogue::kNone, true, 1});
    }
    all_eps(37, 45, 40, 2, 1);                                    // M, N free (B^T): scalar epilogue (vec4 off)
    all_eps(37, 72, 40, 0, 1);
    cases.push_back({72, 104, 1032, false, false, GemmEpilogue::kNone, true, 1});   // 17 k-steps, one tile
    cases.push_back({72, 104, 1032, true, false, GemmEpilogue::kNone, true, 4});    // dw-like: A^T, split 4
    cases.push_back({72, 104, 1032, true, true, GemmEpilogue::kBias, false, 4});
    // the fused bias gradient: tails in every dimension, K rows past the last tile, split-K
    for (int splits : {1, 3}) {
      cases.push_back(bias_grad_case(136, 520, 136, splits));
      cases.push_back(bias_grad_case(200, 264, 392, splits));
      cases.push_back(bias_grad_case(40, 72, 1032, splits));
    }
    cases.push_back(bias_grad_case(8, 8, 8, 1));
    // split tails: every transpose and epilogue; ragged tiles in the tail; the bias gradient's columns split
    // between the two launches (row tile 0 of 2 or 3: columns from the first in the tail on)
    for (int t = 0; t < 4; ++t)
      for (GemmEpilogue ep : eps)
        cases.push_back(tail_case(296, 264, 392, (t & 1) != 0, (t & 2) != 0, ep, false, 3, 5));
    cases.push_back(tail_case(296, 264, 392, true, false, GemmEpilogue::kNone, true, 4, 8));
    cases.push_back(bias_grad_case(200, 520, 392, 3, 2));
    cases.push_back(bias_grad_case(296, 264, 1032, 4, 4));
    // the bulk-store epilogue: every transpose and epilogue (C += and the GELU gradient store as before), 9
    // tiles on 3 blocks, one tile with boxes mostly out of bounds, 3 tiles across N the last 8 wide, a split tail
    for (int t = 0; t < 4; ++t)
      for (GemmEpilogue ep : eps) cases.push_back(bulk({296, 264, 136, (t & 1) != 0, (t & 2) != 0, ep, false, 1}));
    cases.push_back(bulk({8, 8, 8, false, false, GemmEpilogue::kBiasGelu, false, 1}));
    cases.push_back(bulk({136, 520, 136, false, true, GemmEpilogue::kNone, false, 1}));
    cases.push_back(bulk(tail_case(296, 264, 392, false, false, GemmEpilogue::kBias, false, 3, 5)));
  }
  std::vector<Case> runs;
  for (GemmWgmmaKernel k : kernels)
    for (Case c : cases) {
      c.kernel = k;
      runs.push_back(c);
    }
  int fails = 0, n = 0;
  uint32_t seed = 1200;
  for (const Case& g : runs) {
    // Each case in a child process, so that an emulator error (which ends the process) fails that case only.
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
      const long blocks0 = emu::stats().blocks, ops0 = emu::stats().wgmma_ops, tma0 = emu::stats().tma_copies;
      const Result r = run_case(g, seed);
      printf("%s %-48s maxerr C %.3g (allowed %.3g)", r.pass ? "PASS" : "FAIL", g.str().c_str(), r.err_c, r.allowed_c);
      if (g.ep == GemmEpilogue::kBiasGelu) printf(" aux %.3g (allowed %.3g)", r.err_aux, r.allowed_aux);
      if (g.bias_grad) printf(" dbias %.3g (allowed %.3g)", r.err_db, r.allowed_db);
      if (r.guard) printf(" GUARD WRITES %ld", r.guard);
      printf("  [blocks %ld wgmma %ld tma %ld, %.1fs]\n", emu::stats().blocks - blocks0,
             emu::stats().wgmma_ops - ops0, emu::stats().tma_copies - tma0, r.secs);
      fflush(stdout);
      _exit(r.pass ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    const int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc != 0 && rc != 1) printf("FAIL %-48s emulator error / crash (exit %d, see the [emu] line above)\n", g.str().c_str(), rc);
    seed += 7;
    ++n;
    if (rc != 0) ++fails;
    if (rc != 0 && stop) break;
  }
  printf("%s: %d of %d cases passed\n", fails ? "FAIL" : "PASS", n - fails, n);
  return fails ? 1 : 0;
}
