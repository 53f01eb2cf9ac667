#include "core/json.hpp"

#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "core/error.hpp"

namespace gpt2 {

namespace {

constexpr int kMaxJsonDepth = 64;
// Objects up to this size look for a duplicate key by a linear scan; larger ones (a safetensors
// header with thousands of tensors) through a hash set.
constexpr size_t kLinearKeyScan = 16;

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& what) : s_(text), what_(what) {}

  JsonValue document() {
    JsonValue v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected trailing text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    fatal(msg() << what_ << ": invalid JSON: " << why << " at byte " << pos_);
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool eat(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool literal(const char* word) {
    const size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }

  JsonValue value(int depth) {
    if (depth > kMaxJsonDepth) fail("nested too deeply");
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end of text");
    JsonValue v;
    const char c = s_[pos_];
    if (c == '{') {
      ++pos_;
      v.kind = JsonValue::Kind::kObject;
      if (eat('}')) return v;
      std::unordered_set<std::string> seen;  // filled only past kLinearKeyScan members
      do {
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key");
        const size_t key_pos = pos_;
        std::string key = string();
        bool dup = false;
        if (v.object.size() < kLinearKeyScan) {
          for (const auto& kv : v.object) dup = dup || kv.first == key;
        } else {
          if (seen.empty())
            for (const auto& kv : v.object) seen.insert(kv.first);
          dup = !seen.insert(key).second;
        }
        if (dup) {
          pos_ = key_pos;
          fail("duplicate key \"" + key + "\"");
        }
        expect(':');
        JsonValue member = value(depth + 1);
        v.object.emplace_back(std::move(key), std::move(member));
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++pos_;
      v.kind = JsonValue::Kind::kArray;
      if (eat(']')) return v;
      do {
        v.array.push_back(value(depth + 1));
      } while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = JsonValue::Kind::kString;
      v.text = string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = JsonValue::Kind::kNumber;
      v.text = number();
    } else if (literal("true")) {
      v.kind = JsonValue::Kind::kBool;
      v.boolean = true;
    } else if (literal("false")) {
      v.kind = JsonValue::Kind::kBool;
    } else if (literal("null")) {
      v.kind = JsonValue::Kind::kNull;
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  std::string number() {
    const size_t start = pos_;
    auto digits = [&]() {
      const size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    if (s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;  // no leading zeros
    } else if (digits() == 0) {
      fail("malformed number");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) fail("malformed number");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) fail("malformed number");
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      const int d = (h >= '0' && h <= '9')   ? h - '0'
                    : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                             : -1;
      if (d < 0) fail("bad \\u escape");
      u = (u << 4) | static_cast<unsigned>(d);
    }
    return u;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      // Copy the run of plain bytes up to the next quote, backslash or control character in one go.
      const size_t run = pos_;
      while (pos_ < s_.size() && s_[pos_] != '"' && s_[pos_] != '\\' && static_cast<unsigned char>(s_[pos_]) >= 0x20)
        ++pos_;
      out.append(s_.data() + run, pos_ - run);
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c != '\\') fail("control character in a string");
      ++pos_;
      if (pos_ >= s_.size()) fail("unterminated string");
      const char e = s_[pos_++];
      static const char kEscaped[] = "\"\\/bfnrt";  // \X for these X stands for the same slot below
      static const char kMeaning[] = "\"\\/\b\f\n\r\t";
      if (const char* hit = e != '\0' ? std::strchr(kEscaped, e) : nullptr) {
        out += kMeaning[hit - kEscaped];
        continue;
      }
      if (e != 'u') fail(std::string("bad escape '\\") + e + "'");
      unsigned cp = hex4();
      if (cp >= 0xD800 && cp <= 0xDBFF) {  // high surrogate: a low one must follow
        if (!(pos_ + 1 < s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u')) fail("unpaired surrogate");
        pos_ += 2;
        const unsigned lo = hex4();
        if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        fail("unpaired surrogate");
      }
      append_utf8(out, cp);
    }
  }

  std::string_view s_;
  const std::string& what_;
  size_t pos_ = 0;
};

}  // namespace

const JsonValue* JsonValue::get(const std::string& key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& kv : object)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

bool JsonValue::as_int64(int64_t* out) const {
  if (kind != Kind::kNumber || text.empty()) return false;
  const bool neg = text[0] == '-';
  if (text.size() == (neg ? 1u : 0u)) return false;
  uint64_t v = 0;
  for (size_t i = neg ? 1 : 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c < '0' || c > '9') return false;  // a fraction or exponent: not an integer literal
    const auto d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + (neg ? 1 : 0);
  if (v > limit) return false;
  *out = neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
  return true;
}

JsonValue parse_json(std::string_view text, const std::string& what) { return JsonParser(text, what).document(); }

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace gpt2
