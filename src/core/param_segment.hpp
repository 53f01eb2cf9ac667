// The vocabulary model and optim share without including each other: runs of the flat parameter
// buffer. The model describes its tensors as ParamSegments (ParamTable::segments()); the optimizer
// updates the parts of them that a rank owns (FlatRanges: all of the buffer, or a ZeRO-1 shard).
#pragma once

#include <cstddef>
#include <vector>

namespace gpt2 {

// One parameter tensor in the flat buffer: [offset, offset + size), and whether AdamW's weight
// decay applies to it (2-D weights and embeddings, not biases or layernorm gains).
struct ParamSegment {
  size_t offset = 0;
  size_t size = 0;
  bool decay = false;
};

// A half-open run [begin, end) of the flat buffer.
struct FlatRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};

}  // namespace gpt2
