// libFuzzer harness: the JSON parser (src/core/json.cpp) on arbitrary bytes. Properties: a parsed
// string quoted by json_quote parses back to the same string; an integer literal read by as_int64
// prints back as the literal (less a leading minus on zero).
#include <string>

#include "core/json.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace {

void check(const gpt2::JsonValue& v) {
  using K = gpt2::JsonValue::Kind;
  if (v.kind == K::kString) {
    const gpt2::JsonValue back = gpt2::parse_json(gpt2::json_quote(v.text), "quoted string");
    if (back.kind != K::kString || back.text != v.text) gpt2::fuzz::property_failed("json_quote round trip");
  }
  int64_t i = 0;
  if (v.kind == K::kNumber && v.as_int64(&i) && std::to_string(i) != v.text && !(i == 0 && v.text == "-0"))
    gpt2::fuzz::property_failed("as_int64 disagrees with the literal");
  for (const auto& e : v.array) check(e);
  for (const auto& kv : v.object) {
    if (v.get(kv.first) != &kv.second) gpt2::fuzz::property_failed("get() misses a member");
    check(kv.second);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpt2::fuzz::install_reject_hook();
  try {
    check(gpt2::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz input"));
  } catch (const gpt2::fuzz::Rejected&) {
  }
  return 0;
}
