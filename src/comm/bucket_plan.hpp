// The all-reduce plan of the flat gradient buffer: contiguous slices cut from its end (backward
// produces gradients from the end of the buffer to its start), planned once and immutable.
#pragma once

#include <cstddef>
#include <vector>

namespace gpt2 {

struct Bucket {
  size_t begin = 0;  // first float of the slice
  size_t end = 0;    // one past the last float
  size_t size() const { return end - begin; }
};

class BucketPlan {
 public:
  // total_floats: length of the gradient buffer. The first bucket (the buffer's tail) is
  // first_bucket_bytes (at most bucket_bytes) so communication starts early; the rest are bucket_bytes; the last bucket
  // takes whatever remains at the start of the buffer.
  BucketPlan(size_t total_floats, size_t bucket_bytes, size_t first_bucket_bytes = 1 << 20);

  // In issue order, identical on every rank: buckets()[0] ends at total_floats, the last begins at 0.
  // Because wte (tied with the LM head) sits at offset 0, the bucket holding it is always the last
  // one: its gradient is final only after the encoder backward.
  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  std::vector<Bucket> buckets_;
};

}  // namespace gpt2
