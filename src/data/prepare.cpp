#include "data/prepare.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.hpp"
#include "data/token_file.hpp"

namespace gpt2 {

namespace fs = std::filesystem;

// ---- JSON lines ----------------------------------------------------------------------------------
namespace {

class JsonCursor {
 public:
  JsonCursor(std::string_view s, const std::string& where) : s_(s), where_(where) {}
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c, const char* what) {
    if (!eat(c)) fail(std::string("expected ") + what);
  }
  bool at_end() {
    ws();
    return i_ == s_.size();
  }
  char peek() {
    ws();
    return i_ < s_.size() ? s_[i_] : '\0';
  }
  [[noreturn]] void fail(const std::string& what) const {
    fatal(msg() << where_ << ": not a valid JSON line: " << what << " at column " << i_ + 1);
  }

  std::string string() {
    expect('"', "a string");
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 1 < s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            const size_t save = i_;
            i_ += 2;
            const uint32_t lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else i_ = save;  // a lone high surrogate: kept as is (below)
          }
          append_utf8(cp, &out);
          break;
        }
        default: fail(std::string("unknown escape \\") + e);
      }
    }
  }

  // Skips any JSON value (the fields we do not want).
  void skip_value(int depth = 0) {
    if (depth > 256) fail("nesting too deep");
    const char c = peek();
    if (c == '"') {
      string();
    } else if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i_;
      if (eat(close)) return;
      do {
        if (c == '{') {
          string();
          expect(':', "':'");
        }
        skip_value(depth + 1);
      } while (eat(','));
      expect(close, c == '{' ? "'}'" : "']'");
    } else {
      const size_t start = i_;
      while (i_ < s_.size() && std::string_view(",}] \t\r\n").find(s_[i_]) == std::string_view::npos) ++i_;
      const std::string_view tok = s_.substr(start, i_ - start);
      if (tok.empty()) fail("expected a value");
      if (tok != "true" && tok != "false" && tok != "null" &&
          tok.find_first_not_of("0123456789+-.eE") != std::string_view::npos)
        fail("bad literal '" + std::string(tok) + "'");
    }
  }

 private:
  uint32_t hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else fail("bad \\u escape");
    }
    return v;
  }
  static void append_utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  std::string_view s_;
  const std::string& where_;
  size_t i_ = 0;
};

}  // namespace

std::string json_string_field(std::string_view line, const std::string& field, const std::string& where) {
  JsonCursor c(line, where);
  c.expect('{', "an object '{'");
  std::string value;
  bool found = false;
  if (!c.eat('}')) {
    do {
      const std::string key = c.string();
      c.expect(':', "':'");
      if (key == field && !found) {
        if (c.peek() != '"') c.fail("field '" + field + "' is not a string");
        value = c.string();
        found = true;
      } else {
        c.skip_value();
      }
    } while (c.eat(','));
    c.expect('}', "'}'");
  }
  if (!c.at_end()) c.fail("trailing characters after the object");
  if (!found) fatal(msg() << where << ": no string field '" << field << "' (choose it with --jsonl-field)");
  return value;
}

// ---- inputs and documents ------------------------------------------------------------------------
namespace {

struct InputFile {
  std::string path;
  uint64_t bytes = 0;
};

std::vector<InputFile> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<InputFile> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    GPT2_REQUIRE(!ec && fs::exists(st), "cannot read text file " << in << ": not found");
    if (fs::is_directory(st)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!name.empty() && name[0] == '.') {  // hidden files and folders are not data
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file()) found.push_back(it->path().string());
      }
      GPT2_REQUIRE(!ec, "cannot list directory " << in << ": " << ec.message());
      std::sort(found.begin(), found.end());
      for (const std::string& f : found) files.push_back({f, static_cast<uint64_t>(fs::file_size(f))});
    } else {
      files.push_back({in, static_cast<uint64_t>(fs::file_size(in, ec))});
      GPT2_REQUIRE(!ec, "cannot read " << in << ": " << ec.message());
    }
  }
  GPT2_REQUIRE(!files.empty(), "no input files (the directories given are empty)");
  return files;
}

// Streams documents in input order, in batches of about `batch_bytes` of text.
class DocumentReader {
 public:
  DocumentReader(std::vector<InputFile> files, std::string jsonl_field)
      : files_(std::move(files)), field_(std::move(jsonl_field)) {}

  // Appends documents to `docs` until about batch_bytes were read; false when the inputs are exhausted.
  bool next_batch(std::vector<std::string>* docs, uint64_t batch_bytes) {
    uint64_t got = 0;
    while (got < batch_bytes && file_ < files_.size()) {
      const InputFile& f = files_[file_];
      if (field_.empty()) {  // a text file is one document
        std::ifstream is(f.path, std::ios::binary);
        GPT2_REQUIRE(is.good(), "cannot read text file " << f.path);
        std::ostringstream os;
        os << is.rdbuf();
        docs->push_back(os.str());
        got += f.bytes;
        bytes_done_ += f.bytes;
        ++file_;
        continue;
      }
      if (!line_in_.is_open()) {
        line_in_.open(f.path, std::ios::binary);
        GPT2_REQUIRE(line_in_.good(), "cannot read JSON-lines file " << f.path);
        line_no_ = 0;
      }
      std::string line;
      if (std::getline(line_in_, line)) {
        ++line_no_;
        got += line.size() + 1;
        bytes_done_ += line.size() + 1;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are allowed
        docs->push_back(json_string_field(line, field_, f.path + ":" + std::to_string(line_no_)));
      } else {
        line_in_.close();
        ++file_;
      }
    }
    return !docs->empty() || file_ < files_.size();
  }
  uint64_t bytes_done() const { return bytes_done_; }

 private:
  std::vector<InputFile> files_;
  std::string field_;
  size_t file_ = 0;
  std::ifstream line_in_;
  uint64_t line_no_ = 0;
  uint64_t bytes_done_ = 0;
};

// Appends documents (EOT-separated) to token files of at most shard_tokens tokens each.
class ShardWriter {
 public:
  ShardWriter(const PrepareOptions& opt, std::string prefix) : opt_(opt), prefix_(std::move(prefix)) {}

  void add_document(const std::vector<uint32_t>& tokens) {
    if (documents_ > 0 && opt_.eot_token >= 0) push(static_cast<uint32_t>(opt_.eot_token));
    ++documents_;
    pending_doc_start_ = true;
    for (uint32_t t : tokens) push(t);
    pending_doc_start_ = false;
  }
  void finish() {
    if (!buf_.empty()) flush();
  }
  const std::vector<std::string>& files() const { return files_; }
  uint64_t tokens() const { return total_; }

 private:
  void push(uint32_t t) {
    if (pending_doc_start_) {  // the document's first token: record where it starts in this file
      doc_offsets_.push_back(buf_.size());
      pending_doc_start_ = false;
    }
    buf_.push_back(t);
    ++total_;
    if (opt_.shard_tokens > 0 && buf_.size() == opt_.shard_tokens) flush();
  }
  void flush() {
    char name[64];
    if (opt_.shard_tokens > 0) std::snprintf(name, sizeof(name), "%s_%06zu.h5", prefix_.c_str(), files_.size());
    else std::snprintf(name, sizeof(name), "%s.h5", prefix_.c_str());
    TokenFileWriteOptions wo;
    wo.vocab_size = opt_.vocab_size;
    wo.tokenizer = opt_.tokenizer;
    wo.eot_token = opt_.eot_token;
    wo.doc_offsets = doc_offsets_;
    const std::string path = opt_.out_dir + "/" + name;
    write_token_file(path, buf_, wo);
    files_.push_back(path);
    buf_.clear();
    doc_offsets_.clear();
  }

  const PrepareOptions& opt_;
  std::string prefix_;
  std::vector<uint32_t> buf_;
  std::vector<uint64_t> doc_offsets_;
  std::vector<std::string> files_;
  uint64_t documents_ = 0, total_ = 0;
  bool pending_doc_start_ = false;
};

class Progress {
 public:
  Progress(bool on, uint64_t total) : on_(on), tty_(isatty(2) != 0), total_(std::max<uint64_t>(total, 1)) {}
  void update(uint64_t done, bool final = false) {
    if (!on_) return;
    const double s = seconds();
    const double frac = std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
    if (!tty_ && !final && frac < next_frac_ && s < next_s_) return;  // plain lines: every 10% or 30 s
    next_frac_ = frac + 0.1;
    next_s_ = s + 30;
    const double mbs = s > 0 ? static_cast<double>(done) / 1e6 / s : 0.0;
    const double eta = (mbs > 0 && frac < 1) ? static_cast<double>(total_ - done) / 1e6 / mbs : 0.0;
    char bar[32];
    const int filled = static_cast<int>(frac * 30);
    for (int i = 0; i < 30; ++i) bar[i] = i < filled ? '#' : '.';
    bar[30] = '\0';
    std::fprintf(stderr, "%s[%s] %5.1f%% %.1f / %.1f MB | %.1f MB/s | ETA %.0fs%s", tty_ ? "\r" : "", bar,
                 100 * frac, static_cast<double>(done) / 1e6, static_cast<double>(total_) / 1e6, mbs, eta,
                 tty_ && !final ? "" : "\n");
    std::fflush(stderr);
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  bool on_, tty_;
  uint64_t total_;
  double next_frac_ = 0, next_s_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& opt) {
  GPT2_REQUIRE(opt.encode, "prepare_dataset: no tokenizer");
  GPT2_REQUIRE(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0, "--val-fraction must be in [0, 1)");
  std::vector<InputFile> files = expand_inputs(opt.inputs);
  uint64_t total_bytes = 0;
  for (const InputFile& f : files) total_bytes += f.bytes;
  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  GPT2_REQUIRE(!ec, "cannot create output directory " << opt.out_dir << ": " << ec.message());

  const int threads = opt.threads > 0 ? opt.threads : std::max(1u, std::thread::hardware_concurrency());
  DocumentReader reader(std::move(files), opt.jsonl_field);
  ShardWriter train(opt, "train"), val(opt, "val");
  Progress progress(opt.progress, total_bytes);
  PrepareResult r;
  r.bytes = total_bytes;
  const double f = opt.val_fraction;
  auto is_val = [f](uint64_t i) {
    return std::floor(static_cast<double>(i + 1) * f) > std::floor(static_cast<double>(i) * f);
  };
  // Document 0 always goes to train (floor(f) = 0); it is held back until a second document shows
  // whether the corpus is a single document, which is split by tokens instead.
  std::vector<uint32_t> first_doc;
  std::vector<std::string> docs;
  std::vector<std::vector<uint32_t>> encoded;
  // Batches of 64 MiB of text per thread pass keep memory bounded and every thread busy.
  const uint64_t batch_bytes = 64ull << 20;
  while (true) {
    docs.clear();
    if (!reader.next_batch(&docs, batch_bytes) && docs.empty()) break;
    encoded.assign(docs.size(), {});
    // Each document is encoded by one thread into its own slot: the output order (and so every bit of
    // the files) does not depend on the thread count.
    std::atomic<size_t> next{0};
    auto work = [&]() {
      for (size_t i = next++; i < docs.size(); i = next++) encoded[i] = opt.encode(docs[i]);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < std::min<int>(threads, static_cast<int>(docs.size())); ++t) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    for (size_t i = 0; i < encoded.size(); ++i) {
      const uint64_t doc = r.documents++;
      if (doc == 0) {
        first_doc = std::move(encoded[i]);
        continue;
      }
      if (doc == 1) {
        train.add_document(first_doc);
        first_doc = {};
      }
      (is_val(doc) ? val : train).add_document(encoded[i]);
    }
    progress.update(reader.bytes_done());
  }
  GPT2_REQUIRE(r.documents > 0, "the inputs hold no documents");
  if (r.documents == 1) {  // a single document: its last f of tokens is the validation split
    const size_t n_val = static_cast<size_t>(static_cast<double>(first_doc.size()) * f);
    train.add_document(std::vector<uint32_t>(first_doc.begin(), first_doc.end() - static_cast<long>(n_val)));
    if (n_val > 0) val.add_document(std::vector<uint32_t>(first_doc.end() - static_cast<long>(n_val), first_doc.end()));
  }
  train.finish();
  val.finish();
  progress.update(total_bytes, /*final=*/true);
  GPT2_REQUIRE(train.tokens() >= 2, "the input text is empty: nothing to train on");
  r.train_tokens = train.tokens();
  r.val_tokens = val.tokens();
  r.train_files = train.files();
  r.val_files = val.files();
  r.seconds = progress.seconds();
  return r;
}

}  // namespace gpt2
