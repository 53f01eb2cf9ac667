#include "comm/nccl_version.hpp"

#ifdef GPT2_HAVE_CUDA
#include <nccl.h>
#endif

namespace gpt2 {

std::string nccl_version_string() {
#ifdef GPT2_HAVE_CUDA
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
#else
  return "";
#endif
}

}  // namespace gpt2
