// GPT-2's byte-level BPE tokenizer (the 50257-token vocabulary of encoder.json + vocab.bpe).
//
// encode(text):
//   1. pre-tokenization: text is cut into pieces by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      with the semantics of a JavaScript /u regular expression (\s is JavaScript's whitespace), as the
//      reference encoder (npm gpt-3-encoder) runs it. Implemented by hand on UTF-8, with the Unicode
//      classes of unicode_tables.cpp. A byte that is not part of a valid UTF-8 sequence counts as one
//      character of class "other" (GPT-2 works on bytes), so any byte string encodes and
//      decode(encode(x)) == x for every x.
//   2. each piece's bytes become byte tokens, merged by the ranks of vocab.bpe (lowest rank first,
//      leftmost first among equal ranks), exactly as GPT-2's encoder.py does.
// "<|endoftext|>" in the text is NOT special: it encodes as ordinary characters. Callers put kEot
// between documents themselves.
//
// Thread safety: a loaded tokenizer is immutable; encode() and decode() may run concurrently from any
// number of threads. The piece -> ids cache is per thread (and per tokenizer), bounded in size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2 {

class Gpt2Tokenizer {
 public:
  static constexpr uint32_t kEot = 50256;        // "<|endoftext|>"
  static constexpr uint32_t kVocabSize = 50257;  // GPT-2's vocabulary (encoder.json entries)
  static constexpr size_t kDefaultCacheEntries = 1 << 15;

  // Loads GPT-2's vocabulary. Ends the job with a message naming the file for a missing, unreadable or
  // corrupt file, or for one that is not GPT-2's vocabulary (tools/get-gpt2-vocab.sh fetches both).
  // cache_entries bounds each thread's piece cache (0 disables it; results never depend on it).
  Gpt2Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path,
                size_t cache_entries = kDefaultCacheEntries);
  // The same from a directory holding encoder.json and vocab.bpe.
  static Gpt2Tokenizer from_dir(const std::string& dir, size_t cache_entries = kDefaultCacheEntries);
  // Where tools/get-gpt2-vocab.sh puts the two files: ${XDG_CACHE_HOME:-$HOME/.cache}/gpt2-mpi/gpt2-vocab.
  static std::string default_vocab_dir();

  // Token ids of any byte string (UTF-8 expected; invalid bytes are encoded as bytes).
  std::vector<uint32_t> encode(std::string_view utf8) const;
  // Appends the ids of utf8 to out (for callers that build one long token stream).
  void encode_append(std::string_view utf8, std::vector<uint32_t>& out) const;

  // The bytes of a token sequence. Every id must be < vocab_size() (else the job ends with a message).
  std::string decode(const uint32_t* ids, size_t n) const;
  std::string decode(const std::vector<uint32_t>& ids) const { return decode(ids.data(), ids.size()); }
  // The bytes of one token (kEot: "<|endoftext|>").
  std::string_view token_bytes(uint32_t id) const;

  uint32_t vocab_size() const { return static_cast<uint32_t>(token_offsets_.size() - 1); }

  // The pre-tokenization pieces of text (step 1 above), as views into text. For tests and tools.
  static std::vector<std::string_view> split(std::string_view text);

 private:
  // A merge (a, b) -> merged with its rank, in an open-addressing table keyed by (a << 16 | b). The
  // value packs rank << 16 | merged, so comparing values compares ranks (the vocabulary fits 16 bits).
  static constexpr uint32_t kNoMerge = 0xFFFFFFFFu;
  uint32_t merge_of(uint32_t a, uint32_t b) const;
  void add_merge(uint32_t a, uint32_t b, uint32_t rank, uint32_t merged);
  void bpe(const uint8_t* bytes, size_t n, std::vector<uint32_t>& out) const;
  void bpe_small(const uint8_t* bytes, size_t n, std::vector<uint32_t>& out) const;
  void bpe_large(const uint8_t* bytes, size_t n, std::vector<uint32_t>& out) const;

  uint32_t byte_token_[256] = {};        // byte -> its single-byte token
  std::string token_bytes_;              // all tokens' bytes, concatenated in id order
  std::vector<uint32_t> token_offsets_;  // token id -> offset in token_bytes_ (vocab_size + 1 entries)
  std::vector<uint64_t> merge_table_;    // (key << 32 | value) slots, key 0xFFFFFFFF = empty
  uint64_t merge_mask_ = 0;
  size_t cache_entries_ = kDefaultCacheEntries;
  uint64_t instance_id_ = 0;  // keys the per-thread caches, so two tokenizers never share one
};

}  // namespace gpt2
