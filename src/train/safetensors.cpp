#include "train/safetensors.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/json.hpp"

namespace gpt2 {

// The format stores little-endian numbers and we copy tensor bytes straight into floats.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace {

// The reference implementation refuses larger headers; so do we (a corrupt length must not make us
// allocate gigabytes).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// ---- safetensors -------------------------------------------------------------------------------------

// Bytes per element of every dtype the format defines (sub-byte float types are not supported).
int dtype_bytes(const std::string& d) {
  static const std::pair<const char*, int> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},   {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  for (const auto& p : kSizes)
    if (d == p.first) return p.second;
  return 0;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t file_size_of(const std::string& path) {
  struct stat st {};
  GPT2_REQUIRE(stat(path.c_str(), &st) == 0, "file not found: " << path);
  GPT2_REQUIRE(S_ISREG(st.st_mode), path << " is not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

// ---- reading ---------------------------------------------------------------------------------------

uint64_t SafetensorsTensor::numel() const {
  uint64_t n = 1;
  for (const int64_t d : shape) n *= static_cast<uint64_t>(d);  // checked for overflow when parsed
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const uint64_t size = file_size_of(path);
  const std::string where = "safetensors file " + path;
  GPT2_REQUIRE(size >= 8, where << " is " << size
                                << " bytes long, too short to hold the 8-byte header length: truncated or not a "
                                   "safetensors file");
  std::ifstream is(path, std::ios::binary);
  GPT2_REQUIRE(is.good(), "cannot open " << path);
  unsigned char len_bytes[8];
  is.read(reinterpret_cast<char*>(len_bytes), 8);
  GPT2_REQUIRE(is.good(), "cannot read " << path);
  const uint64_t n = read_u64_le(len_bytes);
  GPT2_REQUIRE(n <= size - 8, where << ": the header length (" << n << " bytes) goes beyond the end of the file ("
                                    << size << " bytes): truncated or not a safetensors file");
  GPT2_REQUIRE(n <= kMaxHeaderBytes,
               where << ": the header length (" << n << " bytes) exceeds the format's limit of " << kMaxHeaderBytes);
  GPT2_REQUIRE(n >= 2, where << ": the header is " << n << " bytes, too short for a JSON object");
  std::string header(n, '\0');
  is.read(header.data(), static_cast<std::streamsize>(n));
  GPT2_REQUIRE(is.good(), "cannot read the header of " << path);
  GPT2_REQUIRE(header[0] == '{', where << ": the header does not start with '{': not a safetensors file");
  data_start_ = 8 + n;
  const uint64_t data_len = size - data_start_;

  const JsonValue root = parse_json(header, where + " (header)");
  GPT2_REQUIRE(root.kind == JsonValue::Kind::kObject, where << ": the header is not a JSON object");
  for (const auto& kv : root.object) {
    const std::string& name = kv.first;
    const JsonValue& v = kv.second;
    if (name == "__metadata__") {
      GPT2_REQUIRE(v.kind == JsonValue::Kind::kObject, where << ": __metadata__ is not an object");
      for (const auto& m : v.object) {
        GPT2_REQUIRE(m.second.kind == JsonValue::Kind::kString,
                     where << ": __metadata__ value '" << m.first << "' is not a string");
        metadata_[m.first] = m.second.text;
      }
      continue;
    }
    const std::string tw = where + ", tensor '" + name + "'";
    GPT2_REQUIRE(v.kind == JsonValue::Kind::kObject, tw << ": the header entry is not an object");
    for (const auto& f : v.object)
      GPT2_REQUIRE(f.first == "dtype" || f.first == "shape" || f.first == "data_offsets",
                   tw << ": unknown field '" << f.first << "' (expected dtype, shape, data_offsets)");
    const JsonValue* dtype = v.get("dtype");
    const JsonValue* shape = v.get("shape");
    const JsonValue* offsets = v.get("data_offsets");
    GPT2_REQUIRE(dtype != nullptr && shape != nullptr && offsets != nullptr,
                 tw << ": the header entry needs dtype, shape and data_offsets");
    SafetensorsTensor t;
    t.name = name;
    GPT2_REQUIRE(dtype->kind == JsonValue::Kind::kString, tw << ": dtype is not a string");
    t.dtype = dtype->text;
    const int esize = dtype_bytes(t.dtype);
    GPT2_REQUIRE(esize > 0, tw << ": unknown dtype '" << t.dtype
                               << "' (known: BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64, "
                                  "F8_E5M2, F8_E4M3, F8_E8M0)");
    GPT2_REQUIRE(shape->kind == JsonValue::Kind::kArray, tw << ": shape is not an array");
    uint64_t bytes = static_cast<uint64_t>(esize);
    for (const JsonValue& d : shape->array) {
      int64_t dim = 0;
      GPT2_REQUIRE(d.as_int64(&dim) && dim >= 0, tw << ": shape holds '" << d.text << "', not a non-negative integer");
      GPT2_REQUIRE(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes),
                   tw << ": shape " << shape_str(t.shape) << "... is too large");
      t.shape.push_back(dim);
    }
    GPT2_REQUIRE(offsets->kind == JsonValue::Kind::kArray && offsets->array.size() == 2,
                 tw << ": data_offsets is not an array [begin, end]");
    int64_t b = 0, e = 0;
    GPT2_REQUIRE(offsets->array[0].as_int64(&b) && offsets->array[1].as_int64(&e) && b >= 0 && e >= b,
                 tw << ": data_offsets must be two integers 0 <= begin <= end");
    t.begin = static_cast<uint64_t>(b);
    t.end = static_cast<uint64_t>(e);
    GPT2_REQUIRE(t.end - t.begin == bytes, tw << ": data_offsets [" << b << ", " << e << "] span " << t.end - t.begin
                                              << " bytes but dtype " << t.dtype << " and shape " << shape_str(t.shape)
                                              << " need " << bytes);
    GPT2_REQUIRE(t.end <= data_len, tw << ": its data ends at byte " << t.end << " of the data section, which holds "
                                       << data_len << " bytes: the file is truncated");
    tensors_.push_back(std::move(t));
  }
  std::stable_sort(tensors_.begin(), tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The tensors must tile the data section: no gap, no overlap, nothing after the last one.
  uint64_t pos = 0;
  for (const SafetensorsTensor& t : tensors_) {
    GPT2_REQUIRE(t.begin == pos, where << ", tensor '" << t.name << "': its data starts at byte " << t.begin
                                       << " of the data section but the previous tensor ends at " << pos
                                       << (t.begin < pos ? " (overlap)" : " (gap)"));
    pos = t.end;
  }
  GPT2_REQUIRE(pos == data_len, where << ": " << data_len - pos << " bytes follow the last tensor's data");
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read_f32(const SafetensorsTensor& t, float* out) const {
  const int esize = dtype_bytes(t.dtype);
  GPT2_REQUIRE(t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16",
               "safetensors file " << path_ << ", tensor '" << t.name << "' has dtype " << t.dtype
                                   << ": only F32, F16 and BF16 can be read as floating-point weights");
  std::ifstream is(path_, std::ios::binary);
  GPT2_REQUIRE(is.good(), "cannot open " << path_);
  is.seekg(static_cast<std::streamoff>(data_start_ + t.begin));
  const uint64_t n = t.numel();
  auto fail_read = [&]() {
    fatal(msg() << "safetensors file " << path_ << ", tensor '" << t.name
                << "': cannot read its data (the file changed or is truncated)");
  };
  if (t.dtype == "F32") {
    is.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(n * sizeof(float)));
    if (!is.good()) fail_read();
    return;
  }
  // 16-bit types: convert in chunks so no second copy of a large tensor is held.
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  std::vector<uint16_t> buf(static_cast<size_t>(std::min(n, kChunk)));
  const bool bf16 = t.dtype == "BF16";
  for (uint64_t i = 0; i < n; i += kChunk) {
    const uint64_t m = std::min(kChunk, n - i);
    is.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(m * esize));
    if (!is.good()) fail_read();
    for (uint64_t j = 0; j < m; ++j) out[i + j] = bf16 ? bf16_bits_to_f32(buf[j]) : f16_bits_to_f32(buf[j]);
  }
}

bool looks_like_safetensors(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 10) return false;
  std::ifstream is(path, std::ios::binary);
  unsigned char head[9];
  if (!is.read(reinterpret_cast<char*>(head), 9)) return false;
  const uint64_t n = read_u64_le(head);
  return n >= 2 && n <= static_cast<uint64_t>(st.st_size) - 8 && head[8] == '{';
}

// ---- writing ---------------------------------------------------------------------------------------

void write_safetensors_f32(const std::string& path, const std::vector<SafetensorsF32Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& kv : metadata) {
      header += (first ? "" : ",") + json_quote(kv.first) + ":" + json_quote(kv.second);
      first = false;
    }
    header += "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const SafetensorsF32Tensor& t : tensors) {
    GPT2_CHECK(t.name != "__metadata__" && !t.name.empty(), "tensor name '" << t.name << "'");
    uint64_t n = 1;
    for (const int64_t d : t.shape) {
      GPT2_CHECK(d >= 0);
      n *= static_cast<uint64_t>(d);
    }
    const uint64_t bytes = n * sizeof(float);
    header += (first ? "" : ",") + json_quote(t.name) + ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) header += (i ? "," : "") + std::to_string(t.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
    first = false;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned

  AtomicFileWriter os(path);
  unsigned char len[8];
  uint64_t n = header.size();
  for (unsigned char& b : len) {
    b = static_cast<unsigned char>(n & 0xFF);
    n >>= 8;
  }
  os.write(len, 8);
  os.write(header.data(), header.size());
  for (const SafetensorsF32Tensor& t : tensors) {
    uint64_t numel = 1;
    for (const int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    os.write(t.data, numel * sizeof(float));
  }
  os.commit();
}

// ---- 16-bit floats ---------------------------------------------------------------------------------

float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;  // +-0
    } else {        // subnormal: mant x 2^-24, exact in fp32
      const float v = std::ldexp(static_cast<float>(mant), -24);
      return sign ? -v : v;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf, or NaN keeping its payload
  } else {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

float bf16_bits_to_f32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace gpt2
