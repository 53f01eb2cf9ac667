// An sm_90a kernel file compiled as host C++ for the emulator. KERNEL_SRC is a copy of it (or of a
// mutant) in which only the `<<<...>>>` launch line was rewritten (emu.sh diffs it against the source and
// stops if any other line differs); KERNEL_NS is its namespace (attention_detail or gemm_detail).
// `extern __shared__ unsigned char smem_raw[]` becomes a block-scope redeclaration of a function
// returning the current block's emulated dynamic shared memory, so concurrently running blocks each see
// their own.
#include "emu/prelude.h"

namespace gpt2::kernels::KERNEL_NS {
namespace {
inline unsigned char (*emu_dynamic_smem())[] { return reinterpret_cast<unsigned char (*)[]>(emu::dynamic_smem()); }
}  // namespace
}  // namespace gpt2::kernels::KERNEL_NS
#define smem_raw (*emu_dynamic_smem())

#include KERNEL_SRC
