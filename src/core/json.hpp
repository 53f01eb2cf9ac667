// The project's one JSON reader and writer: a small DOM parser (strict RFC 8259) for safetensors
// headers, Hugging Face config.json and JSON-lines datasets, and the matching string quoter.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpt2 {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;  // kString: the decoded string (UTF-8); kNumber: the literal as written (e.g. "1e-05")
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  // in document order; keys are unique

  // The member `key` of an object, or nullptr (also when this is not an object).
  const JsonValue* get(const std::string& key) const;
  // kNumber holding an integer literal (digits with an optional '-', no fraction or exponent) that
  // fits: true and *out set; otherwise false.
  bool as_int64(int64_t* out) const;
};

// Parses one JSON document (RFC 8259). Strict: duplicate object keys, unpaired UTF-16 surrogates in
// \u escapes, raw control characters in strings, nesting deeper than 64 and any text after the value
// (other than whitespace) are errors. On failure calls fatal() with
// "<what>: invalid JSON: <reason> at byte <k>" (k counts from 0).
JsonValue parse_json(std::string_view text, const std::string& what);

// `s` as a JSON string literal, quotes included: '"' and '\' backslash-escaped, control characters
// as \u00XX, every other byte (UTF-8 included) as is.
std::string json_quote(std::string_view s);

}  // namespace gpt2
