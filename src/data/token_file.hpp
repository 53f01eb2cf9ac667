// Token files (DESIGN.md section 5): HDF5, dataset /tokens (1-D uint16 or uint32, chunked), root
// attributes vocab_size, tokenizer, eot_token (optional), format_version = 1; optional /doc_offsets.
// gpt2-data writes /tokens with attribute crc32 (zlib's CRC-32 of the tokens as stored, little-endian),
// which `gpt2-data inspect` verifies, and training with --verify-data (each rank a share of the tokens);
// otherwise training reads windows at random and checks only each token id.
// A dataset is one file or a glob of shard files.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/hdf5.hpp"

namespace gpt2 {

// This HDF5 build may not be thread-safe: every HDF5 call made while the prefetch thread runs holds this.
std::mutex& hdf5_mutex();

struct TokenFileWriteOptions {
  int vocab_size = 256;
  std::string tokenizer = "byte";
  int eot_token = -1;                 // written when >= 0
  std::vector<uint64_t> doc_offsets;  // written when not empty
};

// Writes tokens to `path` (uint16 when vocab_size <= 65536, else uint32), atomically (temp + rename).
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, const TokenFileWriteOptions& opt);

class TokenFile {
 public:
  // Validates the format, with clear errors. chunk_cache_bytes: HDF5's chunk cache for /tokens.
  explicit TokenFile(const std::string& path, size_t chunk_cache_bytes = kDefaultChunkCacheBytes);
  // A 64 MiB chunk cache instead of HDF5's 1 MiB default: random windows keep revisiting chunks.
  static constexpr size_t kDefaultChunkCacheBytes = size_t{64} << 20;
  const std::string& path() const { return path_; }
  uint64_t size() const { return num_tokens_; }
  int vocab_size() const { return vocab_size_; }
  const std::string& tokenizer() const { return tokenizer_; }
  int eot_token() const { return eot_token_; }
  int dtype_bits() const { return dtype_bits_; }
  // Documents that start in this file (entries of /doc_offsets), or -1 when the file has none.
  int64_t num_documents() const { return num_documents_; }
  // Bytes of HDF5 chunk cache /tokens has (as HDF5 reports it).
  size_t chunk_cache_bytes() const;
  // Reads tokens [offset, offset + n) and checks each is < vocab_size (caller holds hdf5_mutex()).
  void read(uint64_t offset, size_t n, int32_t* out);
  // Reads every token (each checked as read() does) and compares /tokens' crc32 attribute with them:
  // false when the file has none (written by another tool), true when it matches; a mismatch ends the
  // job naming the file. Caller holds hdf5_mutex().
  bool verify_crc32();
  // The pieces of that check, for a check split over ranks (train/verify_data.hpp); callers hold
  // hdf5_mutex(). Whether /tokens has the attribute crc32 at all:
  bool has_crc32() const;
  // zlib's CRC-32 of tokens [offset, offset + n) as stored (each checked as read() does), continuing `crc`.
  uint32_t crc32_of_tokens(uint64_t offset, uint64_t n, uint32_t crc = 0);
  // Ends the job naming the file when `crc`, the CRC-32 of all its tokens, is not its attribute crc32.
  void require_crc32(uint32_t crc) const;

 private:
  std::string path_;
  h5::Id file_, dataset_;
  uint64_t num_tokens_ = 0;
  int vocab_size_ = 0;
  std::string tokenizer_;
  int eot_token_ = -1;
  int dtype_bits_ = 16;
  int64_t num_documents_ = -1;
  // Unfiltered chunked /tokens: tokens per chunk, so read() can check each chunk's stored size
  // (0 for other layouts and for filtered, e.g. compressed, chunks, whose stored size varies).
  uint64_t checked_chunk_tokens_ = 0;
  // The chunks whose stored size was checked (once is enough). A set, not a bitmap sized from the
  // header: a corrupt file may claim 2^40 tokens (the fuzzer's finding); only chunks read are kept.
  std::unordered_set<uint64_t> chunk_checked_;
  // Reused by every read(): the file dataspace, a memory dataspace of the last read's length, and the
  // uint16 tokens as stored (read without HDF5's type conversion, then widened here).
  h5::Id fspace_, mspace_;
  hsize_t mspace_n_ = 0;
  std::vector<uint16_t> narrow_;
};

// Expands a path or glob ("data/train_*.h5") into a sorted list of files; error if nothing matches.
std::vector<std::string> expand_data_glob(const std::string& pattern);

// Windows of seq_len + 1 tokens (inputs and shifted targets) over one or more shards. Window w of a
// shard starts at w * seq_len; windows never cross a shard boundary.
class TokenDataset {
 public:
  // The chunk caches of all of a dataset's shards together hold at most this much: each of N shards
  // gets kChunkCacheBudgetBytes / N (a shard whose chunk is larger than its share reads around the
  // cache, straight from the file). So a rank caches at most 2 x 256 MiB (train and val) however many
  // shards there are; 64 MiB per shard would be 64 GiB per rank at 1000 shards.
  static constexpr size_t kChunkCacheBudgetBytes = size_t{256} << 20;

  TokenDataset(const std::string& pattern, int seq_len);
  uint64_t num_windows() const { return total_windows_; }
  uint64_t num_tokens() const { return total_tokens_; }
  int vocab_size() const { return vocab_size_; }
  const std::string& tokenizer() const { return tokenizer_; }
  int seq_len() const { return seq_len_; }
  size_t num_files() const { return files_.size(); }
  TokenFile& file(size_t i) { return *files_[i]; }
  const std::string& pattern() const { return pattern_; }
  // The chunk caches of all shards together (<= kChunkCacheBudgetBytes).
  size_t chunk_cache_bytes() const;
  // One line per file: path, token count, dtype and attributes. Ranks compare it to check that they
  // all read the same data (a node with other files would train on other windows without error).
  std::string describe_files() const;
  // Reads window w (seq_len + 1 tokens) into out. Thread-safe (takes hdf5_mutex()).
  void read_window(uint64_t w, int32_t* out);

 private:
  std::string pattern_;
  int seq_len_;
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<uint64_t> first_window_;  // prefix sums of windows per file
  uint64_t total_windows_ = 0;
  uint64_t total_tokens_ = 0;
  int vocab_size_ = 0;
  std::string tokenizer_;
};

}  // namespace gpt2
