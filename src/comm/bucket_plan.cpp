#include "comm/bucket_plan.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace gpt2 {

BucketPlan::BucketPlan(size_t total_floats, size_t bucket_bytes, size_t first_bucket_bytes) {
  GPT2_REQUIRE(bucket_bytes >= sizeof(float), "--bucket-mb must be positive");
  const size_t rest = std::max<size_t>(1, bucket_bytes / sizeof(float));
  // The first bucket is never larger than the others (a 256 KiB plan starts with 256 KiB, not 1 MiB).
  const size_t first = std::min(rest, std::max<size_t>(1, first_bucket_bytes / sizeof(float)));
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

}  // namespace gpt2
