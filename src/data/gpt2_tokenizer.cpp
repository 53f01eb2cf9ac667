#include "data/gpt2_tokenizer.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/error.hpp"
#include "core/json.hpp"
#include "data/unicode_tables.hpp"

namespace gpt2 {

// ---- Unicode classes -------------------------------------------------------------------------------

namespace unicode {

namespace {
struct BmpTable {
  uint8_t cls[0x10000];
  BmpTable() {
    std::memset(cls, kOther, sizeof(cls));
    for (size_t r = 0; r < kCharClassRangeCount && kCharClassRanges[r].first < 0x10000; ++r) {
      const CharClassRange& range = kCharClassRanges[r];
      const uint32_t last = std::min<uint32_t>(range.last, 0xFFFF);
      for (uint32_t cp = range.first; cp <= last; ++cp) cls[cp] = range.cls;
    }
  }
};
}  // namespace

CharClass char_class(uint32_t cp) {
  static const BmpTable bmp;  // 64 KiB, built once (thread-safe static initialisation)
  if (cp < 0x10000) return static_cast<CharClass>(bmp.cls[cp]);
  const CharClassRange* end = kCharClassRanges + kCharClassRangeCount;
  const CharClassRange* it =
      std::upper_bound(kCharClassRanges, end, cp, [](uint32_t c, const CharClassRange& r) { return c < r.first; });
  if (it == kCharClassRanges) return kOther;
  --it;
  return cp <= it->last ? it->cls : kOther;
}

}  // namespace unicode

namespace {

using unicode::CharClass;
using unicode::kLetter;
using unicode::kNumber;
using unicode::kOther;
using unicode::kSpace;

// ---- UTF-8 and the pre-tokenization pattern --------------------------------------------------------

// ASCII classes (the same in every Unicode version), as a constant table: no initialisation order.
constexpr CharClass ascii_class(uint32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ? kLetter
         : c >= '0' && c <= '9'                           ? kNumber
         : c == ' ' || (c >= '\t' && c <= '\r')           ? kSpace
                                                          : kOther;
}
struct AsciiClasses {
  CharClass cls[128];
  constexpr AsciiClasses() : cls() {
    for (uint32_t c = 0; c < 128; ++c) cls[c] = ascii_class(c);
  }
};
constexpr AsciiClasses kAscii;

struct CharInfo {
  uint32_t len;  // bytes
  CharClass cls;
};

inline bool is_cont(uint8_t b) {
  return (b & 0xC0) == 0x80;
}

// The character starting at p (p < end). A byte that does not start a valid UTF-8 sequence (stray
// continuation byte, overlong form, surrogate, beyond U+10FFFF, truncated) is one "other" character.
inline CharInfo char_at(const uint8_t* p, const uint8_t* end) {
  const uint8_t c = p[0];
  if (c < 0x80) return {1, kAscii.cls[c]};
  const size_t avail = static_cast<size_t>(end - p);
  if (c >= 0xC2 && c <= 0xDF) {
    if (avail < 2 || !is_cont(p[1])) return {1, kOther};
    return {2, unicode::char_class((uint32_t(c & 0x1F) << 6) | (p[1] & 0x3F))};
  }
  if (c >= 0xE0 && c <= 0xEF) {
    const uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    if (avail < 3 || p[1] < lo || p[1] > hi || !is_cont(p[2])) return {1, kOther};
    return {3, unicode::char_class((uint32_t(c & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F))};
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    if (avail < 4 || p[1] < lo || p[1] > hi || !is_cont(p[2]) || !is_cont(p[3])) return {1, kOther};
    return {4, unicode::char_class((uint32_t(c & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) |
                                   (uint32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F))};
  }
  return {1, kOther};
}

// End of the piece that starts at s[i] (i < n): the match of
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// at i, alternatives tried in order as a backtracking regex engine does.
size_t piece_end(const uint8_t* s, size_t n, size_t i) {
  const uint8_t* p = s + i;
  const uint8_t* const end = s + n;
  // Contractions (case-sensitive: "'S" is "'" then "S").
  if (p[0] == '\'' && n - i >= 2) {
    const uint8_t d = p[1];
    if (d == 's' || d == 't' || d == 'm' || d == 'd') return i + 2;
    if (n - i >= 3) {
      const uint8_t e = p[2];
      if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) return i + 3;
    }
  }
  CharInfo ch = char_at(p, end);
  const uint8_t* q = p;  // where the run of one class starts
  // " ?X+": one optional U+0020 before a run of letters, numbers or others (anything but \s).
  if (p[0] == ' ' && p + 1 < end) {
    const CharInfo next = char_at(p + 1, end);
    if (next.cls != kSpace) {
      q = p + 1;
      ch = next;
    }
  }
  if (ch.cls != kSpace) {
    const CharClass cls = ch.cls;
    q += ch.len;
    while (q < end) {
      const CharInfo x = char_at(q, end);
      if (x.cls != cls) break;
      q += x.len;
    }
    return static_cast<size_t>(q - s);
  }
  // A whitespace run p..q. "\s+(?!\S)" takes all of it at the end of the text and otherwise all but its
  // last character (which then starts the next piece, e.g. " word"); a single whitespace character
  // before a non-space is "\s+".
  const uint8_t* last = p;
  q = p + ch.len;
  while (q < end) {
    const CharInfo x = char_at(q, end);
    if (x.cls != kSpace) break;
    last = q;
    q += x.len;
  }
  if (q == end || last == p) return static_cast<size_t>(q - s);
  return static_cast<size_t>(last - s);
}

// ---- the per-thread piece cache --------------------------------------------------------------------

constexpr size_t kMaxCachedPiece = 64;  // bytes; longer pieces are rare and always recomputed
constexpr size_t kSmallPiece = 128;     // bytes; up to this, BPE by linear scans, beyond it with a heap

inline uint64_t hash_bytes(const uint8_t* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
  }
  h ^= h >> 32;
  h *= 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

// Piece bytes -> token ids, open addressing with linear probing. Bounded: when full it starts over
// (clearing is cheap and the common pieces come back at once).
class PieceCache {
 public:
  void reset(size_t max_entries) {
    max_entries_ = max_entries;
    size_t cap = 16;
    while (cap < 2 * max_entries) cap *= 2;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    clear();
  }

  // Appends the cached ids of the piece to out; false when it is not cached.
  bool find(uint64_t h, const uint8_t* key, size_t len, std::vector<uint32_t>& out) const {
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.key_len == 0) return false;
      if (slot.tag == tag && slot.key_len == len && std::memcmp(&keys_[slot.key_off], key, len) == 0) {
        out.insert(out.end(), ids_.begin() + slot.ids_off, ids_.begin() + slot.ids_off + slot.n_ids);
        return true;
      }
    }
  }

  void insert(uint64_t h, const uint8_t* key, size_t len, const uint32_t* ids, size_t n_ids) {
    if (count_ >= max_entries_) clear();
    size_t i = h & mask_;
    while (slots_[i].key_len != 0) i = (i + 1) & mask_;
    Slot& slot = slots_[i];
    slot.tag = static_cast<uint32_t>(h >> 32);
    slot.key_off = static_cast<uint32_t>(keys_.size());
    slot.ids_off = static_cast<uint32_t>(ids_.size());
    slot.key_len = static_cast<uint16_t>(len);
    slot.n_ids = static_cast<uint16_t>(n_ids);
    keys_.insert(keys_.end(), key, key + len);
    ids_.insert(ids_.end(), ids, ids + n_ids);
    ++count_;
  }

 private:
  struct Slot {
    uint32_t tag = 0;
    uint32_t key_off = 0;
    uint32_t ids_off = 0;
    uint16_t key_len = 0;  // 0 = empty (cached pieces have at least 2 bytes)
    uint16_t n_ids = 0;
  };
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    count_ = 0;
  }
  std::vector<Slot> slots_;
  std::vector<uint8_t> keys_;
  std::vector<uint32_t> ids_;
  size_t mask_ = 0, count_ = 0, max_entries_ = 0;
};

// One cache per thread, handed to whichever tokenizer encodes on that thread (instance ids are never
// reused, so a cache filled by another tokenizer is recognised and emptied).
PieceCache& thread_cache(uint64_t instance_id, size_t max_entries) {
  struct Owned {
    uint64_t owner = 0;
    PieceCache cache;
  };
  thread_local Owned owned;
  if (owned.owner != instance_id) {
    owned.cache.reset(max_entries);
    owned.owner = instance_id;
  }
  return owned.cache;
}

std::atomic<uint64_t> g_next_instance_id{1};

// ---- loading the vocabulary ------------------------------------------------------------------------

[[noreturn]] void bad_vocab_file(const std::string& path, const std::string& what) {
  fatal(msg() << "GPT-2 vocabulary file '" << path << "': " << what
              << " (tools/get-gpt2-vocab.sh fetches and verifies encoder.json and vocab.bpe)");
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) bad_vocab_file(path, msg() << "cannot open: " << std::strerror(errno));
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) bad_vocab_file(path, "read error");
  return data;
}

// GPT-2's bytes_to_unicode(): every byte gets a printable character; vocabulary entries are strings of
// these characters. Returns character -> byte for the 324 code points below U+0144 (-1: none).
std::vector<int> unicode_to_byte() {
  std::vector<int> inv(324, -1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    inv[printable ? b : 256 + extra++] = b;
  }
  return inv;
}

// A vocabulary string (UTF-8 of byte-alphabet characters) -> the bytes it stands for. False when a
// character is outside GPT-2's byte alphabet.
bool alphabet_to_bytes(const std::string& s, const std::vector<int>& inv, std::string& out) {
  out.clear();
  const uint8_t* p = reinterpret_cast<const uint8_t*>(s.data());
  const uint8_t* end = p + s.size();
  while (p < end) {
    uint32_t cp;
    if (p[0] < 0x80) {
      cp = *p++;
    } else if ((p[0] & 0xE0) == 0xC0 && end - p >= 2 && is_cont(p[1])) {
      cp = (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
      p += 2;
    } else {
      return false;  // the alphabet ends at U+0143: two bytes at most
    }
    if (cp >= inv.size() || inv[cp] < 0) return false;
    out.push_back(static_cast<char>(inv[cp]));
  }
  return true;
}


}  // namespace

// ---- Gpt2Tokenizer ---------------------------------------------------------------------------------

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& encoder_json_path, const std::string& vocab_bpe_path,
                             size_t cache_entries)
    : cache_entries_(std::min<size_t>(cache_entries, size_t(1) << 24)), instance_id_(g_next_instance_id.fetch_add(1)) {
  const std::vector<int> inv = unicode_to_byte();

  // encoder.json: token string -> id, ids dense 0..N-1.
  std::vector<std::string> tokens;
  std::unordered_map<std::string, uint32_t> id_of;  // token bytes -> id
  {
    const std::string text = read_file(encoder_json_path);
    std::string bytes;
    // encoder.json: one flat JSON object {"token": id, ...}, parsed by the project's one JSON parser.
    const JsonValue root = parse_json(text, msg() << "GPT-2 vocabulary file '" << encoder_json_path
                                                  << "' (tools/get-gpt2-vocab.sh fetches a good one): "
                                                  << "not a valid encoder.json");
    if (root.kind != JsonValue::Kind::kObject) bad_vocab_file(encoder_json_path, "not a valid encoder.json: not an object");
    for (const auto& entry : root.object) {
      const std::string& key = entry.first;
      int64_t id64 = 0;
      if (!entry.second.as_int64(&id64))
        bad_vocab_file(encoder_json_path, msg() << "not a valid encoder.json: the id of a token is not an integer");
      const long long id = id64;
      if (id < 0 || id >= static_cast<long long>(kVocabSize))
        bad_vocab_file(encoder_json_path, msg() << "token id " << id << " out of range: not GPT-2's vocabulary");
      if (!alphabet_to_bytes(key, inv, bytes) || bytes.empty())
        bad_vocab_file(encoder_json_path, msg() << "token " << id << " is not a string of GPT-2's byte alphabet");
      if (tokens.size() <= static_cast<size_t>(id)) tokens.resize(id + 1);
      if (!tokens[id].empty()) bad_vocab_file(encoder_json_path, msg() << "token id " << id << " appears twice");
      tokens[id] = bytes;
      if (!id_of.emplace(bytes, static_cast<uint32_t>(id)).second)
        bad_vocab_file(encoder_json_path, msg() << "token " << id << " duplicates another token's string");
    }
    if (id_of.size() != kVocabSize)
      bad_vocab_file(encoder_json_path, msg() << id_of.size() << " tokens, GPT-2 has " << kVocabSize);
    if (tokens[kEot] != "<|endoftext|>")
      bad_vocab_file(encoder_json_path, msg() << "token " << kEot << " is not <|endoftext|>: not GPT-2's vocabulary");
  }
  token_offsets_.reserve(kVocabSize + 1);
  for (const std::string& t : tokens) {
    token_offsets_.push_back(static_cast<uint32_t>(token_bytes_.size()));
    token_bytes_ += t;
  }
  token_offsets_.push_back(static_cast<uint32_t>(token_bytes_.size()));
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of.find(std::string(1, static_cast<char>(b)));
    if (it == id_of.end()) bad_vocab_file(encoder_json_path, msg() << "no token for byte " << b);
    byte_token_[b] = it->second;
  }

  // vocab.bpe: "#version: ..." then one merge "a b" a line, rank = line number - 2.
  const std::string text = read_file(vocab_bpe_path);
  size_t cap = 16;
  while (cap < 2 * kVocabSize) cap *= 2;
  merge_table_.assign(cap, ~uint64_t(0));
  merge_mask_ = cap - 1;
  std::vector<uint32_t> made_at(kVocabSize, 0);  // token -> 1 + rank of the merge that makes it (0: a byte)
  size_t line_start = 0, line_no = 0;
  uint32_t rank = 0;
  std::string a, b;
  while (line_start < text.size()) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    const std::string line = text.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    ++line_no;
    if (line_no == 1) {
      if (line.rfind("#version", 0) != 0)
        bad_vocab_file(vocab_bpe_path, "not a vocab.bpe file (the first line should be '#version: 0.2')");
      continue;
    }
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      bad_vocab_file(vocab_bpe_path, msg() << "line " << line_no << " is not a merge 'A B'");
    if (!alphabet_to_bytes(line.substr(0, space), inv, a) || !alphabet_to_bytes(line.substr(space + 1), inv, b))
      bad_vocab_file(vocab_bpe_path, msg() << "line " << line_no << " has a character outside GPT-2's byte alphabet");
    const auto ia = id_of.find(a), ib = id_of.find(b), im = id_of.find(a + b);
    if (ia == id_of.end() || ib == id_of.end() || im == id_of.end())
      bad_vocab_file(vocab_bpe_path, msg() << "line " << line_no << ": merge of tokens missing from the vocabulary"
                                           << " (encoder.json and vocab.bpe do not belong together)");
    // Both algorithms in bpe() rely on what training guarantees: a token is made before it is used.
    if (made_at[ia->second] > rank || made_at[ib->second] > rank)
      bad_vocab_file(vocab_bpe_path, msg() << "line " << line_no << " merges a token before the merge that makes it");
    if (merge_of(ia->second, ib->second) != kNoMerge)
      bad_vocab_file(vocab_bpe_path, msg() << "line " << line_no << " repeats a merge");
    if (made_at[im->second] == 0) made_at[im->second] = rank + 1;
    add_merge(ia->second, ib->second, rank, im->second);
    ++rank;
    if (rank >= 0xFFFF) bad_vocab_file(vocab_bpe_path, "too many merges: not GPT-2's vocabulary");
  }
  if (line_no == 0) bad_vocab_file(vocab_bpe_path, "empty file");
}

std::string Gpt2Tokenizer::default_vocab_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string base = (xdg && *xdg) ? std::string(xdg) : std::string(home ? home : ".") + "/.cache";
  return base + "/gpt2-mpi/gpt2-vocab";
}

Gpt2Tokenizer Gpt2Tokenizer::from_dir(const std::string& dir, size_t cache_entries) {
  return Gpt2Tokenizer(dir + "/encoder.json", dir + "/vocab.bpe", cache_entries);
}

uint32_t Gpt2Tokenizer::merge_of(uint32_t a, uint32_t b) const {
  const uint32_t key = (a << 16) | b;
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  for (size_t i = (h >> 40) & merge_mask_;; i = (i + 1) & merge_mask_) {
    const uint64_t slot = merge_table_[i];
    const uint32_t k = static_cast<uint32_t>(slot >> 32);
    if (k == key) return static_cast<uint32_t>(slot);
    if (k == 0xFFFFFFFFu) return kNoMerge;
  }
}

void Gpt2Tokenizer::add_merge(uint32_t a, uint32_t b, uint32_t rank, uint32_t merged) {
  const uint32_t key = (a << 16) | b;
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  size_t i = (h >> 40) & merge_mask_;
  while (static_cast<uint32_t>(merge_table_[i] >> 32) != 0xFFFFFFFFu) i = (i + 1) & merge_mask_;
  merge_table_[i] = (uint64_t(key) << 32) | (rank << 16) | merged;
}

void Gpt2Tokenizer::bpe(const uint8_t* bytes, size_t n, std::vector<uint32_t>& out) const {
  if (n <= kSmallPiece)
    bpe_small(bytes, n, out);
  else
    bpe_large(bytes, n, out);
}

// Up to kSmallPiece bytes: find the lowest-ranked adjacent pair by a scan, merge it, repeat. Merging
// the leftmost lowest pair one at a time gives what encoder.py's "merge every occurrence of the best
// bigram left to right" gives, because a merge never creates a pair of lower rank than its own.
void Gpt2Tokenizer::bpe_small(const uint8_t* bytes, size_t n, std::vector<uint32_t>& out) const {
  uint32_t ids[kSmallPiece];
  uint32_t vals[kSmallPiece];  // vals[i]: merge_of(ids[i], ids[i + 1])
  for (size_t i = 0; i < n; ++i) ids[i] = byte_token_[bytes[i]];
  for (size_t i = 0; i + 1 < n; ++i) vals[i] = merge_of(ids[i], ids[i + 1]);
  size_t m = n;
  while (m > 1) {
    uint32_t best = kNoMerge;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < m; ++i) {
      if (vals[i] < best) {
        best = vals[i];
        bi = i;
      }
    }
    if (best == kNoMerge) break;
    ids[bi] = best & 0xFFFF;
    // Drop symbol bi + 1 and pair bi + 1 (pair bi is recomputed below).
    std::memmove(&ids[bi + 1], &ids[bi + 2], (m - bi - 2) * sizeof(uint32_t));
    if (m >= bi + 3) std::memmove(&vals[bi + 1], &vals[bi + 2], (m - bi - 3) * sizeof(uint32_t));
    --m;
    if (bi + 1 < m) vals[bi] = merge_of(ids[bi], ids[bi + 1]);
    if (bi > 0) vals[bi - 1] = merge_of(ids[bi - 1], ids[bi]);
  }
  out.insert(out.end(), ids, ids + m);
}

// Long pieces (a megabyte of letters without a space is one piece): the same merges in the same order,
// (rank, position) from a min-heap over a linked list, O(n log n).
void Gpt2Tokenizer::bpe_large(const uint8_t* bytes, size_t n, std::vector<uint32_t>& out) const {
  GPT2_REQUIRE(n < 0xFFFFFFFFu, "GPT-2 tokenizer: a single piece of " << n << " bytes is too long (4 GiB at most)");
  constexpr uint32_t kEnd = 0xFFFFFFFFu, kDead = 0xFFFFFFFFu;
  std::vector<uint32_t> ids(n), next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = byte_token_[bytes[i]];
    next[i] = i + 1 < n ? static_cast<uint32_t>(i + 1) : kEnd;
    prev[i] = i > 0 ? static_cast<uint32_t>(i - 1) : kEnd;
  }
  // Entries are merge value << 32 | position: the lowest rank first, the leftmost among equal ranks.
  std::vector<uint64_t> init;
  init.reserve(n);
  for (size_t i = 0; i + 1 < n; ++i) {
    const uint32_t v = merge_of(ids[i], ids[i + 1]);
    if (v != kNoMerge) init.push_back((uint64_t(v) << 32) | i);
  }
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> heap(std::greater<uint64_t>(),
                                                                                    std::move(init));
  while (!heap.empty()) {
    const uint64_t top = heap.top();
    heap.pop();
    const uint32_t v = static_cast<uint32_t>(top >> 32), i = static_cast<uint32_t>(top);
    if (ids[i] == kDead) continue;
    const uint32_t j = next[i];
    if (j == kEnd || merge_of(ids[i], ids[j]) != v) continue;  // stale: a neighbour changed since
    ids[i] = v & 0xFFFF;
    ids[j] = kDead;
    next[i] = next[j];
    if (next[j] != kEnd) prev[next[j]] = i;
    if (prev[i] != kEnd) {
      const uint32_t w = merge_of(ids[prev[i]], ids[i]);
      if (w != kNoMerge) heap.push((uint64_t(w) << 32) | prev[i]);
    }
    if (next[i] != kEnd) {
      const uint32_t w = merge_of(ids[i], ids[next[i]]);
      if (w != kNoMerge) heap.push((uint64_t(w) << 32) | i);
    }
  }
  for (uint32_t i = 0; i != kEnd; i = next[i]) out.push_back(ids[i]);
}

void Gpt2Tokenizer::encode_append(std::string_view utf8, std::vector<uint32_t>& out) const {
  const uint8_t* s = reinterpret_cast<const uint8_t*>(utf8.data());
  const size_t n = utf8.size();
  PieceCache* cache = cache_entries_ > 0 ? &thread_cache(instance_id_, cache_entries_) : nullptr;
  size_t i = 0;
  while (i < n) {
    const size_t e = piece_end(s, n, i);
    const size_t len = e - i;
    if (len == 1) {
      out.push_back(byte_token_[s[i]]);
    } else if (cache != nullptr && len <= kMaxCachedPiece) {
      const uint64_t h = hash_bytes(s + i, len);
      if (!cache->find(h, s + i, len, out)) {
        const size_t before = out.size();
        bpe_small(s + i, len, out);
        cache->insert(h, s + i, len, out.data() + before, out.size() - before);
      }
    } else {
      bpe(s + i, len, out);
    }
    i = e;
  }
}

std::vector<uint32_t> Gpt2Tokenizer::encode(std::string_view utf8) const {
  std::vector<uint32_t> out;
  out.reserve(utf8.size() / 4 + 16);
  encode_append(utf8, out);
  return out;
}

std::string_view Gpt2Tokenizer::token_bytes(uint32_t id) const {
  GPT2_REQUIRE(id < vocab_size(), "GPT-2 tokenizer: token id " << id << " is out of range [0, " << vocab_size() << ")");
  return std::string_view(token_bytes_).substr(token_offsets_[id], token_offsets_[id + 1] - token_offsets_[id]);
}

std::string Gpt2Tokenizer::decode(const uint32_t* ids, size_t n) const {
  const uint32_t vocab = vocab_size();
  size_t total = 0;
  for (size_t k = 0; k < n; ++k) {
    GPT2_REQUIRE(ids[k] < vocab, "GPT-2 tokenizer: token id " << ids[k] << " at position " << k
                                                              << " is out of range [0, " << vocab << ")");
    total += token_offsets_[ids[k] + 1] - token_offsets_[ids[k]];
  }
  std::string out;
  out.reserve(total);
  for (size_t k = 0; k < n; ++k)
    out.append(token_bytes_, token_offsets_[ids[k]], token_offsets_[ids[k] + 1] - token_offsets_[ids[k]]);
  return out;
}

std::vector<std::string_view> Gpt2Tokenizer::split(std::string_view text) {
  std::vector<std::string_view> pieces;
  const uint8_t* s = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const size_t e = piece_end(s, text.size(), i);
    pieces.push_back(text.substr(i, e - i));
    i = e;
  }
  return pieces;
}

}  // namespace gpt2
