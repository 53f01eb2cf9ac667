// --verify-data: every token of a dataset read once before the first step, the reading shared by all
// ranks, and each file's CRC-32 compared with the attribute crc32 that gpt2-data writes on /tokens.
// Training itself reads windows at random and checks only each token id: without this, a byte changed on
// disk after the file was written (a bad copy between clusters, bit rot) trains on other tokens silently.
#pragma once

#include "comm/communicator.hpp"
#include "data/token_file.hpp"

namespace gpt2 {

// The files are cut into pieces of kVerifyPieceTokens tokens, shared out over a group of ranks: all of
// them (each_copy false: one copy of the data, on a file system every node sees), or, each_copy true, the
// ranks that read the same files (real paths) on the same host, so that every node's own copy is read in
// full. In a group of G ranks, rank r reads pieces r, r + G, r + 2G, ... (each token checked against
// vocab_size as training reads it), one all-reduce gathers every piece's CRC-32, and every rank joins each
// file's from its pieces (zlib's crc32_combine) and compares it with the file's attribute. An error is
// printed once for the ranks that found it (fail_together), so a damaged file is one line naming it (and
// the host, with each_copy). Files without the attribute (written by another tool) are read and their ids
// checked; a warning names them. Called on every rank, with files that describe alike (checked before).
constexpr uint64_t kVerifyPieceTokens = uint64_t{8} << 20;  // 16 MiB of uint16 tokens: one read per piece
void verify_token_crcs(Communicator& comm, TokenDataset& data, const char* role, bool each_copy,
                       uint64_t piece_tokens = kVerifyPieceTokens);

}  // namespace gpt2
