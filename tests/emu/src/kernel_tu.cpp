// The repository's attention_sm90.cu compiled as host C++ for the emulator. KERNEL_SRC is a copy of it
// (or of a mutant) in which only the `<<<...>>>` launch line was rewritten (see emu.sh; the build diffs
// it against the original). `extern __shared__ unsigned char smem_raw[]` becomes a (block-scope
// redeclared) function returning the emulated dynamic shared memory of the current block.
#include "emu/prelude.h"

namespace gpt2::kernels::attention_detail {
namespace {
inline unsigned char (*emu_dynamic_smem())[] { return reinterpret_cast<unsigned char (*)[]>(emu::dynamic_smem()); }
}  // namespace
}  // namespace gpt2::kernels::attention_detail
#define smem_raw (*emu_dynamic_smem())

#include KERNEL_SRC
