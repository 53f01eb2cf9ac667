#include "data/byte_tokenizer.hpp"

namespace gpt2 {

std::vector<uint32_t> ByteTokenizer::encode(const std::string& text) {
  std::vector<uint32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (int32_t t : tokens) out.push_back(static_cast<char>(t & 0xFF));
  return out;
}

}  // namespace gpt2
