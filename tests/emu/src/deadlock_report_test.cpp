// The emulator's deadlock detector and its report (emu_runtime.cpp; README, Deadlocks): one block in which
// lanes 0-30 wait in a shuffle for lane 31, lane 31 waits at a named barrier for the second warp, the second
// warp's thread 63 waits for an mbarrier phase that needs one more arrival, and its others spin on a flag
// nobody sets. The process must end with a deadlock error, and the report must
// name each wait (emu.sh checks its lines). The report's text is kept as numbers and formatted only when a
// report prints it, so this is what shows that the deferred text still comes out right.
#include "emu/prelude.h"
#include "kernels/common/ptx.cuh"

#include <cstdio>

namespace {
void stuck(int* out, const int* never_set) {
  const int t = static_cast<int>(threadIdx.x);
  if (t == 31) {
    gpt2::cuda::named_barrier_sync(1, 64);  // the second warp never arrives
  } else if (t < 32) {
    out[t] = __shfl_xor_sync(0xffffffffu, t, 1);  // lane 31 never arrives
  } else if (t == 63) {
    EMU_STATIC_SHARED(uint64_t, bar, [1], 8);
    gpt2::cuda::mbarrier_init(&bar[0], 2);
    gpt2::cuda::mbarrier_arrive(&bar[0]);  // 1 of the 2
    gpt2::cuda::mbarrier_wait_untimed(&bar[0], 0);
  } else {
    while (gpt2::cuda::ld_acquire_gpu(never_set) == 0) {
    }
  }
}
}  // namespace

int main() {
  static int out[32];
  static int never_set = 0;
  emu::Launch(dim3(1), dim3(64)).run(stuck, out, &never_set);
  cudaDeviceSynchronize();
  std::printf("the block finished: the emulator missed the deadlock\n");
  return 0;
}
