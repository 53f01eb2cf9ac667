// Test driver: calls the repository's host entry attention_fwd_wgmma (which encodes the tensor map
// through the repository's sm90a_host.cu and launches the kernel in the emulator) and compares out and
// lse with a double-precision causal attention at tests/gpu/test_attention.cpp's bf16 tolerances.
// --pingpong runs the ping-pong schedule (the consumers take turns at the tensor cores).
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emu/attention_driver_util.h"
#include "emu/runtime.h"
#include "kernels/attention/attention_sm90.cuh"

using bf16 = __nv_bfloat16;
using gpt2::kernels::attention_detail::attention_fwd_wgmma;

namespace {

using namespace emu_driver;

constexpr uint32_t kF32Poison = 0xFFFFFFFFu;

struct RunOut {
  std::vector<uint16_t> out;  // bf16 bits, B*T*C
  std::vector<float> lse;
};

// One launch on qkv (float values, already bf16-representable; NaN allowed).
bool g_pingpong = false;

RunOut launch(const Shape& s, const std::vector<float>& qkv_f) {
  const int C = 64 * s.NH;
  const size_t n_qkv = static_cast<size_t>(s.B) * s.T * 3 * C, n_out = static_cast<size_t>(s.B) * s.T * C,
               n_lse = static_cast<size_t>(s.B) * s.NH * s.T;
  std::vector<bf16> qkv(kGuard + n_qkv + kGuard, from_bits(kBf16Poison));
  for (size_t i = 0; i < n_qkv; ++i) qkv[kGuard + i] = __float2bfloat16(qkv_f[i]);
  std::vector<bf16> out(kGuard + n_out + kGuard, from_bits(kBf16Poison));
  std::vector<uint32_t> lse_bits(kGuard + n_lse + kGuard, kF32Poison);
  emu::clear_globals();
  emu::register_global(qkv.data() + kGuard, n_qkv * sizeof(bf16));  // guards are not part of the tensor
  attention_fwd_wgmma(g_pingpong, out.data() + kGuard, reinterpret_cast<float*>(lse_bits.data() + kGuard),
                      qkv.data() + kGuard, s.B, s.T, C, s.NH, nullptr);
  for (size_t i = 0; i < kGuard; ++i) {
    if (bits(out[i]) != kBf16Poison || bits(out[kGuard + n_out + i]) != kBf16Poison)
      emu::fail("the kernel wrote outside `out`");
    if (lse_bits[i] != kF32Poison || lse_bits[kGuard + n_lse + i] != kF32Poison)
      emu::fail("the kernel wrote outside `lse`");
  }
  RunOut r;
  r.out.resize(n_out);
  for (size_t i = 0; i < n_out; ++i) r.out[i] = bits(out[kGuard + i]);
  r.lse.resize(n_lse);
  std::memcpy(r.lse.data(), lse_bits.data() + kGuard, n_lse * 4);
  return r;
}

struct Report {
  double out_err, naive_err, out_tol, lse_err, lse_tol;
  bool pass;
};

Report check(const Shape& s, const std::vector<float>& qkv, const RunOut& r) {
  const int C = 64 * s.NH, C3 = 3 * C, hs = 64;
  const double scale = 1.0 / std::sqrt(64.0);
  double out_err = 0, naive_err = 0, max_ref = 0, lse_err = 0, max_lse = 0;
  std::vector<double> sc(s.T), p(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const float* q = &qkv[(static_cast<size_t>(b) * s.T + t) * C3 + h * hs];
        double mx = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = &qkv[(static_cast<size_t>(b) * s.T + t2) * C3 + C + h * hs];
          double dot = 0;
          for (int i = 0; i < hs; ++i) dot += static_cast<double>(q[i]) * k[i];
          sc[t2] = dot * scale;
          mx = std::max(mx, sc[t2]);
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) sum += std::exp(sc[t2] - mx);
        const double lse_ref = mx + std::log(sum);
        for (int t2 = 0; t2 <= t; ++t2) p[t2] = std::exp(sc[t2] - lse_ref);
        const float got_lse = r.lse[(static_cast<size_t>(b) * s.NH + h) * s.T + t];
        const double le = std::fabs(got_lse - lse_ref);
        lse_err = std::isnan(le) ? INFINITY : std::max(lse_err, le);
        max_lse = std::max(max_lse, std::fabs(lse_ref));
        for (int i = 0; i < hs; ++i) {
          double o = 0, on = 0;
          for (int t2 = 0; t2 <= t; ++t2) {
            const double v = qkv[(static_cast<size_t>(b) * s.T + t2) * C3 + 2 * C + h * hs + i];
            o += p[t2] * v;
            on += static_cast<double>(bf(static_cast<float>(p[t2]))) * v;  // naive chain: P in bf16
          }
          const double got = __bfloat162float(from_bits(r.out[(static_cast<size_t>(b) * s.T + t) * C + h * hs + i]));
          const double e = std::fabs(got - o);
          out_err = std::isnan(e) ? INFINITY : std::max(out_err, e);
          naive_err = std::max(naive_err, std::fabs(static_cast<double>(bf(static_cast<float>(on))) - o));
          max_ref = std::max(max_ref, std::fabs(o));
        }
      }
  Report rep;
  rep.out_err = out_err, rep.naive_err = naive_err, rep.lse_err = lse_err;
  rep.out_tol = 2.0 * naive_err + max_ref / 512.0;          // test::expect_close_bf16
  rep.lse_tol = 4e-5 * std::max(1.0, max_lse);               // check_attention, bf16
  rep.pass = out_err <= rep.out_tol && lse_err <= rep.lse_tol;
  return rep;
}

std::vector<float> random_qkv(const Shape& s, uint32_t seed) {
  const size_t n = static_cast<size_t>(s.B) * s.T * 3 * 64 * s.NH;
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, s.scale);
  std::vector<float> v(n);
  for (auto& x : v) x = bf(d(gen));
  return v;
}

// Batch `victim`'s qkv replaced by NaN: the other batch's results must not change by a single bit.
bool isolation(const Shape& s, const std::vector<float>& qkv, const RunOut& base, int victim) {
  const int C = 64 * s.NH;
  std::vector<float> q2 = qkv;
  const size_t per_b = static_cast<size_t>(s.T) * 3 * C;
  for (size_t i = 0; i < per_b; ++i) q2[victim * per_b + i] = NAN;
  const RunOut r = launch(s, q2);
  for (int b = 0; b < s.B; ++b) {
    if (b == victim) continue;
    const size_t o0 = static_cast<size_t>(b) * s.T * C, o1 = o0 + static_cast<size_t>(s.T) * C;
    for (size_t i = o0; i < o1; ++i)
      if (r.out[i] != base.out[i]) return false;
    const size_t l0 = static_cast<size_t>(b) * s.NH * s.T, l1 = l0 + static_cast<size_t>(s.NH) * s.T;
    if (std::memcmp(&r.lse[l0], &base.lse[l0], (l1 - l0) * 4) != 0) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  bool iso = true, stop_on_fail = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      shapes = {{2, 129, 2}, {1, 300, 1}, {2, 63, 1}, {1, 256, 3}, {1, 520, 1}};  // 520: the stage ring wraps
    } else if (a == "--test-shapes") {  // AttentionWgmmaForward.MatchesCpu's own list
      shapes = gpu_test_shapes();
    } else if (a == "--gpt2") {
      shapes = {{2, 1024, 12}};
    } else if (a == "--pingpong") {
      g_pingpong = true;
    } else if (a == "--no-isolation") {
      iso = false;
    } else if (a == "--stop-on-fail") {
      stop_on_fail = true;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (shapes.empty())
    for (int T : {1, 63, 64, 127, 128, 129, 200, 256, 300, 400, 520})
      for (int B : {1, 2})
        for (int NH : {1, 2, 3}) shapes.push_back({B, T, NH});
  const auto& cfg = emu::config();
  std::printf("emulator: %s schedule, dynamic smem at window offset %u, TMA delay <= %u us, wait delay <= %u us, "
              "seed %u\n", g_pingpong ? "ping-pong" : "cooperative", cfg.smem_offset, cfg.tma_delay_us,
              cfg.wait_delay_us, cfg.seed);
  int fails = 0;
  uint32_t seed = 900;
  for (const Shape& s : shapes) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<float> qkv = random_qkv(s, seed += 10);
    const RunOut r = launch(s, qkv);
    const Report rep = check(s, qkv, r);
    std::string iso_txt = "";
    bool ok = rep.pass;
    if (iso && s.B >= 2) {
      const bool a = isolation(s, qkv, r, 1), b = isolation(s, qkv, r, 0);
      iso_txt = a && b ? " isolation=OK" : " isolation=FAIL";
      ok = ok && a && b;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("B=%d T=%-4d NH=%d C=%-3d scale=%.0f  out_err=%.3e (tol %.3e, naive %.3e)  lse_err=%.3e (tol %.3e)%s  %s  "
                "[%.1fs]\n",
                s.B, s.T, s.NH, 64 * s.NH, s.scale, rep.out_err, rep.out_tol, rep.naive_err, rep.lse_err, rep.lse_tol,
                iso_txt.c_str(), ok ? "PASS" : "FAIL", secs);
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
