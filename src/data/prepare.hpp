// Dataset preparation at scale (gpt2-data prepare): many text or JSON-lines inputs -> documents ->
// tokens (in parallel, deterministic whatever the thread count) -> train/val token files, optionally
// sharded. Memory stays bounded: documents stream through in batches and shards are written as they fill.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2 {

// Text -> token ids; must be safe to call from several threads at once.
using EncodeFn = std::function<std::vector<uint32_t>(std::string_view)>;

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or directories (searched recursively, in sorted order)
  std::string out_dir;
  EncodeFn encode;
  std::string tokenizer = "byte";  // the name written into the files
  int vocab_size = 256;
  int eot_token = -1;              // >= 0: written between documents (and as the file attribute)
  std::string jsonl_field;         // non-empty: inputs are JSON lines, one document per line, this string field
  double val_fraction = 0.1;       // fraction of the documents that go to validation (see prepare_dataset)
  uint64_t shard_tokens = 0;       // 0: one train.h5 and one val.h5; else train_000000.h5, ... of this many tokens
  int threads = 0;                 // 0: hardware threads
  bool progress = true;            // progress on stderr: a redrawn bar on a terminal, plain lines otherwise
};

struct PrepareResult {
  uint64_t documents = 0, train_tokens = 0, val_tokens = 0, bytes = 0;
  std::vector<std::string> train_files, val_files;
  double seconds = 0;
};

// Documents are the text files (one each) or the JSON lines' fields, in input order. Document i goes to
// validation when floor((i+1) f) > floor(i f), f = val_fraction: an exact fraction, spread evenly through
// the corpus. A corpus of a single document is instead split by tokens (the last f of them is val).
// Within each split, eot_token (when >= 0) separates consecutive documents; /doc_offsets records where
// each document starts in each file. Files are written atomically.
PrepareResult prepare_dataset(const PrepareOptions& opt);

// The string value of `field` in a one-line JSON object (escapes decoded to UTF-8). Errors name `where`
// ("file.jsonl:12"). Exposed for tests.
std::string json_string_field(std::string_view line, const std::string& field, const std::string& where);

}  // namespace gpt2
