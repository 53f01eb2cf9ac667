#include "comm/bucket_plan.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace gpt2 {

BucketPlan::BucketPlan(size_t total_floats, size_t bucket_bytes, size_t first_bucket_bytes, int shards)
    : total_(total_floats), shards_(shards) {
  GPT2_REQUIRE(bucket_bytes >= sizeof(float), "--bucket-mb must be positive");
  GPT2_CHECK(shards >= 1, "BucketPlan: shards must be >= 1");
  const size_t w = static_cast<size_t>(shards);
  // Whole multiples of the shard count, so each bucket splits evenly over the ranks.
  auto aligned = [w](size_t n) { return std::max(w, n / w * w); };
  const size_t rest = aligned(std::max<size_t>(1, bucket_bytes / sizeof(float)));
  // The first bucket is never larger than the others (a 256 KiB plan starts with 256 KiB, not 1 MiB).
  const size_t first = std::min(rest, aligned(std::max<size_t>(1, first_bucket_bytes / sizeof(float))));
  size_t end = total_floats;
  bool is_first = true;
  while (end > 0) {
    const size_t want = is_first ? first : rest;
    const size_t begin = end > want ? end - want : 0;
    buckets_.push_back({begin, end});
    end = begin;
    is_first = false;
  }
}

BucketPlan BucketPlan::in_bytes(size_t elements, size_t element_bytes, size_t bucket_bytes, size_t first_bucket_bytes,
                                int shards) {
  GPT2_CHECK(element_bytes == 2 || element_bytes == 4, "BucketPlan: elements of " << element_bytes << " bytes");
  const size_t scale = sizeof(float) / element_bytes;
  return BucketPlan(elements, bucket_bytes * scale, first_bucket_bytes * scale, shards);
}

BucketPlan::Split BucketPlan::split(size_t bucket) const {
  const Bucket& b = buckets_.at(bucket);
  const size_t w = static_cast<size_t>(shards_);
  const size_t rem = b.size() % w;  // nonzero only in the last bucket (the others are multiples of w)
  Split s;
  s.replicated = {b.begin, b.begin + rem};
  s.scattered = b.begin + rem;
  s.chunk = (b.size() - rem) / w;
  return s;
}

std::vector<FlatRange> BucketPlan::owned_by(int rank) const {
  std::vector<FlatRange> out;
  for (size_t i = buckets_.size(); i-- > 0;) {  // ascending offsets: the last bucket first
    const Split s = split(i);
    if (s.replicated.size() > 0) out.push_back(s.replicated);
    if (s.chunk > 0) out.push_back(s.piece(rank));
  }
  // Adjacent runs (shards() == 1: every bucket whole) merge into one.
  std::vector<FlatRange> merged;
  for (const FlatRange& r : out) {
    if (!merged.empty() && merged.back().end == r.begin) merged.back().end = r.end;
    else merged.push_back(r);
  }
  return merged;
}

}  // namespace gpt2
