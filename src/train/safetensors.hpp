// A minimal, strict reader and writer of the safetensors format (Hugging Face's weight files):
//
//   [8 bytes]  N, little-endian uint64: length of the header
//   [N bytes]  JSON object, UTF-8: {"NAME": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [b, e]},
//              ..., "__metadata__": {"key": "string value"}}  (optional metadata; may end in spaces)
//   [rest]     the data section: each tensor's raw little-endian bytes, row-major, at [b, e) from its start
//
// Strict means what the reference implementation (the safetensors Rust crate) enforces: a known dtype,
// e - b == numel x dtype size, tensors that tile the data section exactly (no holes, no overlaps, nothing
// left over), no duplicate names. Every error names the file and, where it applies, the tensor.
// Reading converts F32, F16 and BF16 to fp32; writing writes F32. The host must be little-endian (x86,
// ARM), which the code checks once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/json.hpp"  // JsonValue, parse_json: the header parser (and part of this API for callers)

namespace gpt2 {

// ---- reading -------------------------------------------------------------------------------------
struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // as in the header: "F32", "F16", "BF16", "I64", ...
  std::vector<int64_t> shape;   // empty for a scalar
  uint64_t begin = 0, end = 0;  // byte range inside the data section
  uint64_t numel() const;
};

class SafetensorsFile {
 public:
  // Opens `path`, reads and validates the header (not the data). fatal() on any violation.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  // In file order (sorted by data offset).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor called `name`, or nullptr.
  const SafetensorsTensor* find(const std::string& name) const;
  // Reads tensor `t` (one of tensors()) as fp32 into out[0 .. t.numel()). F32, F16 and BF16 only;
  // another dtype is an error that names the tensor.
  void read_f32(const SafetensorsTensor& t, float* out) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;  // file offset of the data section: 8 + header length
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// True when the first bytes of `path` look like a safetensors header (a length that fits the file,
// then '{'). Never fails: an unreadable or short file gives false.
bool looks_like_safetensors(const std::string& path);

// ---- writing -------------------------------------------------------------------------------------
struct SafetensorsF32Tensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel floats, row-major
};

// Writes an F32 safetensors file: tensors in the order given, the header padded with spaces to a
// multiple of 8 bytes (as the reference writer does, so the data section is aligned). Written to
// `path`.tmp, fsynced and renamed, so a crash never leaves a partial file under `path`.
void write_safetensors_f32(const std::string& path, const std::vector<SafetensorsF32Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata);

// fp16 and bf16 bit patterns to fp32 (exact: every fp16 and bf16 value is an fp32 value).
float f16_bits_to_f32(uint16_t h);
float bf16_bits_to_f32(uint16_t b);

}  // namespace gpt2
