// Unit tests of the GPT-2 tokenizer (src/data/gpt2_tokenizer.*).
//
//   test_tokenizer GET_VOCAB_SCRIPT [gtest flags]
//
// The vocabulary comes from tools/get-gpt2-vocab.sh (its default cache directory), run by this test.
// Expected ids and pieces below were produced by the reference encoder (npm gpt-3-encoder 1.1.4 under
// node 20); tests/tokenizer/test_bpe_vs_js.py compares against it directly on many more texts.
#include <gtest/gtest.h>

#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "data/gpt2_tokenizer.hpp"
#include "data/unicode_tables.hpp"

namespace gpt2 {
namespace {

std::string g_vocab_script;
std::string g_vocab_dir;

using Ids = std::vector<uint32_t>;
using Pieces = std::vector<std::string>;

const Gpt2Tokenizer& tok() {
  static const Gpt2Tokenizer t = Gpt2Tokenizer::from_dir(g_vocab_dir);
  return t;
}

Pieces split(std::string_view text) {
  Pieces out;
  for (std::string_view p : Gpt2Tokenizer::split(text)) out.emplace_back(p);
  return out;
}

std::string random_bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

// Valid UTF-8 pieces mixed with bytes that are not UTF-8.
std::string random_mixed(std::mt19937_64& rng, size_t items) {
  // clang-format off
  static const char* kPool[] = {
      "a", "Z", "é", "ж", "中", "😀", "👨‍👩‍👧", " ", "  ", "\n", "\t", "'s", "'S", "1", "٣", "\xc2\xa0",
      "\xe3\x80\x80", "!", "x\u0301", "\xef\xbb\xbf",
      // not UTF-8: stray bytes, truncated sequences, an encoded surrogate, beyond U+10FFFF, overlong
      "\xff", "\xc3", "\xe2\x82", "\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf"};
  // clang-format on
  const size_t n = sizeof(kPool) / sizeof(kPool[0]);
  std::string s;
  for (size_t i = 0; i < items; ++i) s += kPool[rng() % n];
  return s;
}

TEST(Gpt2Tokenizer, Vocabulary) {
  EXPECT_EQ(tok().vocab_size(), 50257u);
  EXPECT_EQ(Gpt2Tokenizer::kEot, 50256u);
  EXPECT_EQ(tok().token_bytes(Gpt2Tokenizer::kEot), "<|endoftext|>");
  EXPECT_EQ(tok().decode(Ids{Gpt2Tokenizer::kEot}), "<|endoftext|>");
  EXPECT_EQ(tok().token_bytes(262), " the");
  EXPECT_EQ(tok().token_bytes(220), " ");
  EXPECT_EQ(tok().token_bytes(0), "!");
  // "<|endoftext|>" in text is ordinary text, as in the reference encoder.
  EXPECT_EQ(tok().encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
}

TEST(Gpt2Tokenizer, EmptyInput) {
  EXPECT_TRUE(tok().encode("").empty());
  EXPECT_EQ(tok().decode(nullptr, 0), "");
  EXPECT_TRUE(Gpt2Tokenizer::split("").empty());
  Ids ids = {7};
  tok().encode_append("", ids);
  EXPECT_EQ(ids, Ids{7});
}

// Ids from node's gpt-3-encoder.
TEST(Gpt2Tokenizer, KnownEncodings) {
  const std::vector<std::pair<std::string, Ids>> cases = {
      {"Hello world", {15496, 995}},
      {"Hello, world! How are you?", {15496, 11, 995, 0, 1374, 389, 345, 30}},
      {" the", {262}},
      {"It's 2024: IT'S 'S time.", {1026, 338, 48609, 25, 7283, 6, 50, 705, 50, 640, 13}},
      {"naïve café", {2616, 38776, 40304}},
      {"日本語のテキスト", {33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
      {"👨‍👩‍👧‍👦", {41840, 101, 447, 235, 41840, 102, 447, 235, 41840, 100, 447, 235, 41840, 99}},
      {"a  b\n\n\tc   ", {64, 220, 275, 628, 197, 66, 220, 220, 220}},
      {"   ", {220, 220, 220}},
      {"१२३ ٣٤", {24231, 100, 24231, 101, 24231, 102, 18923, 96, 149, 97}},
      {"def f(x):\n    return x**2\n", {4299, 277, 7, 87, 2599, 198, 220, 220, 220, 1441, 2124, 1174, 17, 198}},
      {"a\u00a0\u00a0b", {64, 1849, 1849, 65}},
      {"x\u3000\u3000y", {87, 5099, 222, 5099, 222, 88}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok().encode(text), ids) << text;
    EXPECT_EQ(tok().decode(ids), text);
  }
}

// Pieces from node's  text.matchAll(pattern)  with the /u flag.
TEST(Gpt2Tokenizer, PreTokenization) {
  EXPECT_EQ(split("It's 2024: IT'S 'S time."),
            (Pieces{"It", "'s", " 2024", ":", " IT", "'", "S", " '", "S", " time", "."}));
  EXPECT_EQ(split("a  b\n\n\tc   "), (Pieces{"a", " ", " b", "\n\n", "\t", "c", "   "}));
  EXPECT_EQ(split("def f(x):\n    return x**2\n"),
            (Pieces{"def", " f", "(", "x", "):", "\n   ", " return", " x", "**", "2", "\n"}));
  EXPECT_EQ(split("<|endoftext|>"), (Pieces{"<|", "endoftext", "|>"}));
  EXPECT_EQ(split("a\u00a0\u00a0b"), (Pieces{"a", "\u00a0", "\u00a0", "b"}));
  EXPECT_EQ(split("we're they'll I'd 'm 'x"), (Pieces{"we", "'re", " they", "'ll", " I", "'d", " '", "m", " '", "x"}));
  EXPECT_EQ(split("x'"), (Pieces{"x", "'"}));
  EXPECT_EQ(split("!'s"), (Pieces{"!'", "s"}));                      // "other" runs swallow the apostrophe
  EXPECT_EQ(split("cafe\u0301s"), (Pieces{"cafe", "\u0301", "s"}));  // a combining mark is not \p{L}
  EXPECT_EQ(split("a\u0085b"), (Pieces{"a", "\u0085", "b"}));        // NEL is not \s in JavaScript
  EXPECT_EQ(split("a\ufeffb"), (Pieces{"a", "\ufeff", "b"}));        // but U+FEFF is
  EXPECT_EQ(split(" \u3000x"), (Pieces{" ", "\u3000", "x"}));
  EXPECT_EQ(split("x \n"), (Pieces{"x", " \n"}));
  EXPECT_EQ(split(" "), (Pieces{" "}));
}

TEST(Gpt2Tokenizer, InvalidUtf8IsBytesOfClassOther) {
  EXPECT_EQ(split("a\xff"
                  "b"),
            (Pieces{"a", "\xff", "b"}));
  EXPECT_EQ(split(" \xff\xfe!"), (Pieces{" \xff\xfe!"}));
  EXPECT_EQ(split("\xc3"
                  "a"),
            (Pieces{"\xc3", "a"}));                                  // truncated sequence
  EXPECT_EQ(split("\xed\xa0\x80x"), (Pieces{"\xed\xa0\x80", "x"}));  // encoded surrogate
  EXPECT_EQ(split("\xc1\x81"
                  "A"),
            (Pieces{"\xc1\x81", "A"}));                                    // overlong 'A' is not a letter
  EXPECT_EQ(split("\xc2\xa0\xa0 x"), (Pieces{"\xc2\xa0", "\xa0", " x"}));  // NBSP, then a stray byte
  // Every single byte and every pair of bytes round-trips.
  for (int a = 0; a < 256; ++a) {
    const std::string one(1, static_cast<char>(a));
    ASSERT_EQ(tok().decode(tok().encode(one)), one);
    ASSERT_EQ(tok().encode(one).size(), 1u);
    for (int b = 0; b < 256; ++b) {
      const std::string two = one + static_cast<char>(b);
      ASSERT_EQ(tok().decode(tok().encode(two)), two) << a << " " << b;
    }
  }
}

TEST(Gpt2Tokenizer, RoundTripArbitraryBytes) {
  std::mt19937_64 rng(42);
  for (int k = 0; k < 2000; ++k) {
    const std::string text = k % 2 == 0 ? random_bytes(rng, rng() % 300) : random_mixed(rng, rng() % 200);
    const Ids ids = tok().encode(text);
    ASSERT_EQ(tok().decode(ids), text) << "case " << k;
    std::string joined;
    for (std::string_view p : Gpt2Tokenizer::split(text)) joined += p;
    ASSERT_EQ(joined, text);
  }
}

// The cache never changes a result: no cache, a cache that is cleared all the time, the default one.
TEST(Gpt2Tokenizer, CacheDoesNotChangeIds) {
  const Gpt2Tokenizer no_cache = Gpt2Tokenizer::from_dir(g_vocab_dir, 0);
  const Gpt2Tokenizer tiny_cache = Gpt2Tokenizer::from_dir(g_vocab_dir, 3);
  std::mt19937_64 rng(3);
  std::string text;
  for (int k = 0; k < 50; ++k) text += random_mixed(rng, 100) + " The quick brown fox's jumps, 1234 times. ";
  const Ids expected = no_cache.encode(text);
  for (int rep = 0; rep < 3; ++rep) {
    EXPECT_EQ(tok().encode(text), expected);
    EXPECT_EQ(tiny_cache.encode(text), expected);
  }
}

// encode() is const and thread-safe: threads sharing one tokenizer give the serial results, and a thread
// alternating between two tokenizers (each with its own per-thread cache state) does too.
TEST(Gpt2Tokenizer, ConcurrentEncode) {
  const Gpt2Tokenizer other = Gpt2Tokenizer::from_dir(g_vocab_dir);
  std::vector<std::string> texts;
  std::mt19937_64 rng(5);
  for (int k = 0; k < 8; ++k) texts.push_back(random_mixed(rng, 20000));
  std::vector<Ids> expected;
  for (const std::string& t : texts) expected.push_back(tok().encode(t));
  std::vector<Ids> got(texts.size()), got_other(texts.size());
  std::vector<std::thread> threads;
  for (size_t w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (size_t k = w; k < texts.size(); k += 4) {
        got[k] = tok().encode(texts[k]);
        got_other[k] = other.encode(texts[k]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got_other, expected);
}

// Pieces longer than the linear-scan limit go through the heap algorithm.
TEST(Gpt2Tokenizer, LongPieces) {
  std::mt19937_64 rng(11);
  for (size_t len : {100u, 127u, 128u, 129u, 130u, 300u, 5000u}) {
    std::string word;
    for (size_t i = 0; i < len; ++i) word.push_back(static_cast<char>('a' + rng() % 26));
    const Ids ids = tok().encode(word);
    EXPECT_EQ(tok().decode(ids), word);
    // A piece's BPE does not depend on what follows it: the word alone and inside a sentence agree.
    Ids in_text = tok().encode("x " + word + " y");
    ASSERT_GE(in_text.size(), ids.size() + 2);
    EXPECT_EQ(Ids(in_text.begin() + 1, in_text.end() - 1), tok().encode(" " + word));
  }
  // A 1 MiB single piece of letters and a 1 MiB whitespace run: complete and round-trip.
  std::string letters(1 << 20, 'a');
  for (char& c : letters) c = static_cast<char>('a' + rng() % 26);
  EXPECT_EQ(tok().decode(tok().encode(letters)), letters);
  const std::string spaces = std::string(1 << 20, ' ') + "x";
  const Ids space_ids = tok().encode(spaces);
  EXPECT_EQ(tok().decode(space_ids), spaces);
}

// 100 MB of text without a line break: completes (not a timed test) and round-trips.
TEST(Gpt2Tokenizer, HundredMegabyteSingleLine) {
  static const char* kWords[] = {"the",    "tokenizer", "of",  "GPT-2",  "reads", "bytes,",
                                 "merges", "pairs",     "and", "writes", "ids;",  "naïve",
                                 "café",   "日本語",    "42",  "it's",   "(x)",   "don't"};
  std::mt19937_64 rng(100);
  std::string line;
  line.reserve(100'000'100);
  while (line.size() < 100'000'000) {
    line += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
    line += rng() % 16 == 0 ? "  " : " ";
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = tok().encode(line);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("100 MB line: %zu tokens in %.2f s (%.1f MB/s)\n", ids.size(), s, line.size() / 1e6 / s);
  EXPECT_GT(ids.size(), line.size() / 10);
  EXPECT_EQ(tok().decode(ids), line);
}

TEST(UnicodeTables, SortedAndSpotChecks) {
  using namespace unicode;
  for (size_t r = 0; r < kCharClassRangeCount; ++r) {
    ASSERT_LE(kCharClassRanges[r].first, kCharClassRanges[r].last);
    ASSERT_NE(kCharClassRanges[r].cls, kOther);
    if (r > 0) {
      ASSERT_LT(kCharClassRanges[r - 1].last, kCharClassRanges[r].first);
    }
  }
  EXPECT_EQ(char_class('a'), kLetter);
  EXPECT_EQ(char_class('7'), kNumber);
  EXPECT_EQ(char_class(' '), kSpace);
  EXPECT_EQ(char_class('\v'), kSpace);
  EXPECT_EQ(char_class('_'), kOther);
  EXPECT_EQ(char_class(0x0301), kOther);  // combining acute accent (Mn)
  EXPECT_EQ(char_class(0x00A0), kSpace);  // NBSP (Zs)
  EXPECT_EQ(char_class(0x0085), kOther);  // NEL: not \s in JavaScript
  EXPECT_EQ(char_class(0x180E), kOther);  // Mongolian vowel separator: Cf since Unicode 6.3
  EXPECT_EQ(char_class(0x200B), kOther);  // zero width space (Cf)
  EXPECT_EQ(char_class(0xFEFF), kSpace);  // BOM: \s in JavaScript
  EXPECT_EQ(char_class(0x2028), kSpace);
  EXPECT_EQ(char_class(0x3000), kSpace);
  EXPECT_EQ(char_class(0x0660), kNumber);  // Arabic-Indic zero
  EXPECT_EQ(char_class(0x2163), kNumber);  // Roman numeral four (Nl)
  EXPECT_EQ(char_class(0x00BD), kNumber);  // one half (No)
  EXPECT_EQ(char_class(0x4E2D), kLetter);
  EXPECT_EQ(char_class(0x20000), kLetter);  // CJK extension B
  EXPECT_EQ(char_class(0x1D7D8), kNumber);  // mathematical double-struck zero
  EXPECT_EQ(char_class(0x1F600), kOther);   // emoji
  EXPECT_EQ(char_class(0xD800), kOther);
  EXPECT_EQ(char_class(0x10FFFF), kOther);
  EXPECT_EQ(char_class(0x110000), kOther);
  EXPECT_EQ(char_class(0xFFFFFFFF), kOther);
}

// ---- errors: a clear message naming the file, and the job ends -----------------------------------

class TokenizerFiles : public ::testing::Test {
 protected:
  // Death tests re-run the test in a child process; the child finds the parent's directory in the
  // environment and leaves its removal to the parent.
  void SetUp() override {
    if (const char* inherited = std::getenv(kDirEnv); inherited != nullptr) {
      dir_ = inherited;
    } else {
      dir_ = ::testing::TempDir() + "tokenizer_files_" + std::to_string(::getpid());
      owner_ = true;
      ::setenv(kDirEnv, dir_.c_str(), 1);
    }
    const std::string cmd = "mkdir -p '" + dir_ + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  void TearDown() override {
    if (!owner_) return;
    const std::string cmd = "rm -rf '" + dir_ + "'";
    (void)std::system(cmd.c_str());
    ::unsetenv(kDirEnv);
  }
  static std::string read(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  std::string write(const std::string& name, const std::string& data) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << data;
    return path;
  }
  static constexpr const char* kDirEnv = "GPT2_TOKENIZER_TEST_FILES";
  std::string dir_;
  bool owner_ = false;
};

TEST_F(TokenizerFiles, MissingFile) {
  const std::string enc = dir_ + "/nope/encoder.json";
  EXPECT_EXIT(Gpt2Tokenizer(enc, g_vocab_dir + "/vocab.bpe"), ::testing::ExitedWithCode(1),
              "GPT-2 vocabulary file '.*nope/encoder.json': cannot open.*get-gpt2-vocab.sh");
  EXPECT_EXIT(Gpt2Tokenizer(g_vocab_dir + "/encoder.json", dir_ + "/vocab.bpe"), ::testing::ExitedWithCode(1),
              "vocab.bpe': cannot open");
}

TEST_F(TokenizerFiles, CorruptEncoderJson) {
  const std::string good = read(g_vocab_dir + "/encoder.json");
  const std::string bpe = g_vocab_dir + "/vocab.bpe";
  const std::string truncated = write("truncated.json", good.substr(0, good.size() / 2));
  EXPECT_EXIT(Gpt2Tokenizer(truncated, bpe), ::testing::ExitedWithCode(1),
              "truncated.json' .*not a valid encoder.json: invalid JSON: .* at byte [0-9]+");
  const std::string not_json = write("not_json.json", "<html>404</html>");
  EXPECT_EXIT(Gpt2Tokenizer(not_json, bpe), ::testing::ExitedWithCode(1), "not_json.json' .*not a valid encoder.json");
  const std::string small = write("small.json", "{\"a\": 0, \"b\": 1}");
  EXPECT_EXIT(Gpt2Tokenizer(small, bpe), ::testing::ExitedWithCode(1), "small.json': 2 tokens, GPT-2 has 50257");
  // The vocabulary files swapped.
  EXPECT_EXIT(Gpt2Tokenizer(bpe, g_vocab_dir + "/encoder.json"), ::testing::ExitedWithCode(1),
              "vocab.bpe' .*not a valid encoder.json");
}

TEST_F(TokenizerFiles, CorruptVocabBpe) {
  const std::string enc = g_vocab_dir + "/encoder.json";
  const std::string good = read(g_vocab_dir + "/vocab.bpe");
  const std::string no_header = write("no_header.bpe", good.substr(good.find('\n') + 1));
  EXPECT_EXIT(Gpt2Tokenizer(enc, no_header), ::testing::ExitedWithCode(1), "no_header.bpe': not a vocab.bpe file");
  std::string bad_line = good;
  bad_line.insert(bad_line.find('\n', 1000) + 1, "three token line\n");
  const std::string bad = write("bad_line.bpe", bad_line);
  EXPECT_EXIT(Gpt2Tokenizer(enc, bad), ::testing::ExitedWithCode(1), "bad_line.bpe': line [0-9]+ is not a merge");
  std::string unknown = good;
  unknown.insert(unknown.find('\n') + 1, "qqqqqqqqq zzzzzzzzzz\n");
  const std::string unk = write("unknown.bpe", unknown);
  EXPECT_EXIT(Gpt2Tokenizer(enc, unk), ::testing::ExitedWithCode(1),
              "unknown.bpe': line 2: merge of tokens missing from the vocabulary");
}

TEST(Gpt2TokenizerDeath, DecodeOutOfRange) {
  const Ids ids = {1, 50257};
  EXPECT_EXIT(tok().decode(ids), ::testing::ExitedWithCode(1), "token id 50257 at position 1 is out of range");
}

}  // namespace
}  // namespace gpt2

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  if (argc != 2) {
    std::fprintf(stderr, "usage: test_tokenizer PATH/TO/tools/get-gpt2-vocab.sh [gtest flags]\n");
    return 2;
  }
  gpt2::g_vocab_script = argv[1];
  // The script verifies (and on first use fetches) the vocabulary, then prints its directory last.
  const std::string cmd = "bash '" + gpt2::g_vocab_script + "'";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) gpt2::g_vocab_dir = buf;
  if (p == nullptr || pclose(p) != 0 || gpt2::g_vocab_dir.empty()) {
    std::fprintf(stderr, "test_tokenizer: %s failed\n", cmd.c_str());
    return 1;
  }
  while (!gpt2::g_vocab_dir.empty() && gpt2::g_vocab_dir.back() == '\n') gpt2::g_vocab_dir.pop_back();
  return RUN_ALL_TESTS();
}
