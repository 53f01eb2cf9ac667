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

// The part of one segment inside the runs a rank owns: where it is in the flat buffer, where in the
// rank's own buffers (its moments: the owned runs concatenated), its length and its weight decay.
struct OwnedPiece {
  size_t flat = 0, local = 0, size = 0;
  bool decay = false;
};

// The owned parts of every segment, in buffer order. owned: ascending, disjoint runs (checked).
// Elements of an owned run that no segment covers (alignment gaps) belong to no piece.
std::vector<OwnedPiece> owned_pieces(std::vector<ParamSegment> segments, const std::vector<FlatRange>& owned);
// Elements in the runs.
size_t total_size(const std::vector<FlatRange>& runs);

}  // namespace gpt2
