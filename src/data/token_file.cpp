#include "data/token_file.hpp"

#include <glob.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace gpt2 {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, const TokenFileWriteOptions& opt) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  const std::string tmp = path + ".tmp";
  {
    h5::Id f = h5::create(tmp);
    const bool u16 = opt.vocab_size <= 65536;
    const hsize_t n = tokens.size();
    h5::Id space(H5Screate_simple(1, &n, nullptr));
    h5::Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
    if (n > 0) {
      const hsize_t chunk = std::min<hsize_t>(n, 1 << 20);
      H5_CHECK(H5Pset_chunk(dcpl.get(), 1, &chunk), "set chunking for /tokens");
    }
    h5::Id ds(H5Dcreate2(f.get(), "tokens", u16 ? H5T_STD_U16LE : H5T_STD_U32LE, space.get(), H5P_DEFAULT,
                         dcpl.get(), H5P_DEFAULT));
    H5_CHECK(ds.get(), "create /tokens in " << tmp);
    uint32_t crc = 0;  // of the tokens as stored (little-endian: the only byte order this builds for)
    if (n > 0) {
      if (u16) {
        std::vector<uint16_t> t16(tokens.begin(), tokens.end());
        H5_CHECK(H5Dwrite(ds.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, t16.data()),
                 "cannot write /tokens in " << tmp);
        crc = h5::crc32_of(t16.data(), t16.size() * sizeof(uint16_t));
      } else {
        H5_CHECK(H5Dwrite(ds.get(), H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data()),
                 "cannot write /tokens in " << tmp);
        crc = h5::crc32_of(tokens.data(), tokens.size() * sizeof(uint32_t));
      }
    }
    h5::write_attr_i64(ds.get(), "crc32", crc);
    if (!opt.doc_offsets.empty()) {
      const hsize_t nd = opt.doc_offsets.size();
      h5::Id dspace(H5Screate_simple(1, &nd, nullptr));
      h5::Id dd(H5Dcreate2(f.get(), "doc_offsets", H5T_STD_U64LE, dspace.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      H5_CHECK(H5Dwrite(dd.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, opt.doc_offsets.data()),
               "cannot write /doc_offsets in " << tmp);
    }
    h5::write_attr_i64(f.get(), "vocab_size", opt.vocab_size);
    h5::write_attr_str(f.get(), "tokenizer", opt.tokenizer);
    if (opt.eot_token >= 0) h5::write_attr_i64(f.get(), "eot_token", opt.eot_token);
    h5::write_attr_i64(f.get(), "format_version", 1);
    h5::close_written(f, tmp);  // a full disk shows up here: the error names the file and the reason
  }
  fsync_path_or_die(tmp);
  rename_durable(tmp, path);
}

TokenFile::TokenFile(const std::string& path, size_t chunk_cache_bytes) : path_(path) {
  file_ = h5::open_read(path);
  const hid_t f = file_.get();
  GPT2_REQUIRE(h5::has_object(f, "tokens"), path << " is not a token file: it has no /tokens dataset");
  h5::Id dapl(H5Pcreate(H5P_DATASET_ACCESS));
  H5Pset_chunk_cache(dapl.get(), 521, chunk_cache_bytes, 0.75);
  dataset_ = h5::open_dataset(f, "tokens", path, dapl.get());  // "/tokens is a group, not a dataset"
  h5::Id space(H5Dget_space(dataset_.get()));
  const int ndims = H5Sget_simple_extent_ndims(space.get());
  GPT2_REQUIRE(ndims == 1, path << ": /tokens has " << ndims << " dimensions, must be 1-D");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  num_tokens_ = n;
  h5::Id type(H5Dget_type(dataset_.get()));
  GPT2_REQUIRE(H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_NONE &&
                   (H5Tget_size(type.get()) == 2 || H5Tget_size(type.get()) == 4),
               "/tokens in " << path << " must be uint16 or uint32");
  dtype_bits_ = static_cast<int>(H5Tget_size(type.get()) * 8);
  h5::Id dcpl(H5Dget_create_plist(dataset_.get()));
  hsize_t chunk = 0;
  if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED && H5Pget_nfilters(dcpl.get()) == 0 &&
      H5Pget_chunk(dcpl.get(), 1, &chunk) == 1 && chunk > 0)
    checked_chunk_tokens_ = chunk;
  fspace_ = h5::Id(H5Dget_space(dataset_.get()));
  GPT2_REQUIRE(h5::has_attr(f, "vocab_size"), path << " has no vocab_size attribute (not a token file?)");
  const int64_t v = h5::read_attr_i64(f, "vocab_size", path);
  GPT2_REQUIRE(v > 0 && v <= INT32_MAX, "vocab_size " << v << " in " << path << " is invalid");
  vocab_size_ = static_cast<int>(v);
  tokenizer_ = h5::has_attr(f, "tokenizer") ? h5::read_attr_str(f, "tokenizer", path) : "unknown";
  if (h5::has_attr(f, "eot_token")) eot_token_ = static_cast<int>(h5::read_attr_i64(f, "eot_token", path));
  if (h5::has_object(f, "doc_offsets")) {
    h5::Id dd = h5::open_dataset(f, "doc_offsets", path);
    h5::Id ds(H5Dget_space(dd.get()));
    hsize_t nd = 0;
    GPT2_REQUIRE(H5Sget_simple_extent_ndims(ds.get()) == 1, path << ": /doc_offsets must be 1-D");
    H5Sget_simple_extent_dims(ds.get(), &nd, nullptr);
    num_documents_ = static_cast<int64_t>(nd);
  }
  if (h5::has_attr(f, "format_version")) {
    const int64_t fv = h5::read_attr_i64(f, "format_version", path);
    GPT2_REQUIRE(fv == 1, path << " has format_version " << fv << "; this build reads version 1");
  }
}

size_t TokenFile::chunk_cache_bytes() const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::Id dapl(H5Dget_access_plist(dataset_.get()));
  size_t slots = 0, bytes = 0;
  double w0 = 0;
  H5_CHECK(H5Pget_chunk_cache(dapl.get(), &slots, &bytes, &w0), "read the chunk cache size of " << path_);
  return bytes;
}

void TokenFile::read(uint64_t offset, size_t n, int32_t* out) {
  h5::quiet_errors();  // per thread: the prefetch thread would otherwise print HDF5's raw error stack
  GPT2_CHECK(offset + n <= num_tokens_, "read past the end of " << path_);
  const hsize_t start = offset, count = n;
  H5_CHECK(H5Sselect_hyperslab(fspace_.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr), "select tokens");
  // libhdf5 (1.10.8 at least) trusts the stored size of an unfiltered chunk and copies a whole
  // chunk's worth out of a shorter buffer: a corrupt size field is a heap overflow inside HDF5, found
  // by tests/fuzz/fuzz_token_file. Every chunk this read touches must hold exactly a chunk of tokens.
  if (checked_chunk_tokens_ > 0 && n > 0) {
    const hsize_t chunk_bytes = checked_chunk_tokens_ * static_cast<hsize_t>(dtype_bits_ / 8);
    for (hsize_t c = offset / checked_chunk_tokens_; c <= (offset + n - 1) / checked_chunk_tokens_; ++c) {
      if (chunk_checked_.count(c) != 0) continue;
      hsize_t coord = c * checked_chunk_tokens_, size = 0;
      unsigned filter_mask = 0;
      haddr_t addr = HADDR_UNDEF;
      GPT2_REQUIRE(H5Dget_chunk_info_by_coord(dataset_.get(), &coord, &filter_mask, &addr, &size) >= 0,
                   "cannot read the chunk index of /tokens in " << path_ << " (truncated or corrupt file?)");
      GPT2_REQUIRE(addr == HADDR_UNDEF || size == chunk_bytes,
                   "/tokens in " << path_ << " is corrupt: the chunk at token " << coord << " is stored in " << size
                                 << " bytes, not " << chunk_bytes);
      chunk_checked_.insert(c);
    }
  }
  if (mspace_n_ != count || !mspace_.valid()) {
    mspace_ = h5::Id(H5Screate_simple(1, &count, nullptr));
    mspace_n_ = count;
  }
  static_assert(sizeof(int32_t) == sizeof(uint32_t));
  // uint16 files are read as stored and widened below: HDF5's conversion path costs more per read
  // than the copy (bench_loader: the per-window overhead is what limits the loader).
  const bool narrow = dtype_bits_ == 16;
  if (narrow) narrow_.resize(n);
  GPT2_REQUIRE(H5Dread(dataset_.get(), narrow ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32, mspace_.get(), fspace_.get(),
                       H5P_DEFAULT, narrow ? static_cast<void*>(narrow_.data()) : static_cast<void*>(out)) >= 0,
               "cannot read tokens [" << offset << ", " << offset + n << ") of " << path_ << " (truncated or corrupt file?)");
  if (narrow)
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(narrow_[i]);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t t = static_cast<uint32_t>(out[i]);
    GPT2_REQUIRE(t < static_cast<uint32_t>(vocab_size_), "token id " << t << " at index " << offset + i << " of "
                                                                     << path_ << " is >= the file's vocab_size "
                                                                     << vocab_size_ << " (corrupt or mislabelled file)");
  }
}

bool TokenFile::has_crc32() const { return h5::has_attr(dataset_.get(), "crc32"); }

uint32_t TokenFile::crc32_of_tokens(uint64_t offset, uint64_t n, uint32_t crc) {
  constexpr size_t kPiece = size_t{1} << 20;  // tokens a read
  std::vector<int32_t> piece;
  std::vector<uint16_t> t16;
  uLong c = crc;
  for (uint64_t at = offset; at < offset + n; at += kPiece) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kPiece, offset + n - at));
    piece.resize(len);
    read(at, len, piece.data());  // each token < vocab_size, so it narrows back to its stored width exactly
    if (dtype_bits_ == 16) {
      t16.assign(piece.begin(), piece.end());
      c = ::crc32(c, reinterpret_cast<const Bytef*>(t16.data()), static_cast<uInt>(len * 2));
    } else {
      c = ::crc32(c, reinterpret_cast<const Bytef*>(piece.data()), static_cast<uInt>(len * 4));
    }
  }
  return static_cast<uint32_t>(c);
}

void TokenFile::require_crc32(uint32_t crc) const {
  const int64_t stored = h5::read_attr_i64(dataset_.get(), "crc32", path_);
  GPT2_REQUIRE(stored == static_cast<int64_t>(crc),
               path_ << ": /tokens fails its CRC-32 check (attribute crc32 is " << stored << ", the tokens give " << crc
                     << "): the file changed after it was written (a bad disk, copy or transfer); use another copy "
                        "or prepare it again");
}

bool TokenFile::verify_crc32() {
  if (!has_crc32()) return false;
  require_crc32(crc32_of_tokens(0, num_tokens_));
  return true;
}

std::vector<std::string> expand_data_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (out.empty()) {
    // No glob characters: report the missing file by name (open_read gives the precise message).
    if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
    fatal("no files match the data pattern '" + pattern + "'");
  }
  std::sort(out.begin(), out.end());
  return out;
}

TokenDataset::TokenDataset(const std::string& pattern, int seq_len) : pattern_(pattern), seq_len_(seq_len) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  const std::vector<std::string> paths = expand_data_glob(pattern);
  const size_t cache_per_file = std::min(TokenFile::kDefaultChunkCacheBytes, kChunkCacheBudgetBytes / paths.size());
  for (const std::string& path : paths) {
    auto f = std::make_unique<TokenFile>(path, cache_per_file);
    if (files_.empty()) {
      vocab_size_ = f->vocab_size();
      tokenizer_ = f->tokenizer();
    } else {
      GPT2_REQUIRE(f->vocab_size() == vocab_size_ && f->tokenizer() == tokenizer_,
                   "shard " << path << " (tokenizer " << f->tokenizer() << ", vocab_size " << f->vocab_size()
                            << ") does not match the first shard (tokenizer " << tokenizer_ << ", vocab_size "
                            << vocab_size_ << ")");
    }
    first_window_.push_back(total_windows_);
    const uint64_t n = f->size();
    total_windows_ += n > static_cast<uint64_t>(seq_len) ? (n - 1) / seq_len : 0;
    total_tokens_ += n;
    files_.push_back(std::move(f));
  }
}

std::string TokenDataset::describe_files() const {
  std::string out;
  for (const auto& f : files_) {
    out += f->path() + ": " + std::to_string(f->size()) + " tokens, uint" + std::to_string(f->dtype_bits()) +
           ", vocab_size " + std::to_string(f->vocab_size()) + ", tokenizer " + f->tokenizer() + ", eot_token " +
           std::to_string(f->eot_token()) + ", documents " + std::to_string(f->num_documents()) + "\n";
  }
  return out;
}

size_t TokenDataset::chunk_cache_bytes() const {
  size_t sum = 0;
  for (const auto& f : files_) sum += f->chunk_cache_bytes();
  return sum;
}

void TokenDataset::read_window(uint64_t w, int32_t* out) {
  GPT2_CHECK(w < total_windows_, "window " << w << " out of range");
  const size_t i = std::upper_bound(first_window_.begin(), first_window_.end(), w) - first_window_.begin() - 1;
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  files_[i]->read((w - first_window_[i]) * seq_len_, static_cast<size_t>(seq_len_) + 1, out);
}

}  // namespace gpt2
