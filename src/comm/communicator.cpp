#include "comm/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "comm/mpi_env.hpp"
#include "core/error.hpp"

namespace gpt2 {

// ---- who did not arrive: the side channel ------------------------------------------------------------
// A collective that does not complete cannot say which rank is missing: MPI and NCCL only block. So every
// communicator owns a duplicate of its MPI communicator for small point-to-point notices:
//   - a rank that has waited in a collective for kAnnounceAfter (1 s, less for short timeouts) sends
//     "waiting in #seq <kind> <label> <bytes> at step S" to every peer, once per collective. A healthy job
//     sends none (fast collectives finish first); a slow one sends W-1 tiny messages per slow collective.
//   - every rank drains its notices (MPI_Iprobe, never blocking) while it waits and when it issues a
//     collective, keeping the newest notice per peer.
// All-reduce, reduce-scatter, all-gather and barrier complete on no rank before every rank has arrived,
// so on a timeout every rank that arrived is itself waiting and has announced it (the timed-out rank
// listens for one more announcement period first, for late arrivals). A peer whose newest notice is for an
// older collective, or that never sent one, did not arrive: it is hung, dead, or computing; one waiting in
// a different collective under the same sequence number shows that the ranks issue different collectives.
// Then the timed-out rank asks every peer to write its flight record ("dump" notice; a stopped or dead
// peer cannot), writes its own, and ends the job.
namespace {

constexpr int kSideTag = 7411;
constexpr int32_t kNoticeWaiting = 1;
constexpr int32_t kNoticeDump = 2;

double since_epoch_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int checked_count(size_t n) {
  GPT2_CHECK(n <= static_cast<size_t>(INT_MAX), "collective of " << n << " elements exceeds MPI's int count");
  return static_cast<int>(n);
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o + "\"";
}

int64_t g_step = 0;
std::string g_flight_dir;

// Every live communicator, for the fatal() reporter (a fatal error elsewhere writes their flight records).
std::mutex g_registry_mutex;
std::vector<Communicator*> g_registry;

// GPT2_FAULT_STALL="RANK:LABEL:STEP": that rank stops itself (SIGSTOP) just before it would issue the
// first collective whose label starts with LABEL at step STEP. The hang test uses it to stall one rank at a chosen call site.
struct StallSpec {
  int rank = -1;
  std::string label;
  int64_t step = -1;
};
StallSpec parse_stall_spec() {
  StallSpec s;
  const char* env = std::getenv("GPT2_FAULT_STALL");
  if (env == nullptr || *env == '\0') return s;
  const std::string v = env;
  const size_t a = v.find(':'), b = v.rfind(':');
  GPT2_REQUIRE(a != std::string::npos && b != a, "GPT2_FAULT_STALL must be RANK:LABEL:STEP (got '" << v << "')");
  s.rank = std::atoi(v.substr(0, a).c_str());
  s.label = v.substr(a + 1, b - a - 1);
  s.step = std::atoll(v.substr(b + 1).c_str());
  return s;
}

}  // namespace

void Communicator::set_step(int64_t step) { g_step = step; }
int64_t Communicator::step() { return g_step; }
void Communicator::set_flight_dir(const std::string& dir) { g_flight_dir = dir; }

size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBf16: return 2;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
  }
  return 0;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBf16: return "bf16";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
  }
  return "?";
}

// ---- CommRequest ---------------------------------------------------------------------------------------

bool CommRequest::test() {
  if (!done_ && poll()) comm_.complete(*this);
  return done_;
}

void CommRequest::wait() {
  if (!done_) comm_.wait_for(*this);
}

// ---- Communicator --------------------------------------------------------------------------------------

Communicator::Communicator(MPI_Comm control, double timeout_s) : timeout_s_(timeout_s), flight_(kFlightEntries) {
  MPI_CHECK(MPI_Comm_dup(control, &side_));
  MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN);
  MPI_CHECK(MPI_Comm_rank(side_, &rank_));
  MPI_CHECK(MPI_Comm_size(side_, &size_));
  last_notice_.resize(static_cast<size_t>(size_));
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  g_registry.push_back(this);
  set_fatal_reporter(&Communicator::report_on_fatal);
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    g_registry.erase(std::remove(g_registry.begin(), g_registry.end(), this), g_registry.end());
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  poll_side_channel();
  // Notices are a few dozen bytes and leave eagerly, so they are complete by now; one that is not (a peer
  // gone) keeps its buffer, deliberately leaked, because MPI may still read it.
  for (Outgoing& o : outgoing_) {
    int done = 0;
    MPI_Test(&o.req, &done, MPI_STATUS_IGNORE);
    if (!done) {
      auto* keep = new Outgoing(o);  // NOLINT: intentionally leaked, see above
      (void)keep;
      MPI_Request_free(&o.req);
    }
  }
  MPI_Comm_free(&side_);
}

void Communicator::maybe_stall_for_test(const std::string& label) {
  static const StallSpec spec = parse_stall_spec();
  if (spec.rank != rank_ || spec.step != g_step || label.rfind(spec.label, 0) != 0) return;
  std::fprintf(stderr, "[gpt2 test hook] rank %d pid %ld stops itself before '%s' at step %lld (GPT2_FAULT_STALL)\n",
               rank_, static_cast<long>(getpid()), label.c_str(), static_cast<long long>(g_step));
  std::fflush(stderr);
  raise(SIGSTOP);
}

int64_t Communicator::begin_collective(const char* kind, const std::string& label, size_t bytes,
                                       const std::string& trace_line) {
  maybe_stall_for_test(label);
  poll_side_channel();
  const int64_t seq = next_seq_++;
  if (tracing_) trace_.push_back(trace_line);
  std::lock_guard<std::timed_mutex> lock(flight_mutex_);
  FlightEntry& e = flight_[static_cast<size_t>(seq) % kFlightEntries];
  e.seq = seq;
  e.step = g_step;
  e.kind = kind;
  e.label = label;
  e.bytes = bytes;
  e.t_start = since_epoch_s();
  e.t_end = -1;
  return seq;
}

const Communicator::FlightEntry* Communicator::entry(int64_t seq) const {
  const FlightEntry& e = flight_[static_cast<size_t>(seq) % kFlightEntries];
  return e.seq == seq ? &e : nullptr;
}

void Communicator::complete(CommRequest& r) {
  r.on_complete();
  r.done_ = true;
  std::lock_guard<std::timed_mutex> lock(flight_mutex_);
  FlightEntry& e = flight_[static_cast<size_t>(r.seq_) % kFlightEntries];
  if (e.seq == r.seq_) e.t_end = since_epoch_s();
}

void Communicator::wait_for(CommRequest& r) {
  wait_until(r.seq_, [&r] { return r.poll(); });
  complete(r);
}

void Communicator::wait_until(int64_t seq, const std::function<bool()>& ready) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const double announce_after = std::min(1.0, timeout_s_ / 4);
  bool announced = false;
  for (long spins = 0;; ++spins) {
    if (ready()) return;
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (size_ > 1 && (spins & 63) == 0) poll_side_channel();
    if (!announced && size_ > 1 && waited > announce_after) {
      if (const FlightEntry* e = entry(seq)) notify_all(kNoticeWaiting, *e);
      announced = true;
    }
    if (waited > timeout_s_) time_out(seq);
    // MPI's nonblocking collectives move only when polled (Open MPI's libnbc advances a large
    // all-reduce one round per MPI_Test), so a short wait keeps polling, yielding the core to any
    // thread that needs it; only a long wait (a straggler, a lost peer) sleeps between polls.
    if (waited > 0.5) std::this_thread::sleep_for(std::chrono::microseconds(50));  // stop burning a core
    else if (spins > 64) std::this_thread::yield();
  }
}

void Communicator::notify_all(int32_t type, const FlightEntry& e) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    outgoing_.emplace_back();
    Outgoing& o = outgoing_.back();  // a deque never moves its elements: the buffer stays put
    o.notice.type = type;
    o.notice.seq = e.seq;
    o.notice.step = e.step;
    o.notice.bytes = static_cast<int64_t>(e.bytes);
    std::snprintf(o.notice.kind, sizeof(o.notice.kind), "%s", e.kind);
    std::snprintf(o.notice.label, sizeof(o.notice.label), "%s", e.label.c_str());
    // Not MPI_CHECK: a notice that cannot be sent must not turn a diagnosis into a different error.
    if (MPI_Isend(&o.notice, sizeof(Notice), MPI_BYTE, p, kSideTag, side_, &o.req) != MPI_SUCCESS)
      o.req = MPI_REQUEST_NULL;
  }
}

void Communicator::poll_side_channel() {
  if (size_ <= 1) return;
  while (!outgoing_.empty()) {
    int done = 0;
    if (MPI_Test(&outgoing_.front().req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
    outgoing_.pop_front();
  }
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kSideTag, side_, &flag, &st) != MPI_SUCCESS || !flag) return;
    Notice n;
    if (MPI_Recv(&n, sizeof(n), MPI_BYTE, st.MPI_SOURCE, kSideTag, side_, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    n.kind[sizeof(n.kind) - 1] = n.label[sizeof(n.label) - 1] = '\0';
    if (n.type == kNoticeWaiting) {
      Notice& last = last_notice_[static_cast<size_t>(st.MPI_SOURCE)];
      if (n.seq >= last.seq) last = n;
    } else if (n.type == kNoticeDump && !dumped_) {
      const std::string reason = "rank " + std::to_string(st.MPI_SOURCE) + " timed out in #" +
                                 std::to_string(n.seq) + " '" + n.label + "' and asked every rank for its record";
      const std::string path = write_flight_record(reason);
      if (!path.empty())
        std::fprintf(stderr, "[gpt2 rank %d] %s: wrote %s\n", rank_, reason.c_str(), path.c_str());
    }
  }
}

void Communicator::time_out(int64_t seq) {
  const FlightEntry* found = entry(seq);
  FlightEntry e = found != nullptr ? *found : FlightEntry{};
  e.seq = seq;
  // Late arrivals announce themselves kAnnounceAfter into their own wait: listen that long before judging.
  const double grace = std::min(1.0, timeout_s_ / 4) + 0.5;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace);
  while (std::chrono::steady_clock::now() < until) {
    poll_side_channel();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string missing, missing_detail, elsewhere;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const Notice& n = last_notice_[static_cast<size_t>(p)];
    const std::string where = "#" + std::to_string(n.seq) + " " + n.kind + " '" + n.label + "' (" +
                              std::to_string(n.bytes) + " bytes) at step " + std::to_string(n.step);
    if (n.seq == e.seq && std::strncmp(n.label, e.label.c_str(), sizeof(n.label) - 1) == 0 &&
        n.bytes == static_cast<int64_t>(e.bytes))
      continue;  // arrived, and waiting with us
    if (n.seq >= e.seq) {
      elsewhere += (elsewhere.empty() ? "" : "; ") + std::string("rank ") + std::to_string(p) + " waits in " + where;
      continue;
    }
    missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    missing_detail += (missing_detail.empty() ? "" : "; ") + std::string("rank ") + std::to_string(p) +
                      (n.seq < 0 ? " sent no word from any collective" : " was last seen waiting in " + where);
  }
  notify_all(kNoticeDump, e);
  abort_backend();
  const std::string what = msg() << "step " << e.step << ": collective #" << e.seq << " " << e.kind << " '"
                                 << e.label << "' (" << e.bytes << " bytes, " << backend()
                                 << ") did not complete within --comm-timeout-s " << timeout_s_ << " s on rank "
                                 << rank_;
  std::string why;
  if (!missing.empty()) why += "; rank(s) " + missing + " did not arrive (" + missing_detail + ")";
  if (!elsewhere.empty())
    why += "; the ranks issue different collectives: " + elsewhere;
  const bool stuck = missing.empty() && elsewhere.empty();
  if (stuck) why += "; every peer has arrived, so the transport itself is stuck" + stuck_transport_hint();
  const std::string path = write_flight_record(what + why);
  dumped_ = true;
  // Give the peers that are alive a moment to write theirs before MPI_Abort ends them.
  const auto flush_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (std::chrono::steady_clock::now() < flush_until) {
    poll_side_channel();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string files;
  if (path.empty())
    files = g_flight_dir.empty() ? "no flight records written (give --out to get them)"
                                : "could not write the flight record to " + g_flight_dir;
  else
    files = "flight records of the last collectives, one per rank that could write one: " + g_flight_dir +
            "/flight_rank<R>*.json (this rank's: " + path + ")";
  fatal(what + why + (stuck ? "; " : ". A peer is hung, dead or behind; ") + files + "; aborting the job");
}

std::string Communicator::write_flight_record(const std::string& reason) {
  if (g_flight_dir.empty()) return "";
  std::error_code ec;
  std::filesystem::create_directories(g_flight_dir, ec);  // rank 0 may not have made <out> yet
  // The trainer's MPI communicator writes flight_rank<R>.json; a device (NCCL) one flight_rank<R>.nccl.json.
  const std::string path = g_flight_dir + "/flight_rank" + std::to_string(rank_) +
                           (std::string(backend()) == "mpi" ? "" : std::string(".") + backend()) + ".json";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) return "";
    f << "{\"rank\":" << rank_ << ",\"world_size\":" << size_ << ",\"host\":" << json_string(hostname())
      << ",\"pid\":" << getpid() << ",\"backend\":\"" << backend() << "\",\"timeout_s\":" << timeout_s_
      << ",\"step\":" << g_step << ",\"next_seq\":" << next_seq_ << ",\"written_at\":" << std::fixed
      << since_epoch_s() << ",\"reason\":" << json_string(reason) << ",\n\"peers_last_waiting\":[";
    bool first = true;
    for (int p = 0; p < size_; ++p) {
      const Notice& n = last_notice_[static_cast<size_t>(p)];
      if (p == rank_ || n.seq < 0) continue;
      f << (first ? "" : ",") << "{\"rank\":" << p << ",\"seq\":" << n.seq << ",\"step\":" << n.step
        << ",\"kind\":" << json_string(n.kind) << ",\"label\":" << json_string(n.label) << ",\"bytes\":" << n.bytes
        << "}";
      first = false;
    }
    f << "],\n\"collectives\":[";
    first = true;
    // See flight_mutex_: a fatal error may have been raised while this thread held it (then the wait
    // times out and the ring is read as it is).
    std::unique_lock<std::timed_mutex> ring(flight_mutex_, std::defer_lock);
    (void)ring.try_lock_for(std::chrono::milliseconds(200));
    const int64_t from = std::max<int64_t>(0, next_seq_ - static_cast<int64_t>(kFlightEntries));
    for (int64_t s = from; s < next_seq_; ++s) {  // oldest first
      const FlightEntry* e = entry(s);
      if (e == nullptr) continue;
      f << (first ? "\n" : ",\n") << "{\"seq\":" << e->seq << ",\"step\":" << e->step << ",\"kind\":\"" << e->kind
        << "\",\"label\":" << json_string(e->label) << ",\"bytes\":" << e->bytes << ",\"start\":" << e->t_start
        << ",\"end\":";
      if (e->t_end < 0) f << "null,\"ms\":null}";
      else f << e->t_end << ",\"ms\":" << 1000.0 * (e->t_end - e->t_start) << "}";
      first = false;
    }
    f << "]}\n";
    if (!f) return "";
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return "";
  dumped_ = true;
  return path;
}

void Communicator::report_on_fatal() {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  for (Communicator* c : g_registry) {
    if (c->dumped_) continue;  // a timeout already wrote it, with the better reason
    const std::string path = c->write_flight_record("fatal error on this rank (see its message)");
    if (!path.empty()) std::fprintf(stderr, "[gpt2 rank %d] flight record of the last collectives: %s\n", c->rank_,
                                    path.c_str());
  }
}

void Communicator::allreduce(float* buf, size_t n, ReduceOp op, const std::string& label) {
  iallreduce(buf, n, DType::kF32, op, label)->wait();
}
void Communicator::allreduce(double* buf, size_t n, ReduceOp op, const std::string& label) {
  iallreduce(buf, n, DType::kF64, op, label)->wait();
}
void Communicator::allreduce(int* buf, size_t n, ReduceOp op, const std::string& label) {
  iallreduce(buf, n, DType::kI32, op, label)->wait();
}
void Communicator::broadcast(void* buf, size_t bytes, int root, const std::string& label) {
  ibroadcast(buf, bytes, root, label)->wait();
}
void Communicator::barrier(const std::string& label) { ibarrier(label)->wait(); }

// ---- MPI: host buffers ---------------------------------------------------------------------------------

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT;
    case DType::kBf16: break;
  }
  fatal("the MPI communicator works on host fp32/fp64/int32 buffers; bf16 is for NCCL (device buffers)");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
    default: return MPI_SUM;  // MPI has no average: sum, then scale on completion
  }
}

class MpiRequest final : public CommRequest {
 public:
  // scale_n elements of scale_buf are divided by `divide_by` on completion (an average); 0: nothing.
  MpiRequest(Communicator& comm, int64_t seq, void* scale_buf, size_t scale_n, DType t, int divide_by)
      : CommRequest(comm, seq), buf_(scale_buf), n_(scale_n), type_(t), divide_by_(divide_by) {}
  MPI_Request* handle() { return &req_; }
  // On completion, first copy scale_n elements from `from` to scale_buf (the rank's block of a
  // reduction done in a staging buffer the request owns: see ireduce_scatter).
  void copy_result_from(const void* from) { move_from_ = from; }
  std::vector<char>& staging() { return staging_; }

 private:
  bool poll() override {
    int flag = 0;
    MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }
  void on_complete() override {
    if (move_from_ != nullptr) std::memcpy(buf_, move_from_, n_ * dtype_bytes(type_));
    if (divide_by_ == 0) return;
    if (type_ == DType::kF32) {
      const float s = 1.0f / static_cast<float>(divide_by_);
      float* p = static_cast<float*>(buf_);
      for (size_t i = 0; i < n_; ++i) p[i] *= s;
    } else if (type_ == DType::kF64) {
      double* p = static_cast<double*>(buf_);
      for (size_t i = 0; i < n_; ++i) p[i] /= divide_by_;
    }
  }
  MPI_Request req_ = MPI_REQUEST_NULL;
  const void* move_from_ = nullptr;
  std::vector<char> staging_;
  void* buf_;
  size_t n_;
  DType type_;
  int divide_by_;
};

}  // namespace

std::string broadcast_string(Communicator& comm, std::string s, int root, const std::string& label) {
  if (comm.size() == 1) return s;
  uint64_t n = s.size();
  comm.broadcast(&n, sizeof(n), root, label + " (length)");
  s.resize(static_cast<size_t>(n));
  if (n > 0) comm.broadcast(s.data(), static_cast<size_t>(n), root, label);
  return s;
}

double text_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return static_cast<double>(h >> 12);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s) : Communicator(comm, timeout_s) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<CommRequest> MpiCommunicator::iallreduce(void* buf, size_t n, DType t, ReduceOp op,
                                                         const std::string& label) {
  GPT2_CHECK(op != ReduceOp::kAvg || t != DType::kI32, "an integer average is not exact: use kSum");
  const int64_t seq =
      begin_collective("allreduce", label, n * dtype_bytes(t),
                       msg() << "allreduce " << dtype_name(t) << " n=" << n << " op=" << reduce_op_name(op));
  auto req = std::make_unique<MpiRequest>(*this, seq, buf, n, t, op == ReduceOp::kAvg ? size() : 0);
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, checked_count(n), mpi_type(t), mpi_op(op), comm_, req->handle()));
  return req;
}

// Open MPI 4.1's nonblocking reduce-scatter (libnbc) is about ten times slower than its nonblocking
// all-reduce on the same bytes (shared memory, 25 MiB: 108 ms against 10 ms on 2 ranks, 220 against
// 18 on 4; tools/bench/bench_allreduce's reduce_scatter case), which would make ZeRO-1 slower than
// plain data parallelism. So the reduce-scatter is an all-reduce of the whole send buffer, of which
// this rank keeps its block: in place (recv is send's block rank(), NCCL's convention) it reduces
// the caller's buffer, leaving every block reduced; otherwise a staging copy the request owns.
std::unique_ptr<CommRequest> MpiCommunicator::ireduce_scatter(const void* send, void* recv, size_t n, DType t,
                                                              ReduceOp op, const std::string& label) {
  GPT2_CHECK(op != ReduceOp::kAvg || t != DType::kI32, "an integer average is not exact: use kSum");
  const size_t block = n * dtype_bytes(t), W = static_cast<size_t>(size());
  const bool in_place = recv == static_cast<const char*>(send) + static_cast<size_t>(rank()) * block;
  GPT2_CHECK(in_place || send != recv, "reduce-scatter in place needs recv = send + rank * n");
  const int64_t seq =
      begin_collective("reduce_scatter", label, block * W,
                       msg() << "reduce_scatter " << dtype_name(t) << " n=" << n << " op=" << reduce_op_name(op));
  auto req = std::make_unique<MpiRequest>(*this, seq, recv, n, t, op == ReduceOp::kAvg ? size() : 0);
  void* all = const_cast<void*>(send);  // in place: the caller's buffer is ours to reduce
  if (!in_place) {
    req->staging().assign(static_cast<const char*>(send), static_cast<const char*>(send) + block * W);
    all = req->staging().data();
    req->copy_result_from(req->staging().data() + static_cast<size_t>(rank()) * block);
  }
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, all, checked_count(n * W), mpi_type(t), mpi_op(op), comm_, req->handle()));
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::iallgather(const void* send, void* recv, size_t n, DType t,
                                                         const std::string& label) {
  const int64_t seq = begin_collective("allgather", label, n * dtype_bytes(t) * static_cast<size_t>(size()),
                                       msg() << "allgather " << dtype_name(t) << " n=" << n);
  auto req = std::make_unique<MpiRequest>(*this, seq, nullptr, 0, t, 0);
  // send already in place (this rank's block of recv): MPI_IN_PLACE, no copy.
  const bool in_place = send == static_cast<const char*>(recv) + static_cast<size_t>(rank()) * n * dtype_bytes(t);
  MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, checked_count(n), mpi_type(t), recv, checked_count(n),
                           mpi_type(t), comm_, req->handle()));
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::igather(const void* send, void* recv, size_t n, DType t, int root,
                                                      const std::string& label) {
  const int64_t seq = begin_collective("gather", label, n * dtype_bytes(t) * static_cast<size_t>(size()),
                                       msg() << "gather " << dtype_name(t) << " n=" << n << " root=" << root);
  auto req = std::make_unique<MpiRequest>(*this, seq, nullptr, 0, t, 0);
  const bool in_place = rank() == root &&
                        send == static_cast<const char*>(recv) + static_cast<size_t>(root) * n * dtype_bytes(t);
  MPI_CHECK(MPI_Igather(in_place ? MPI_IN_PLACE : send, checked_count(n), mpi_type(t), recv, checked_count(n),
                        mpi_type(t), root, comm_, req->handle()));
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::ibroadcast(void* buf, size_t bytes, int root, const std::string& label) {
  const int64_t seq = begin_collective("broadcast", label, bytes, msg() << "broadcast bytes=" << bytes << " root=" << root);
  auto req = std::make_unique<MpiRequest>(*this, seq, nullptr, 0, DType::kI32, 0);
  MPI_CHECK(MPI_Ibcast(buf, checked_count(bytes), MPI_BYTE, root, comm_, req->handle()));
  return req;
}

std::unique_ptr<CommRequest> MpiCommunicator::ibarrier(const std::string& label) {
  const int64_t seq = begin_collective("barrier", label, 0, "barrier");
  auto req = std::make_unique<MpiRequest>(*this, seq, nullptr, 0, DType::kI32, 0);
  MPI_CHECK(MPI_Ibarrier(comm_, req->handle()));
  return req;
}

}  // namespace gpt2
