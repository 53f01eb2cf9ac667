// NCCL, as the emulated training binaries call it (emu.sh --train): the collectives of nccl.h that
// src/comm/nccl_communicator.cpp uses, carried out over MPI on a communicator of their own. A collective is
// an operation on its stream (cudart_stubs.cpp): its first turn starts a non-blocking MPI call with the
// stream's input as it is then, later turns test it, and the turn that finds it complete writes the
// output. By default streams run their work in the enqueuing call, so the collective ends there too; with
// EMU_ASYNC_STREAMS=1 it runs on the emulated device in stream order, after what its stream waits for, as
// NCCL's kernel would, while the device runs other streams. Every rank enqueues NCCL's collectives in the
// same order, as NCCL itself requires (MPI then matches them in that order).
//
// Reductions are computed in double, over the ranks' contributions in rank order, and rounded once to the
// element type, identically on every rank (NCCL's ring sums round at every hop; the tests that compare the
// two transports allow for that, and exact inputs give exact sums either way). ncclAvg is the sum times
// 1/nranks. Bad arguments are NCCL's error codes with the reason printed and in ncclGetLastError; an MPI
// failure inside a running collective is an emulator error.
//
// A nonblocking communicator (ncclCommInitRankConfig with config.blocking = 0, NCCL's fault-tolerance mode)
// is emulated at its least convenient: its initialisation and every later call return ncclInProgress, and
// the call's work is put on its stream only when ncclCommGetAsyncError finds it settled (the initialisation:
// once every rank has joined; a call: EMU_NCCL_IN_PROGRESS_POLLS polls later, default 2). Until then any
// other call on the communicator is refused (ncclInvalidUsage), as NCCL's contract forbids it. So a caller
// that records an event after a call before it has settled, or that does not poll, fails its checks here.
// EMU_NCCL_INIT_STUCK=1: every rank joins the initialisation and it never completes, as when NCCL cannot
// connect the ranks (a wrong NCCL_SOCKET_IFNAME).
// EMU_NCCL_ASYNC_ERROR=RANK:CALL: on the communicator's rank RANK, call CALL (0 the first after the
// initialisation) never runs; ncclCommGetAsyncError reports ncclRemoteError for it from then on, as NCCL
// does on the ranks still alive when a peer dies or the network fails (nonblocking communicators only).
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <memory>
#include <vector>

#include "emu/runtime.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
  bool nonblocking = false;
  MPI_Request joining = MPI_REQUEST_NULL;  // a nonblocking initialisation: its MPI_Comm_idup
  bool initialising = false;
  std::function<void()> deferred;  // a nonblocking call's work, put on its stream when it settles
  int polls_left = 0;
  long calls_settled = 0;          // the nonblocking calls that settled so far (EMU_NCCL_ASYNC_ERROR)
  bool failed = false;             // EMU_NCCL_ASYNC_ERROR struck: every later poll reports it
};

namespace {

std::string g_last_error;
int g_group_depth = 0;
struct P2p {
  bool send;
  void* buf;
  size_t bytes;
  int peer;
  MPI_Comm mpi;  // (the communicator may be aborted while the group is queued)
  cudaStream_t stream;
  ncclComm_t comm;
};
std::vector<P2p> g_group;  // the sends and receives of the open group

ncclResult_t fail(ncclResult_t rc, const std::string& why) {
  g_last_error = why;
  std::fprintf(stderr, "[emu] nccl: %s\n", why.c_str());
  return rc;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

double bf16_to_double(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even, as __float2bfloat16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

double load(const char* p, ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return *reinterpret_cast<const int8_t*>(p);
    case ncclUint8: return *reinterpret_cast<const uint8_t*>(p);
    case ncclInt32: return *reinterpret_cast<const int32_t*>(p);
    case ncclUint32: return *reinterpret_cast<const uint32_t*>(p);
    case ncclInt64: return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    case ncclUint64: return static_cast<double>(*reinterpret_cast<const uint64_t*>(p));
    case ncclFloat32: return *reinterpret_cast<const float*>(p);
    case ncclFloat64: return *reinterpret_cast<const double*>(p);
    case ncclBfloat16: return bf16_to_double(*reinterpret_cast<const uint16_t*>(p));
    default: return NAN;
  }
}
void store(char* p, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8: *reinterpret_cast<int8_t*>(p) = static_cast<int8_t>(v); break;
    case ncclUint8: *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(v); break;
    case ncclInt32: *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
    case ncclUint32: *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(v); break;
    case ncclInt64: *reinterpret_cast<int64_t*>(p) = static_cast<int64_t>(v); break;
    case ncclUint64: *reinterpret_cast<uint64_t*>(p) = static_cast<uint64_t>(v); break;
    case ncclFloat32: *reinterpret_cast<float*>(p) = static_cast<float>(v); break;
    case ncclFloat64: *reinterpret_cast<double*>(p) = v; break;
    case ncclBfloat16: *reinterpret_cast<uint16_t*>(p) = float_to_bf16(static_cast<float>(v)); break;
    default: break;
  }
}

// Refuses a call on a nonblocking communicator whose last call has not settled yet.
ncclResult_t check_settled(ncclComm_t comm, const char* what) {
  if (comm->failed)
    return fail(ncclRemoteError, std::string(what) + ": the communicator failed asynchronously before "
                                                      "(EMU_NCCL_ASYNC_ERROR): abort it");
  if (comm->initialising || comm->deferred)
    return fail(ncclInvalidUsage, std::string(what) + ": called while the communicator's " +
                                      (comm->initialising ? "initialisation" : "previous call") +
                                      " is still in progress (ncclInProgress): poll ncclCommGetAsyncError until it "
                                      "says ncclSuccess first");
  return ncclSuccess;
}

int in_progress_polls() {
  static const int n = [] {
    const char* e = std::getenv("EMU_NCCL_IN_PROGRESS_POLLS");
    return e ? std::atoi(e) : 2;
  }();
  return n;
}

// A call's work on comm: done now (on its stream, in stream order), or on a nonblocking communicator when
// the call settles (ncclCommGetAsyncError).
ncclResult_t submit(ncclComm_t comm, std::function<void()> work) {
  if (!comm->nonblocking) {
    work();
    return ncclSuccess;
  }
  comm->deferred = std::move(work);
  comm->polls_left = in_progress_polls();
  return ncclInProgress;
}

ncclResult_t check_args(ncclComm_t comm, ncclDataType_t t, size_t count, cudaStream_t stream, const char* what) {
  if (!comm) return fail(ncclInvalidArgument, std::string(what) + ": no communicator");
  if (ncclResult_t rc = check_settled(comm, what)) return rc;
  if (comm->mpi == MPI_COMM_NULL) return fail(ncclInvalidArgument, std::string(what) + ": no communicator");
  // An emulated collective is started once and polled: it cannot be a node that a graph replays.
  if (emu::stream_capturing(stream))
    return fail(ncclInvalidUsage, std::string(what) + " on a stream being captured (a CUDA graph) is not emulated");
  if (type_bytes(t) == 0 || t == ncclFloat16)
    return fail(ncclInvalidArgument, std::string(what) + ": element type " + std::to_string(t) + " is not emulated");
  if (count * type_bytes(t) * static_cast<size_t>(comm->size) > static_cast<size_t>(INT_MAX))
    return fail(ncclInvalidArgument, std::string(what) + ": more than 2 GB is not emulated");
  return ncclSuccess;
}

// How long a collective takes at least, from its start, with asynchronous streams: EMU_COLLECTIVE_DELAY_US
// (default 500000). Longer than the host takes from one step's update to the next step's forward here, so
// work that should wait for a collective and does not runs before it has finished (ZeRO-1's forward reading
// parameters still being gathered: with 20 ms that went unnoticed); over MPI on one machine a small
// collective would otherwise finish first.
std::chrono::microseconds collective_delay() {
  static const std::chrono::microseconds d = [] {
    const char* e = std::getenv("EMU_COLLECTIVE_DELAY_US");
    return std::chrono::microseconds(emu::async_streams() ? (e ? std::atol(e) : 500000) : 0);
  }();
  return d;
}

// A collective in flight: its MPI request(s) and the gathered contributions.
struct Pending {
  std::vector<char> all;
  std::vector<MPI_Request> reqs;
  bool started = false;
  std::chrono::steady_clock::time_point done_at;  // not before (collective_delay)
  void start() {
    started = true;
    done_at = std::chrono::steady_clock::now() + collective_delay();
  }
  // MPI_Testall over reqs; true once all are done and the collective's time has passed
  bool test(const char* what) {
    int done = 0;
    if (MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
      emu::fail("emulated NCCL: MPI_Testall failed in %s", what);
    return done != 0 && std::chrono::steady_clock::now() >= done_at;
  }
};

// Every rank's `count` elements from `send` into all[r * bytes...], then finish(all): what each reduction
// and the all-gather are made of, as an operation on `stream`.
template <class Finish>
ncclResult_t gather_then(const void* send, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t stream,
                         const char* what, Finish finish) {
  const int bytes = static_cast<int>(count * type_bytes(t));
  const MPI_Comm mpi = comm->mpi;
  const int size = comm->size;
  auto p = std::make_shared<Pending>();
  return submit(comm, [=]() { emu::stream_submit(stream, [=]() {
    if (!p->started) {
      p->start();
      p->all.resize(static_cast<size_t>(bytes) * size);
      p->reqs.resize(1);
      if (MPI_Iallgather(send, bytes, MPI_BYTE, p->all.data(), bytes, MPI_BYTE, mpi, &p->reqs[0]) != MPI_SUCCESS)
        emu::fail("emulated NCCL: MPI_Iallgather failed in %s", what);
    }
    if (!p->test(what)) return false;
    finish(p->all);
    return true;
  }, what); });
}

ncclResult_t check_op(ncclRedOp_t op) {
  if (op != ncclSum && op != ncclAvg && op != ncclMax && op != ncclMin && op != ncclProd)
    return fail(ncclInvalidArgument, "reduction op " + std::to_string(op) + " is not emulated");
  return ncclSuccess;
}

// out[i] = op over ranks of all[r][first + i], i < count
void reduce_into(const std::vector<char>& all, size_t total, size_t first, size_t count, ncclDataType_t t,
                 ncclRedOp_t op, int size, char* out) {
  const size_t eb = type_bytes(t);
  for (size_t i = 0; i < count; ++i) {
    double acc = load(all.data() + (first + i) * eb, t);
    for (int r = 1; r < size; ++r) {
      const double v = load(all.data() + (static_cast<size_t>(r) * total + first + i) * eb, t);
      if (op == ncclSum || op == ncclAvg) acc += v;
      else if (op == ncclProd) acc *= v;
      else if (op == ncclMax) acc = (v > acc || std::isnan(v)) ? v : acc;
      else acc = (v < acc || std::isnan(v)) ? v : acc;
    }
    if (op == ncclAvg) acc /= size;
    store(out + i * eb, t, acc);
  }
}

// What both initialisations need: MPI running, every rank of MPI_COMM_WORLD in the communicator, the id made
// by ncclGetUniqueId.
ncclResult_t check_init(const char* what, int nranks, const ncclUniqueId& id) {
  int init = 0, world = 0;
  MPI_Initialized(&init);
  if (!init) return fail(ncclInvalidUsage, std::string(what) + ": the emulated NCCL runs over MPI, which is not initialised");
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (nranks != world)
    return fail(ncclInvalidUsage, std::string(what) + ": the emulated NCCL needs all " + std::to_string(world) +
                                      " ranks of MPI_COMM_WORLD in one communicator, not " + std::to_string(nranks));
  if (std::strncmp(id.internal, "emulated-nccl", sizeof id.internal) != 0)
    return fail(ncclInvalidArgument, std::string(what) + ": the unique id was not made by ncclGetUniqueId");
  return ncclSuccess;
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t rc) {
  switch (rc) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated NCCL)";
    case ncclSystemError: return "unhandled system error (emulated NCCL)";
    case ncclInternalError: return "internal error (emulated NCCL)";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
    case ncclRemoteError: return "remote process exited or there was a network error (emulated NCCL)";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code (emulated NCCL)";
  }
}
const char* ncclGetLastError(ncclComm_t) { return g_last_error.c_str(); }

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

// The id only has to be the same bytes on every rank that joins (the repository broadcasts rank 0's).
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  std::snprintf(id->internal, sizeof id->internal, "emulated-nccl");
  return ncclSuccess;
}

// Every rank of MPI_COMM_WORLD must call it (it splits the world): the repository makes one communicator of
// all ranks.
ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (ncclResult_t rc = check_init("ncclCommInitRank", nranks, id)) return rc;
  auto* c = new ncclComm;
  if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->mpi) != MPI_SUCCESS) {
    delete c;
    return fail(ncclSystemError, "ncclCommInitRank: MPI_Comm_split failed");
  }
  MPI_Comm_rank(c->mpi, &c->rank);
  MPI_Comm_size(c->mpi, &c->size);
  if (c->rank != rank) return fail(ncclInvalidArgument, "ncclCommInitRank: rank differs from the MPI rank");
  *out = c;
  return ncclSuccess;
}

// config.blocking = 0: a nonblocking communicator (see the top). Its MPI communicator is a duplicate of
// MPI_COMM_WORLD made without blocking, so the rank must be the world rank.
ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (config == nullptr || config->blocking != 0) return ncclCommInitRank(out, nranks, id, rank);
  if (ncclResult_t rc = check_init("ncclCommInitRankConfig", nranks, id)) return rc;
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (rank != world_rank)
    return fail(ncclInvalidUsage, "ncclCommInitRankConfig: the emulated nonblocking NCCL needs each rank as its "
                                  "MPI_COMM_WORLD rank, not " + std::to_string(rank) + " for " +
                                  std::to_string(world_rank));
  auto* c = new ncclComm;
  c->nonblocking = true;
  c->initialising = true;
  c->rank = rank;
  c->size = nranks;
  if (MPI_Comm_idup(MPI_COMM_WORLD, &c->mpi, &c->joining) != MPI_SUCCESS) {
    delete c;
    return fail(ncclSystemError, "ncclCommInitRankConfig: MPI_Comm_idup failed");
  }
  *out = c;
  return ncclInProgress;
}

// Nothing to flush beyond what ncclCommDestroy waits for; on a nonblocking communicator it settles later.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommFinalize: no communicator");
  if (ncclResult_t rc = check_settled(comm, "ncclCommFinalize")) return rc;
  return submit(comm, [] {});
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  cudaDeviceSynchronize();  // its collectives still queued use its MPI communicator
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}
// No waiting for the peers: the MPI communicator is left to MPI's teardown.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
// Also what moves a nonblocking communicator's calls on (see the top). An MPI failure inside a running
// collective ends the process (emu::fail); the one asynchronous error reported is EMU_NCCL_ASYNC_ERROR's.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: no communicator");
  *async = ncclInProgress;
  if (comm->initialising) {
    static const bool stuck = std::getenv("EMU_NCCL_INIT_STUCK") && std::atoi(std::getenv("EMU_NCCL_INIT_STUCK"));
    int joined = comm->joining == MPI_REQUEST_NULL;
    if (!joined && MPI_Test(&comm->joining, &joined, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      emu::fail("emulated NCCL: MPI_Test of the initialisation's MPI_Comm_idup failed");
    if (!joined || stuck) return ncclSuccess;
    comm->initialising = false;
  }
  if (comm->failed) {
    *async = ncclRemoteError;
    return ncclSuccess;
  }
  if (comm->deferred) {
    if (comm->polls_left-- > 0) return ncclSuccess;
    static const std::pair<int, long> strike = [] {
      const char* e = std::getenv("EMU_NCCL_ASYNC_ERROR");
      int rank = -1;
      long call = -1;
      if (e && std::sscanf(e, "%d:%ld", &rank, &call) != 2)
        emu::fail("EMU_NCCL_ASYNC_ERROR=%s: expected RANK:CALL", e);
      return std::make_pair(rank, call);
    }();
    if (comm->rank == strike.first && comm->calls_settled == strike.second) {
      comm->failed = true;
      comm->deferred = nullptr;
      fail(ncclRemoteError, "emulated: call " + std::to_string(strike.second) + " on rank " +
                                std::to_string(comm->rank) + " failed asynchronously (EMU_NCCL_ASYNC_ERROR)");
      *async = ncclRemoteError;
      return ncclSuccess;
    }
    ++comm->calls_settled;
    const std::function<void()> work = std::move(comm->deferred);
    comm->deferred = nullptr;
    work();
  }
  *async = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = comm->size;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t rc = check_args(comm, t, count, stream, "ncclAllReduce")) return rc;
  if (ncclResult_t rc = check_op(op)) return rc;
  if (g_group_depth) return fail(ncclInvalidUsage, "ncclAllReduce inside a group is not emulated");
  const int size = comm->size;
  return gather_then(send, count, t, comm, stream, "ncclAllReduce", [=](const std::vector<char>& all) {
    reduce_into(all, count, 0, count, t, op, size, static_cast<char*>(recv));
  });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t rc = check_args(comm, t, recvcount, stream, "ncclReduceScatter")) return rc;
  if (ncclResult_t rc = check_op(op)) return rc;
  if (g_group_depth) return fail(ncclInvalidUsage, "ncclReduceScatter inside a group is not emulated");
  const int size = comm->size, rank = comm->rank;
  const size_t total = recvcount * size;
  return gather_then(send, total, t, comm, stream, "ncclReduceScatter", [=](const std::vector<char>& all) {
    reduce_into(all, total, recvcount * rank, recvcount, t, op, size, static_cast<char*>(recv));
  });
}

// In place is allowed (send == recv + rank * sendcount): the contributions are gathered apart first.
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t rc = check_args(comm, t, sendcount, stream, "ncclAllGather")) return rc;
  if (g_group_depth) return fail(ncclInvalidUsage, "ncclAllGather inside a group is not emulated");
  return gather_then(send, sendcount, t, comm, stream, "ncclAllGather",
                     [=](const std::vector<char>& all) { std::memcpy(recv, all.data(), all.size()); });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t rc = check_args(comm, t, count, stream, "ncclBroadcast")) return rc;
  if (g_group_depth) return fail(ncclInvalidUsage, "ncclBroadcast inside a group is not emulated");
  if (root < 0 || root >= comm->size) return fail(ncclInvalidArgument, "ncclBroadcast: root out of range");
  const int bytes = static_cast<int>(count * type_bytes(t));
  const bool is_root = comm->rank == root;
  const MPI_Comm mpi = comm->mpi;
  auto p = std::make_shared<Pending>();
  return submit(comm, [=]() { emu::stream_submit(stream, [=]() {
    if (!p->started) {  // into a buffer of its own: the output is written when the collective ends
      p->start();
      p->all.resize(static_cast<size_t>(bytes));
      if (is_root) std::memcpy(p->all.data(), send, bytes);
      p->reqs.resize(1);
      if (MPI_Ibcast(p->all.data(), bytes, MPI_BYTE, root, mpi, &p->reqs[0]) != MPI_SUCCESS)
        emu::fail("emulated NCCL: MPI_Ibcast failed");
    }
    if (!p->test("ncclBroadcast")) return false;
    std::memcpy(recv, p->all.data(), bytes);
    return true;
  }, "ncclBroadcast"); });
}

// Point to point: only inside a group (ncclGroupEnd posts every receive and send of it, then waits for all),
// which is how the repository uses them; alone, a send before its peer's receive would block the caller.
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (ncclResult_t rc = check_args(comm, t, count, stream, "ncclSend")) return rc;
  if (!g_group_depth) return fail(ncclInvalidUsage, "ncclSend outside ncclGroupStart/End is not emulated");
  if (peer < 0 || peer >= comm->size) return fail(ncclInvalidArgument, "ncclSend: peer out of range");
  g_group.push_back({true, const_cast<void*>(send), count * type_bytes(t), peer, comm->mpi, stream, comm});
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t rc = check_args(comm, t, count, stream, "ncclRecv")) return rc;
  if (!g_group_depth) return fail(ncclInvalidUsage, "ncclRecv outside ncclGroupStart/End is not emulated");
  if (peer < 0 || peer >= comm->size) return fail(ncclInvalidArgument, "ncclRecv: peer out of range");
  g_group.push_back({false, recv, count * type_bytes(t), peer, comm->mpi, stream, comm});
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}
// The group's sends and receives, posted together as one operation on the first one's stream (the
// repository's groups use one stream).
ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth || g_group.empty()) return ncclSuccess;
  const std::vector<P2p> ops = std::move(g_group);
  g_group.clear();
  auto p = std::make_shared<Pending>();
  auto received = std::make_shared<std::vector<std::vector<char>>>(ops.size());
  return submit(ops.front().comm, [=]() { emu::stream_submit(ops.front().stream, [=]() {
    if (!p->started) {  // receives into buffers of their own: the outputs are written when all are done
      p->start();
      p->reqs.resize(ops.size());
      const int tag = 7177;
      for (size_t i = 0; i < ops.size(); ++i) {
        const P2p& o = ops[i];
        const int n = static_cast<int>(o.bytes);
        if (!o.send) (*received)[i].resize(o.bytes);
        const int rc = o.send ? MPI_Isend(o.buf, n, MPI_BYTE, o.peer, tag, o.mpi, &p->reqs[i])
                              : MPI_Irecv((*received)[i].data(), n, MPI_BYTE, o.peer, tag, o.mpi, &p->reqs[i]);
        if (rc != MPI_SUCCESS) emu::fail("emulated NCCL: MPI_Isend/Irecv failed");
      }
    }
    if (!p->test("ncclGroupEnd (send/recv)")) return false;
    for (size_t i = 0; i < ops.size(); ++i)
      if (!ops[i].send) std::memcpy(ops[i].buf, (*received)[i].data(), ops[i].bytes);
    return true;
  }, "ncclGroupEnd"); });
}

}  // extern "C"
