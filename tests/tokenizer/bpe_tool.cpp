// Command-line access to the GPT-2 tokenizer, for the oracle test (test_bpe_vs_js.py) and for debugging.
//
//   bpe_tool VOCAB_DIR encode [FILE...]   ids of each FILE (stdin without FILE), one line per input
//   bpe_tool VOCAB_DIR decode             whitespace-separated ids on stdin -> bytes on stdout
//   bpe_tool split [FILE]                 the pre-tokenization pieces, one a line, hex-encoded
//   bpe_tool classes                      Unicode version, then the class of every code point as JSON
//                                         ranges [first, last, class] (1 letter, 2 number, 3 space)
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.hpp"
#include "data/unicode_tables.hpp"

namespace {

std::string read_all(const char* path) {
  if (path == nullptr) return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "bpe_tool: cannot open %s\n", path);
    std::exit(1);
  }
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

int usage() {
  std::fprintf(stderr,
               "usage: bpe_tool VOCAB_DIR encode [FILE...] | bpe_tool VOCAB_DIR decode | "
               "bpe_tool split [FILE] | bpe_tool classes\n");
  return 2;
}

int classes() {
  std::printf("%s\n[", gpt2::unicode::kUnicodeVersion);
  bool first_range = true;
  uint32_t start = 0;
  int cur = -1;
  for (uint32_t cp = 0; cp <= 0x110000; ++cp) {
    const int c = cp == 0x110000 ? -1 : gpt2::unicode::char_class(cp);
    if (c == cur) continue;
    if (cur > 0) {
      std::printf("%s[%" PRIu32 ",%" PRIu32 ",%d]", first_range ? "" : ",", start, cp - 1, cur);
      first_range = false;
    }
    start = cp;
    cur = c;
  }
  std::printf("]\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  if (argc >= 2 && std::strcmp(argv[1], "classes") == 0) return classes();
  if (argc >= 2 && std::strcmp(argv[1], "split") == 0) {
    const std::string text = read_all(argc >= 3 ? argv[2] : nullptr);
    static const char* kHex = "0123456789abcdef";
    std::string out;
    for (std::string_view piece : gpt2::Gpt2Tokenizer::split(text)) {
      for (unsigned char c : piece) {
        out.push_back(kHex[c >> 4]);
        out.push_back(kHex[c & 15]);
      }
      out.push_back('\n');
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  if (argc < 3) return usage();
  const gpt2::Gpt2Tokenizer tok = gpt2::Gpt2Tokenizer::from_dir(argv[1]);
  const std::string cmd = argv[2];
  if (cmd == "encode") {
    std::vector<const char*> inputs;
    for (int i = 3; i < argc; ++i) inputs.push_back(argv[i]);
    if (inputs.empty()) inputs.push_back(nullptr);
    std::string line;
    for (const char* path : inputs) {
      line.clear();
      for (uint32_t id : tok.encode(read_all(path))) {
        if (!line.empty()) line.push_back(' ');
        line += std::to_string(id);
      }
      line.push_back('\n');
      std::fwrite(line.data(), 1, line.size(), stdout);
    }
    return 0;
  }
  if (cmd == "decode") {
    std::vector<uint32_t> ids;
    uint64_t id;
    while (std::cin >> id) {
      if (id >= tok.vocab_size()) {
        std::fprintf(stderr, "bpe_tool: token id %" PRIu64 " out of range\n", id);
        return 1;
      }
      ids.push_back(static_cast<uint32_t>(id));
    }
    if (!std::cin.eof()) {
      std::fprintf(stderr, "bpe_tool: decode expects whitespace-separated token ids\n");
      return 1;
    }
    const std::string text = tok.decode(ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  return usage();
}
