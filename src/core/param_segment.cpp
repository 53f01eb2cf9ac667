#include "core/param_segment.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace gpt2 {

std::vector<OwnedPiece> owned_pieces(std::vector<ParamSegment> segments, const std::vector<FlatRange>& owned) {
  std::sort(segments.begin(), segments.end(),
            [](const ParamSegment& a, const ParamSegment& b) { return a.offset < b.offset; });
  std::vector<OwnedPiece> pieces;
  size_t local = 0;
  for (size_t i = 0; i < owned.size(); ++i) {
    const FlatRange& r = owned[i];
    GPT2_CHECK(r.begin <= r.end && (i == 0 || owned[i - 1].end <= r.begin), "owned runs must be ascending and disjoint");
    // The segments overlapping [r.begin, r.end): the first one ending after r.begin, onwards.
    auto it = std::upper_bound(segments.begin(), segments.end(), r.begin,
                               [](size_t x, const ParamSegment& s) { return x < s.offset + s.size; });
    for (; it != segments.end() && it->offset < r.end; ++it) {
      const size_t b = std::max(r.begin, it->offset), e = std::min(r.end, it->offset + it->size);
      if (b < e) pieces.push_back({b, local + (b - r.begin), e - b, it->decay});
    }
    local += r.size();
  }
  return pieces;
}

size_t total_size(const std::vector<FlatRange>& runs) {
  size_t n = 0;
  for (const FlatRange& r : runs) n += r.size();
  return n;
}

}  // namespace gpt2
