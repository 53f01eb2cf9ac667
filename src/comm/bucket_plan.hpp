// The communication plan of the flat gradient buffer: contiguous slices cut from its end (backward
// produces gradients from the end of the buffer to its start), planned once and immutable.
//
// ZeRO-1 (--zero 1) reduce-scatters each bucket over the W ranks instead of all-reducing it: rank r
// receives the average of its 1/W chunk of every bucket, updates those parameters and their Adam
// moments only, and all-gathers them back. Its shard is therefore one piece per bucket (shard()).
// Every bucket but the last is planned as a multiple of W elements; the last (it begins at offset 0)
// keeps the remainder, fewer than W elements at its start, which are all-reduced and updated on every
// rank alike ("replicated").
#pragma once

#include <cstddef>
#include <vector>

#include "core/param_segment.hpp"

namespace gpt2 {

using Bucket = FlatRange;

class BucketPlan {
 public:
  // total_floats: length of the gradient buffer. The first bucket (the buffer's tail) is
  // first_bucket_bytes (at most bucket_bytes) so communication starts early; the rest are
  // bucket_bytes; the last bucket takes whatever remains at the start of the buffer. Sizes are in
  // 4-byte elements. shards: the ranks a bucket is reduce-scattered over (1: all-reduce only).
  BucketPlan(size_t total_floats, size_t bucket_bytes, size_t first_bucket_bytes = 1 << 20, int shards = 1);
  // The same plan with the sizes in bytes of the elements all-reduced (element_bytes 4 for fp32, 2 for
  // bf16): a bf16 bucket of --bucket-mb holds twice the elements of an fp32 one, as DDP's bucket_cap_mb.
  static BucketPlan in_bytes(size_t elements, size_t element_bytes, size_t bucket_bytes,
                             size_t first_bucket_bytes = 1 << 20, int shards = 1);

  // In issue order, identical on every rank: buckets()[0] ends at total_floats, the last begins at 0.
  // Because wte (tied with the LM head) sits at offset 0, the bucket holding it is always the last
  // one: its gradient is final only after the encoder backward.
  const std::vector<Bucket>& buckets() const { return buckets_; }
  size_t total() const { return total_; }
  int shards() const { return shards_; }

  // How bucket i splits over shards() ranks.
  struct Split {
    FlatRange replicated;  // all-reduced and owned by every rank (empty except in the last bucket)
    size_t scattered = 0;  // where the reduce-scattered part begins (replicated.end)
    size_t chunk = 0;      // elements per rank in it
    FlatRange piece(int rank) const {
      return {scattered + static_cast<size_t>(rank) * chunk, scattered + static_cast<size_t>(rank + 1) * chunk};
    }
  };
  Split split(size_t bucket) const;
  // The runs of the buffer rank `rank` owns under ZeRO-1, ascending: the replicated run, then its
  // piece of every bucket. With shards() == 1, the whole buffer.
  std::vector<FlatRange> owned_by(int rank) const;

 private:
  std::vector<Bucket> buckets_;
  size_t total_ = 0;
  int shards_ = 1;
};

}  // namespace gpt2
