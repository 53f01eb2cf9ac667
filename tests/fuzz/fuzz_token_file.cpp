// libFuzzer harness: the HDF5 token-file reader (src/data/token_file.cpp) on an arbitrary file,
// reading the last tokens of an accepted file and, for a small one, all of them with its CRC-32. Parsing the HDF5 structure is libhdf5's (not
// instrumented for coverage, and not ours to fix); what this checks is our side: every rejection is
// a clean error, the reads stay inside the dataset, and no HDF5 identifier is left open.
#include <algorithm>
#include <vector>

#include "data/token_file.hpp"
#include "tests/fuzz/fuzz_hdf5.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpt2::fuzz::install_reject_hook();
  const std::string path = gpt2::fuzz::write_input("token_file", data, size);
  try {
    gpt2::TokenFile tf(path);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(tf.size(), 4096));
    std::vector<int32_t> tokens(n);
    if (n > 0) tf.read(tf.size() - n, n, tokens.data());
    // The whole-file CRC-32 check of gpt2-data inspect, for files whose header claims few enough tokens
    // (a mutated one may claim 2^40, which would read fill values for hours).
    if (tf.size() <= (uint64_t{1} << 16)) (void)tf.verify_crc32();
  } catch (const gpt2::fuzz::Rejected&) {
  }
  gpt2::fuzz::check_no_open_hdf5_ids();
  return 0;
}
