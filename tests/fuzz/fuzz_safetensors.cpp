// libFuzzer harness: the safetensors reader (src/train/safetensors.cpp) on an arbitrary file. Every
// floating-point tensor of an accepted file is read (the data section is bounded by the file, so this
// stays small). Property: a file the reader accepts is one looks_like_safetensors() recognises.
#include <vector>

#include "tests/fuzz/fuzz_common.hpp"
#include "train/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpt2::fuzz::install_reject_hook();
  const std::string path = gpt2::fuzz::write_input("safetensors", data, size);
  try {
    gpt2::SafetensorsFile f(path);
    if (!gpt2::looks_like_safetensors(path)) gpt2::fuzz::property_failed("accepted file not recognised");
    std::vector<float> out;
    for (const gpt2::SafetensorsTensor& t : f.tensors()) {
      if (f.find(t.name) != &t) gpt2::fuzz::property_failed("find() misses a tensor");
      if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") continue;
      out.assign(t.numel(), 0.0f);
      f.read_f32(t, out.data());
    }
  } catch (const gpt2::fuzz::Rejected&) {
  }
  return 0;
}
