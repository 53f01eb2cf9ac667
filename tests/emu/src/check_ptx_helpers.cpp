// Compares the repository's host-callable layout helpers in kernels/common/ptx.cuh (wgmma_desc,
// wgmma_acc_row/col; extracted textually into BUILD_DIR/repo_ptx_helpers.h by emu.sh) with the
// emulator's doc-derived ones (include/kernels/common/ptx.cuh), exhaustively / on random inputs.
#include "emu/prelude.h"
#include "kernels/common/ptx.cuh"

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
  return bad != 0;
}
