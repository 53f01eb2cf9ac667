// Compares the repository's host-callable layout helpers in kernels/common/ptx.cuh (wgmma_desc,
// wgmma_acc_row/col; extracted textually into BUILD_DIR/repo_ptx_helpers.h by emu.sh) with the
// emulator's doc-derived ones (include/kernels/common/ptx.cuh), exhaustively / on random inputs; and that the
// emulator's ex2/rcp model is what its README says: within 2 / 1 ulp of the exact value and off by that much
// on some inputs, exact where the hardware is, deterministic, subnormals flushed.
#include "emu/prelude.h"
#include "kernels/common/ptx.cuh"

#include <cmath>
#include <cstdio>
#include <random>

namespace repo {
#include "repo_ptx_helpers.h"
}

int main() {
  int bad = 0;
  for (int w = 0; w < 4; ++w)
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < 128; ++i) {
        if (repo::wgmma_acc_row(w, l, i) != gpt2::cuda::wgmma_acc_row(w, l, i)) ++bad;
        if (repo::wgmma_acc_col(l, i) != gpt2::cuda::wgmma_acc_col(l, i)) ++bad;
      }
  std::mt19937 gen(5);
  for (int it = 0; it < 1000000; ++it) {
    const uint32_t a = gen() & 0x3FFF0, lbo = gen() & 0x3FFF0, sbo = gen() & 0x3FFF0;
    const int sw = gen() & 3;
    if (repo::wgmma_desc(a, lbo, sbo, static_cast<repo::WgmmaSwizzle>(sw)) !=
        gpt2::cuda::wgmma_desc(a, lbo, sbo, static_cast<gpt2::cuda::WgmmaSwizzle>(sw)))
      ++bad;
  }
  std::printf("ptx.cuh helpers (wgmma_desc, wgmma_acc_row, wgmma_acc_col) vs doc-derived: %s (%d mismatches)\n",
              bad ? "MISMATCH" : "identical", bad);

  // The MUFU model: error in ulps of the exact (double) value, over random normal inputs; the model's
  // offset comes on top of glibc's exp2f (0.502 ulp at most) and the correctly rounded quotient (0.5).
  int bad_mufu = 0;
  long off_ex2 = 0, off_rcp = 0;
  const auto ulps = [](float got, double exact) {
    return std::fabs(got - exact) / std::ldexp(1.0, std::ilogb(static_cast<float>(exact)) - 23);
  };
  std::uniform_real_distribution<float> exponent(-125.0f, 127.0f), mantissa(1.0f, 2.0f);
  for (int it = 0; it < 200000; ++it) {
    const float x = exponent(gen);
    const float e = gpt2::cuda::ex2_approx_ftz(x);
    bad_mufu += !(ulps(e, std::exp2(static_cast<double>(x))) <= 2.51) || e != gpt2::cuda::ex2_approx_ftz(x);
    off_ex2 += e != std::exp2(x);
    const float y = std::ldexp(mantissa(gen), static_cast<int>(exponent(gen))) * (it % 2 ? 1.0f : -1.0f);
    const float r = gpt2::cuda::rcp_approx_ftz(y);
    bad_mufu += !(ulps(r, 1.0 / y) <= 1.5) && std::fabs(1.0 / y) >= FLT_MIN;
    off_rcp += r != 1.0f / y;
  }
  for (int n = -126; n <= 127; ++n) bad_mufu += gpt2::cuda::ex2_approx_ftz(static_cast<float>(n)) != std::ldexp(1.0f, n);
  for (int n = -126; n <= 125; ++n) bad_mufu += gpt2::cuda::rcp_approx_ftz(std::ldexp(1.0f, n)) != std::ldexp(1.0f, -n);
  bad_mufu += gpt2::cuda::ex2_approx_ftz(-130.0f) != 0.0f || gpt2::cuda::ex2_approx_ftz(1e-40f) != 1.0f ||
              gpt2::cuda::rcp_approx_ftz(1e-40f) != INFINITY || gpt2::cuda::rcp_approx_ftz(3e38f) != 0.0f ||
              gpt2::cuda::ex2_approx_ftz(-INFINITY) != 0.0f || !std::isnan(gpt2::cuda::ex2_approx_ftz(NAN));
  // Inexact on a fair share of inputs (4 of 5 offsets of ex2 and 2 of 3 of rcp are not zero).
  bad_mufu += off_ex2 < 100000 || off_rcp < 100000;
  std::printf("emulated ex2/rcp: %s (%d problems; %ld and %ld of 200000 off the exact value)\n",
              bad_mufu ? "WRONG" : "within 2 / 1 ulp, exact where the hardware is", bad_mufu, off_ex2, off_rcp);
  return bad != 0 || bad_mufu != 0;
}
