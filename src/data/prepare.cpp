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
#include "core/json.hpp"
#include "data/token_file.hpp"

namespace gpt2 {

namespace fs = std::filesystem;

// ---- JSON lines ----------------------------------------------------------------------------------

std::string json_string_field(std::string_view line, const std::string& field, const std::string& where) {
  static const char* const kKind[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
  // parse_json is strict (see core/json.hpp); its errors read "WHERE: invalid JSON: ... at byte K".
  JsonValue root = parse_json(line, where);
  if (root.kind != JsonValue::Kind::kObject)
    fatal(msg() << where << ": expected an object, found " << kKind[static_cast<int>(root.kind)]);
  for (auto& kv : root.object) {
    if (kv.first != field) continue;
    if (kv.second.kind != JsonValue::Kind::kString)
      fatal(msg() << where << ": field '" << field << "' is not a string (it is "
                  << kKind[static_cast<int>(kv.second.kind)] << ")");
    return std::move(kv.second.text);
  }
  fatal(msg() << where << ": no string field '" << field << "' (choose it with --jsonl-field)");
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
    if (final && printed_done_) return;                                // 100% was the last line already
    printed_done_ = frac >= 1.0;
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
  bool printed_done_ = false;
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
