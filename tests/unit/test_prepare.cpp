// gpt2-data prepare's library: JSON-lines fields, documents -> EOT-separated token files, the
// document-level train/val split, shards, and independence from the thread count.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/prepare.hpp"
#include "data/token_file.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;

constexpr int kEot = 299;
// A stand-in tokenizer: one token per byte, vocabulary 300 with an end-of-text id (thread-safe).
std::vector<uint32_t> bytes_of(std::string_view s) { return std::vector<uint32_t>(s.begin(), s.end()); }

class Prepare : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gpt2_prepare_" + std::to_string(::getpid()) + "_" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "in");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / "in" / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  PrepareOptions options(const std::string& out) {
    PrepareOptions o;
    o.inputs = {(dir_ / "in").string()};
    o.out_dir = (dir_ / out).string();
    o.encode = bytes_of;
    o.tokenizer = "test";
    o.vocab_size = 300;
    o.eot_token = kEot;
    o.progress = false;
    return o;
  }
  static std::vector<uint32_t> read_all(const std::vector<std::string>& files) {
    std::vector<uint32_t> all;
    for (const std::string& f : files) {
      TokenFile tf(f);
      std::vector<int32_t> buf(tf.size());
      if (!buf.empty()) tf.read(0, buf.size(), buf.data());
      all.insert(all.end(), buf.begin(), buf.end());
    }
    return all;
  }
  fs::path dir_;
};

std::vector<uint32_t> join(const std::vector<std::string>& docs) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (i) out.push_back(kEot);
    for (unsigned char c : docs[i]) out.push_back(c);
  }
  return out;
}

TEST(JsonField, DecodesEscapesAndSkipsOtherValues) {
  EXPECT_EQ(json_string_field(R"({"id": 3, "meta": {"a": [1, {"b": null}], "t": "x"}, "text": "a\"b\\c\n\u00e9\ud83d\ude00"})",
                              "text", "f:1"),
            "a\"b\\c\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(json_string_field(R"({"text":""})", "text", "f:1"), "");
  EXPECT_EQ(json_string_field(R"(  {"x": true, "text": "t", "y": -1.5e3}  )", "text", "f:1"), "t");
  EXPECT_EQ(json_string_field("{\"text\": \"crlf\"}\r", "text", "f:1"), "crlf");  // a CRLF file's line
  EXPECT_EQ(json_string_field(R"({"text": "\u0041\u00e9\u4e2d\uD83D\uDE00/\/"})", "text", "f:1"),
            "A\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80//");
}

TEST(JsonField, ErrorsNameTheLine) {
  EXPECT_DEATH(json_string_field(R"({"body": "x"})", "text", "a.jsonl:7"), "a.jsonl:7: no string field 'text'");
  EXPECT_DEATH(json_string_field(R"({"text": 5})", "text", "a.jsonl:2"), "a.jsonl:2: .*not a string");
  EXPECT_DEATH(json_string_field(R"({"text": "x"} trailing)", "text", "a.jsonl:3"), "a.jsonl:3: .*trailing");
  EXPECT_DEATH(json_string_field(R"({"text": "x)", "text", "a.jsonl:4"), "a.jsonl:4: .*unterminated string");
  EXPECT_DEATH(json_string_field("[1, 2]", "text", "a.jsonl:5"), "a.jsonl:5: .*expected an object");
  EXPECT_DEATH(json_string_field(R"("text")", "text", "a.jsonl:6"), "a.jsonl:6: .*expected an object");
}

// Lines go through the project's one JSON parser (core/json.hpp), which is strict: a lone UTF-16
// surrogate (it has no UTF-8 encoding) and a duplicate key (which value was meant?) are rejected.
TEST(JsonField, StrictParserRejectsWhatHasNoSingleMeaning) {
  EXPECT_DEATH(json_string_field(R"({"text": "a\ud800"})", "text", "a.jsonl:8"), "a.jsonl:8: .*unpaired surrogate");
  EXPECT_DEATH(json_string_field(R"({"text": "a\ud800b"})", "text", "a.jsonl:9"), "a.jsonl:9: .*unpaired surrogate");
  EXPECT_DEATH(json_string_field(R"({"text": "a\ud800\u0041"})", "text", "a.jsonl:10"),
               "a.jsonl:10: .*unpaired surrogate");
  EXPECT_DEATH(json_string_field(R"({"text": "\udc00"})", "text", "a.jsonl:11"), "a.jsonl:11: .*unpaired surrogate");
  EXPECT_DEATH(json_string_field(R"({"text": "a", "text": "b"})", "text", "a.jsonl:12"),
               "a.jsonl:12: .*duplicate key \"text\"");
  EXPECT_DEATH(json_string_field(R"({"text": "a", "n": 01})", "text", "a.jsonl:13"), "a.jsonl:13: .*invalid JSON");
  EXPECT_DEATH(json_string_field("{\"text\": \"tab\tin\"}", "text", "a.jsonl:14"), "a.jsonl:14: .*control character");
  std::string wide = "{";  // many keys: the parser looks for duplicates through a hash set
  for (int i = 0; i < 40; ++i) wide += "\"k" + std::to_string(i) + "\": " + std::to_string(i) + ", ";
  EXPECT_EQ(json_string_field(wide + "\"text\": \"w\"}", "text", "f:1"), "w");
  EXPECT_DEATH(json_string_field(wide + "\"k7\": 0, \"text\": \"w\"}", "text", "a.jsonl:15"),
               "a.jsonl:15: .*duplicate key \"k7\"");
}

TEST_F(Prepare, SeveralFilesAreTheirConcatenationWithEots) {
  const std::vector<std::string> docs = {"first doc", "second", "third one!"};
  write("a.txt", docs[0]);
  write("b.txt", docs[1]);
  fs::create_directories(dir_ / "in" / "sub");
  write("sub/c.txt", docs[2]);  // directories are searched recursively, in sorted order
  PrepareOptions o = options("out");
  o.val_fraction = 0.0;
  const PrepareResult r = prepare_dataset(o);
  EXPECT_EQ(r.documents, 3u);
  ASSERT_EQ(r.train_files.size(), 1u);
  EXPECT_TRUE(r.val_files.empty());
  EXPECT_EQ(read_all(r.train_files), join(docs));
  TokenFile tf(r.train_files[0]);
  EXPECT_EQ(tf.vocab_size(), 300);
  EXPECT_EQ(tf.eot_token(), kEot);
  EXPECT_EQ(tf.tokenizer(), "test");
}

TEST_F(Prepare, ValidationTakesAnEvenFractionOfDocuments) {
  std::vector<std::string> docs;
  for (int i = 0; i < 10; ++i) {
    docs.push_back("document number " + std::to_string(i));
    write("d" + std::to_string(i) + ".txt", docs.back());  // d0..d9 sort in document order
  }
  PrepareOptions o = options("out");
  o.val_fraction = 0.3;
  const PrepareResult r = prepare_dataset(o);
  std::vector<std::string> train, val;
  for (int i = 0; i < 10; ++i) (((i + 1) * 3 / 10 > i * 3 / 10) ? val : train).push_back(docs[i]);
  EXPECT_EQ(val.size(), 3u);
  EXPECT_EQ(read_all(r.train_files), join(train));
  EXPECT_EQ(read_all(r.val_files), join(val));
}

TEST_F(Prepare, SingleDocumentIsSplitByTokens) {
  const std::string text(1000, 'x');
  write("only.txt", text);
  PrepareOptions o = options("out");
  o.val_fraction = 0.1;
  const PrepareResult r = prepare_dataset(o);
  EXPECT_EQ(r.train_tokens, 900u);
  EXPECT_EQ(r.val_tokens, 100u);
}

TEST_F(Prepare, ShardsAndThreadsDoNotChangeTheTokens) {
  std::vector<std::string> docs;
  for (int i = 0; i < 30; ++i) {
    docs.push_back(std::string(static_cast<size_t>(17 + i * 7), static_cast<char>('a' + i % 26)));
    char name[32];
    std::snprintf(name, sizeof(name), "f%02d.txt", i);
    write(name, docs.back());
  }
  PrepareOptions one = options("one");
  one.val_fraction = 0.0;
  one.threads = 1;
  const PrepareResult a = prepare_dataset(one);
  PrepareOptions sharded = options("sharded");
  sharded.val_fraction = 0.0;
  sharded.threads = 3;
  sharded.shard_tokens = 100;
  const PrepareResult b = prepare_dataset(sharded);
  EXPECT_EQ(read_all(a.train_files), join(docs));
  EXPECT_EQ(read_all(b.train_files), read_all(a.train_files));
  ASSERT_GT(b.train_files.size(), 5u);
  for (size_t i = 0; i + 1 < b.train_files.size(); ++i) EXPECT_EQ(TokenFile(b.train_files[i]).size(), 100u);
  EXPECT_EQ(fs::path(b.train_files[0]).filename(), "train_000000.h5");
}

TEST_F(Prepare, JsonLinesOneDocumentPerLine) {
  write("a.jsonl", "{\"text\": \"alpha\", \"id\": 1}\n\n{\"id\": 2, \"text\": \"beta\\ngamma\"}\n");
  write("b.jsonl", "{\"text\": \"delta\"}");  // no final newline
  PrepareOptions o = options("out");
  o.jsonl_field = "text";
  o.val_fraction = 0.0;
  const PrepareResult r = prepare_dataset(o);
  EXPECT_EQ(r.documents, 3u);
  EXPECT_EQ(read_all(r.train_files), join({"alpha", "beta\ngamma", "delta"}));
}

TEST_F(Prepare, BadInputsAreClearErrors) {
  write("bad.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"no\"}\n");
  PrepareOptions o = options("out");
  o.jsonl_field = "text";
  EXPECT_DEATH(prepare_dataset(o), "bad.jsonl:2: no string field 'text'");
  PrepareOptions missing = options("out2");
  missing.inputs = {(dir_ / "nope.txt").string()};
  EXPECT_DEATH(prepare_dataset(missing), "cannot read text file .*nope.txt");
  fs::remove_all(dir_ / "in");
  fs::create_directories(dir_ / "in");
  write("empty.txt", "");
  EXPECT_DEATH(prepare_dataset(options("out3")), "empty");
}

}  // namespace
}  // namespace gpt2
