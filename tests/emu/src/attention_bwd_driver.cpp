// Test driver: calls the repository's host entry attention_bwd_wgmma (tensor maps through the repository's
// sm90a_host.cu, the kernel in the emulator, every block of the grid running at once unless
// EMU_CONCURRENT_BLOCKS says otherwise, so the dQ turns really wait on each other) and compares dq, dk, dv
// with a double-precision causal attention backward at tests/gpu/test_attention.cpp's bf16 rule
// (test::expect_close_bf16: error <= 2 x a naive bf16 chain's + max |ref| / 512), each part on its own.
// The caller's parts of attention_backward_cuda are done here as attention.cu does them: D =
// rowsum(dout * out) in fp32 from the bf16 forward output, the turn counters and ticket zeroed, and dq
// = bf16(dq_acc * scale) afterwards. dq_acc starts as NaN (it needs no clearing); the q part of dqkv
// must come back untouched by the kernel.
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emu/attention_driver_util.h"
#include "emu/runtime.h"
#include "kernels/attention/attention_sm90.cuh"

using bf16 = __nv_bfloat16;
using gpt2::kernels::attention_detail::attention_bwd_wgmma;

namespace {

using namespace emu_driver;

constexpr int kHs = 64;

struct Problem {
  std::vector<float> qkv, dout;  // bf16-representable
  std::vector<float> out;        // the forward's output, rounded to bf16 (what attention_backward_cuda gets)
  std::vector<float> lse;        // fp32
  std::vector<double> dqkv_ref, dqkv_naive;
};

// The backward's grid: one block per (key tile, head, batch).
int blocks(const Shape& s) {
  using gpt2::kernels::attention_detail::kWgmmaBwdKeyTile;
  return s.B * s.NH * ((s.T + kWgmmaBwdKeyTile - 1) / kWgmmaBwdKeyTile);
}

size_t at(const Shape& s, int b, int t, int col) { return (static_cast<size_t>(b) * s.T + t) * 3 * kHs * s.NH + col; }

// Exact forward and backward in double; the naive chain stores P in bf16 and rounds every output to bf16.
Problem make_problem(const Shape& s, uint32_t seed) {
  const int C = kHs * s.NH;
  Problem p;
  std::mt19937 gen(seed);
  std::normal_distribution<float> dq(0.0f, s.scale), dd(0.0f, 1.0f);
  p.qkv.resize(static_cast<size_t>(s.B) * s.T * 3 * C);
  for (auto& x : p.qkv) x = bf(dq(gen));
  p.dout.resize(static_cast<size_t>(s.B) * s.T * C);
  for (auto& x : p.dout) x = bf(dd(gen));
  p.out.assign(p.dout.size(), 0.0f);
  p.lse.assign(static_cast<size_t>(s.B) * s.NH * s.T, 0.0f);
  p.dqkv_ref.assign(p.qkv.size(), 0.0);
  p.dqkv_naive.assign(p.qkv.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHs));
  std::vector<double> P(static_cast<size_t>(s.T) * s.T), dP(static_cast<size_t>(s.T) * s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const int qc = h * kHs, kc = C + h * kHs, vc = 2 * C + h * kHs;
      for (int t = 0; t < s.T; ++t) {
        double mx = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          double dot = 0;
          for (int i = 0; i < kHs; ++i) dot += static_cast<double>(p.qkv[at(s, b, t, qc + i)]) * p.qkv[at(s, b, u, kc + i)];
          P[t * s.T + u] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (int u = 0; u <= t; ++u) sum += std::exp(P[t * s.T + u] - mx);
        const double lse = mx + std::log(sum);
        p.lse[(static_cast<size_t>(b) * s.NH + h) * s.T + t] = static_cast<float>(lse);
        for (int u = 0; u <= t; ++u) P[t * s.T + u] = std::exp(P[t * s.T + u] - lse);
        for (int i = 0; i < kHs; ++i) {
          double o = 0;
          for (int u = 0; u <= t; ++u) o += P[t * s.T + u] * p.qkv[at(s, b, u, vc + i)];
          p.out[(static_cast<size_t>(b) * s.T + t) * C + qc + i] = bf(o);
        }
        for (int u = 0; u <= t; ++u) {
          double dot = 0;
          for (int i = 0; i < kHs; ++i)
            dot += static_cast<double>(p.dout[(static_cast<size_t>(b) * s.T + t) * C + qc + i]) * p.qkv[at(s, b, u, vc + i)];
          dP[t * s.T + u] = dot;
        }
      }
      for (int naive = 0; naive < 2; ++naive) {
        std::vector<double>& g = naive ? p.dqkv_naive : p.dqkv_ref;
        for (int t = 0; t < s.T; ++t) {
          double D = 0;
          for (int u = 0; u <= t; ++u) {
            const double pr = naive ? bf(P[t * s.T + u]) : P[t * s.T + u];
            D += pr * dP[t * s.T + u];
          }
          for (int u = 0; u <= t; ++u) {
            const double pr = naive ? bf(P[t * s.T + u]) : P[t * s.T + u];
            const double ds = pr * (dP[t * s.T + u] - D) * scale;
            for (int i = 0; i < kHs; ++i) {
              g[at(s, b, t, qc + i)] += ds * p.qkv[at(s, b, u, kc + i)];
              g[at(s, b, u, kc + i)] += ds * p.qkv[at(s, b, t, qc + i)];
              g[at(s, b, u, vc + i)] += pr * p.dout[(static_cast<size_t>(b) * s.T + t) * C + qc + i];
            }
          }
        }
      }
    }
  for (auto& x : p.dqkv_naive) x = bf(x);
  return p;
}

// One backward through the kernel; returns dqkv (B,T,3C) as floats.
std::vector<float> launch(const Shape& s, const Problem& p) {
  const int C = kHs * s.NH;
  const size_t n_qkv = p.qkv.size(), n_out = p.dout.size(), n_lse = p.lse.size();
  std::vector<bf16> qkv(n_qkv), dout(n_out);
  for (size_t i = 0; i < n_qkv; ++i) qkv[i] = __float2bfloat16(p.qkv[i]);
  for (size_t i = 0; i < n_out; ++i) dout[i] = __float2bfloat16(p.dout[i]);
  std::vector<float> D(n_lse);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int h = 0; h < s.NH; ++h) {
        float acc = 0.0f;
        for (int i = 0; i < kHs; ++i) {
          const size_t e = (static_cast<size_t>(b) * s.T + t) * C + h * kHs + i;
          acc += p.dout[e] * p.out[e];
        }
        D[(static_cast<size_t>(b) * s.NH + h) * s.T + t] = acc;
      }
  std::vector<bf16> dqkv(kGuard + n_qkv + kGuard, from_bits(kBf16Poison));
  std::vector<float> dq_acc(kGuard + n_out + kGuard, NAN);
  const size_t n_turns = static_cast<size_t>(s.B) * s.NH * ((s.T + 15) / 16);
  std::vector<int> turns(n_turns + 1, 0);
  emu::clear_globals();
  emu::register_global(qkv.data(), n_qkv * sizeof(bf16));
  emu::register_global(dout.data(), n_out * sizeof(bf16));
  attention_bwd_wgmma(dqkv.data() + kGuard, dq_acc.data() + kGuard, turns.data(), turns.data() + n_turns, dout.data(),
                      qkv.data(), p.lse.data(), D.data(), s.B, s.T, C, s.NH, nullptr);
  for (size_t i = 0; i < kGuard; ++i) {
    if (bits(dqkv[i]) != kBf16Poison || bits(dqkv[kGuard + n_qkv + i]) != kBf16Poison)
      emu::fail("the kernel wrote outside dqkv");
    if (!std::isnan(dq_acc[i]) || !std::isnan(dq_acc[kGuard + n_out + i])) emu::fail("the kernel wrote outside dq_acc");
  }
  if (turns[n_turns] != blocks(s)) emu::fail("the ticket counted %d blocks", turns[n_turns]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHs));
  std::vector<float> r(n_qkv);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int col = 0; col < 3 * C; ++col) {
        const size_t e = at(s, b, t, col);
        if (col < C) {
          if (bits(dqkv[kGuard + e]) != kBf16Poison) emu::fail("the kernel wrote dqkv's q part");
          r[e] = bf(dq_acc[kGuard + (static_cast<size_t>(b) * s.T + t) * C + col] * scale);  // attention_bwd_store_dq
        } else {
          r[e] = __bfloat162float(dqkv[kGuard + e]);
        }
      }
  return r;
}

struct PartReport {
  double err, naive, tol;
  bool pass;
};

PartReport check_part(const Shape& s, const Problem& p, const std::vector<float>& got, int part) {
  const int C = kHs * s.NH;
  double err = 0, naive = 0, mx = 0;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int col = part * C; col < (part + 1) * C; ++col) {
        const size_t e = at(s, b, t, col);
        const double d = std::fabs(got[e] - p.dqkv_ref[e]);
        err = std::isnan(d) ? INFINITY : std::max(err, d);
        naive = std::max(naive, std::fabs(p.dqkv_naive[e] - p.dqkv_ref[e]));
        mx = std::max(mx, std::fabs(p.dqkv_ref[e]));
      }
  // + 1e-5: where every P is 1 (T = 1) the exact dq, dk are 0 and dP - D cancels to fp32 rounding noise
  // (D comes from the bf16 forward output in another summation order), which no relative rule admits.
  const double tol = 2.0 * naive + mx / 512.0 + 1e-5;
  return PartReport{err, naive, tol, err <= tol};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  bool stop_on_fail = false, repeat = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      shapes = {{2, 129, 2}, {1, 300, 1}, {2, 63, 1}, {1, 1, 1}, {1, 256, 2}};
      repeat = true;
    } else if (a == "--test-shapes") {  // AttentionWgmmaBackward.MatchesCpu's own list
      shapes = gpu_test_shapes();
    } else if (a == "--gpt2") {
      shapes = {{1, 1024, 12}};
    } else if (a == "--stop-on-fail") {
      stop_on_fail = true;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (shapes.empty())
    for (int T : {1, 2, 17, 63, 64, 65, 127, 128, 129, 191, 200, 256, 300})
      for (int B : {1, 2})
        for (int NH : {1, 3}) shapes.push_back({B, T, NH});
  const auto& cfg = emu::config();
  std::printf("emulator: dynamic smem at window offset %u, TMA delay <= %u us, wait delay <= %u us, seed %u, "
              "concurrent blocks %u (0: all)\n",
              cfg.smem_offset, cfg.tma_delay_us, cfg.wait_delay_us, cfg.seed, cfg.concurrent_blocks);
  int fails = 0;
  uint32_t seed = 700;
  const char* names[3] = {"dq", "dk", "dv"};
  for (const Shape& s : shapes) {
    const auto t0 = std::chrono::steady_clock::now();
    const Problem p = make_problem(s, seed += 10);
    const std::vector<float> got = launch(s, p);
    bool ok = true;
    std::string txt;
    for (int part = 0; part < 3; ++part) {
      const PartReport r = check_part(s, p, got, part);
      char buf[128];
      std::snprintf(buf, sizeof buf, "  %s_err=%.2e (tol %.2e)", names[part], r.err, r.tol);
      txt += buf;
      ok = ok && r.pass;
    }
    if (repeat && blocks(s) > 1) {  // the dQ sum's order must not depend on timing
      const std::vector<float> again = launch(s, p);
      const bool same = std::memcmp(again.data(), got.data(), got.size() * sizeof(float)) == 0;
      txt += same ? "  repeat=bit-identical" : "  repeat=DIFFERS";
      ok = ok && same;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("B=%d T=%-4d NH=%-2d scale=%.0f%s  %s  [%.1fs]\n", s.B, s.T, s.NH, s.scale, txt.c_str(),
                ok ? "PASS" : "FAIL", secs);
    std::fflush(stdout);
    if (!ok) {
      ++fails;
      if (stop_on_fail) break;
    }
  }
  const auto& st = emu::stats();
  std::printf("%s: %d of %zu shapes failed (%ld blocks, %ld wgmma, %ld TMA copies emulated)\n", fails ? "FAIL" : "PASS",
              fails, shapes.size(), st.blocks, st.wgmma_ops, st.tma_copies);
  return fails ? 1 : 0;
}
