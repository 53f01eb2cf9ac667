#include "train/verify_data.hpp"

#include <mpi.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/fail_together.hpp"
#include "core/error.hpp"
#include "core/hdf5.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"

namespace gpt2 {

namespace {

// The ranks that read the same files on the same host: one group per copy of the data.
std::unique_ptr<MpiCommunicator> copy_group(Communicator& comm, TokenDataset& data) {
  std::string key = hostname();
  for (size_t f = 0; f < data.num_files(); ++f) {
    char* real = realpath(data.file(f).path().c_str(), nullptr);
    key += "\n" + std::string(real != nullptr ? real : data.file(f).path().c_str());
    std::free(real);
  }
  const int color = static_cast<int>(static_cast<uint64_t>(text_hash(key)) % 2147483647u);
  MPI_Comm split;
  if (MPI_Comm_split(comm.group(), color, comm.rank(), &split) != MPI_SUCCESS)
    fatal("MPI_Comm_split failed for --verify-data=local");
  auto group = std::make_unique<MpiCommunicator>(split, comm.timeout_s());
  MPI_Comm_free(&split);
  return group;
}

}  // namespace

void verify_token_crcs(Communicator& comm, TokenDataset& data, const char* role, bool each_copy,
                       uint64_t piece_tokens) {
  const Timer timer;
  struct Piece {
    size_t file;
    uint64_t offset, n;
  };
  std::vector<Piece> pieces;
  std::vector<std::string> without_crc;
  uint64_t bytes = 0;
  const std::unique_ptr<MpiCommunicator> own_copy = each_copy ? copy_group(comm, data) : nullptr;
  Communicator& readers = own_copy ? *own_copy : comm;
  const int W = readers.size(), rank = readers.rank();
  // Each piece's CRC-32 (exact in a double), -1 where another rank reads it: the all-reduce's max is every one.
  std::vector<double> crc;
  fail_together(comm, std::string(role) + " data verification (reading)", [&] {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    for (size_t f = 0; f < data.num_files(); ++f) {
      TokenFile& file = data.file(f);
      if (!file.has_crc32()) without_crc.push_back(file.path());
      for (uint64_t at = 0; at < file.size(); at += piece_tokens)
        pieces.push_back({f, at, std::min(piece_tokens, file.size() - at)});
      bytes += file.size() * static_cast<uint64_t>(file.dtype_bits() / 8);
    }
    crc.assign(pieces.size(), -1.0);
    for (size_t j = static_cast<size_t>(rank); j < pieces.size(); j += static_cast<size_t>(W))
      crc[j] = data.file(pieces[j].file).crc32_of_tokens(pieces[j].offset, pieces[j].n);
  });
  if (!crc.empty()) readers.allreduce(crc.data(), crc.size(), ReduceOp::kMax, std::string(role) + " data CRC-32s");
  // Every rank holds every CRC now and finds the same: a damaged file is one message, printed once.
  fail_together(comm, std::string(role) + " data verification (CRC-32s)", [&] {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    for (size_t j = 0; j < pieces.size();) {
      TokenFile& file = data.file(pieces[j].file);
      const uint64_t width = static_cast<uint64_t>(file.dtype_bits() / 8);
      uint32_t joined = static_cast<uint32_t>(crc[j]);
      const size_t f = pieces[j].file;
      for (++j; j < pieces.size() && pieces[j].file == f; ++j)
        joined = h5::crc32_join(joined, static_cast<uint32_t>(crc[j]), pieces[j].n * width);
      if (file.has_crc32()) file.require_crc32(joined);
    }
  });
  const double s = timer.ms() / 1e3;
  log_info("%s data verified: %s tokens in %zu file(s), %zu of them against their CRC-32 (read by %s%d rank(s) in "
           "%.1f s, %.2f GB/s)\n",
           role, format_count(static_cast<double>(data.num_tokens())).c_str(), data.num_files(),
           data.num_files() - without_crc.size(), each_copy ? "each copy's " : "", W, s,
           static_cast<double>(bytes) / 1e9 / std::max(s, 1e-9));
  if (!without_crc.empty())
    log_warn("%zu %s data file(s) have no crc32 attribute (written by another tool than gpt2-data), e.g. %s: "
             "their token ids were checked, not their bytes\n",
             without_crc.size(), role, without_crc.front().c_str());
}

}  // namespace gpt2
