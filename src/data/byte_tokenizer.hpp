// Byte-level tokenizer: token = byte value, vocabulary 256, no end-of-text token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpt2 {

struct ByteTokenizer {
  static constexpr int kVocabSize = 256;
  static std::vector<uint32_t> encode(const std::string& text);
  static std::string decode(const std::vector<int32_t>& tokens);
};

}  // namespace gpt2
