// libFuzzer harness: GPT-2's BPE tokenizer (src/data/gpt2_tokenizer.cpp) on arbitrary bytes, with
// the vocabulary of tools/get-gpt2-vocab.sh (GPT2_VOCAB_DIR, else its default directory; tools/fuzz.sh
// fetches it). Properties the header promises: decode(encode(x)) == x for every byte string, the
// pre-tokenization pieces concatenate to x, and the piece cache never changes the ids.
#include <cstdlib>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace {

std::string vocab_dir() {
  const char* d = std::getenv("GPT2_VOCAB_DIR");
  return d != nullptr && *d != '\0' ? d : gpt2::Gpt2Tokenizer::default_vocab_dir();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const gpt2::Gpt2Tokenizer cached = gpt2::Gpt2Tokenizer::from_dir(vocab_dir());
  static const gpt2::Gpt2Tokenizer uncached = gpt2::Gpt2Tokenizer::from_dir(vocab_dir(), 0);
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  std::string joined;
  for (const std::string_view piece : gpt2::Gpt2Tokenizer::split(text)) {
    if (piece.empty()) gpt2::fuzz::property_failed("empty pre-tokenization piece");
    joined.append(piece);
  }
  if (joined != text) gpt2::fuzz::property_failed("pieces do not concatenate to the input");

  const std::vector<uint32_t> ids = cached.encode(text);
  if (cached.decode(ids) != text) gpt2::fuzz::property_failed("decode(encode(x)) != x");
  if (uncached.encode(text) != ids) gpt2::fuzz::property_failed("the piece cache changed the ids");
  return 0;
}
