// Collective communication behind ONE device-neutral interface. The MPI implementation works on host
// buffers; the NCCL one (CUDA builds, comm/nccl_communicator.hpp) implements the same interface on device
// buffers. What both share lives here, once:
//   - every collective is asynchronous and returns a CommRequest; blocking calls are i<op>()->wait();
//   - wait() polls and gives up after the timeout (--comm-timeout-s) with a message naming the step, the
//     collective (label, bytes, sequence number) and the ranks that did not arrive, then ends the job;
//   - a flight recorder keeps the last kFlightEntries collectives (sequence number, kind, label, bytes,
//     start and end time) and writes <dir>/flight_rank<R>.json on a timeout or any fatal error.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gpt2 {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
enum class DType { kF32, kBf16, kF64, kI32 };
size_t dtype_bytes(DType t);
const char* dtype_name(DType t);
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min" (traces and error messages)

class Communicator;

// A collective in flight. test() drives progress and never blocks; wait() blocks with the timeout.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  bool test();
  void wait();
  int64_t seq() const { return seq_; }
  // A device communicator's collective: the cudaEvent_t recorded on its stream right after it, which
  // another stream can wait on (cudaStreamWaitEvent) to read the result without the host waiting.
  // nullptr for host (MPI) collectives. Valid while this request lives.
  virtual void* device_event() const { return nullptr; }

 protected:
  CommRequest(Communicator& comm, int64_t seq) : comm_(comm), seq_(seq) {}
  // Implementation: one nonblocking look at the collective; true once complete. Runs at most once more
  // after it returned true (never, in fact: the base class remembers).
  virtual bool poll() = 0;
  // Implementation: the collective is complete (e.g. scale for an average, order a device stream).
  virtual void on_complete() {}

 private:
  friend class Communicator;
  Communicator& comm_;
  int64_t seq_;
  bool done_ = false;
};

class Communicator {
 public:
  // control: the MPI communicator spanning the same ranks; a duplicate of it carries the side channel
  // that finds out who did not arrive (see comm/communicator.cpp). timeout_s: how long wait() waits.
  Communicator(MPI_Comm control, double timeout_s);
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // An MPI communicator over the same ranks, to make another Communicator from (a duplicate of the control).
  MPI_Comm group() const { return side_; }
  virtual const char* backend() const = 0;  // "mpi" | "nccl"

  // ---- asynchronous collectives. Counts are in elements; label names the call site in errors and the
  // flight record ("grad bucket 3/12", "loss", ...). Buffers must stay valid until wait() returns.
  // In place: buf (n elements) becomes the reduction over ranks.
  virtual std::unique_ptr<CommRequest> iallreduce(void* buf, size_t n, DType t, ReduceOp op,
                                                  const std::string& label) = 0;
  // send holds size()*n elements; recv (n elements) becomes the reduction of block rank() of send.
  // In place when recv is send's block rank() (recv == send + rank() * n elements); then the other
  // blocks of send are left unspecified (MPI: reduced as well; NCCL: untouched).
  virtual std::unique_ptr<CommRequest> ireduce_scatter(const void* send, void* recv, size_t n, DType t,
                                                       ReduceOp op, const std::string& label) = 0;
  // send holds n elements; recv (size()*n elements) becomes every rank's send, in rank order.
  virtual std::unique_ptr<CommRequest> iallgather(const void* send, void* recv, size_t n, DType t,
                                                  const std::string& label) = 0;
  // The same, received on `root` only: recv (size()*n elements) matters there and is not touched
  // elsewhere (it may be null there). In place on root when send is recv's block root.
  virtual std::unique_ptr<CommRequest> igather(const void* send, void* recv, size_t n, DType t, int root,
                                               const std::string& label) = 0;
  virtual std::unique_ptr<CommRequest> ibroadcast(void* buf, size_t bytes, int root, const std::string& label) = 0;
  virtual std::unique_ptr<CommRequest> ibarrier(const std::string& label) = 0;

  // ---- blocking conveniences (each is the asynchronous call, then wait() with the timeout)
  void allreduce(float* buf, size_t n, ReduceOp op, const std::string& label = "allreduce");
  void allreduce(double* buf, size_t n, ReduceOp op, const std::string& label = "allreduce");
  void allreduce(int* buf, size_t n, ReduceOp op, const std::string& label = "allreduce");
  std::unique_ptr<CommRequest> iallreduce(float* buf, size_t n, ReduceOp op, const std::string& label = "iallreduce") {
    return iallreduce(buf, n, DType::kF32, op, label);
  }
  void broadcast(void* buf, size_t bytes, int root, const std::string& label = "broadcast");
  void barrier(const std::string& label = "barrier");

  // ---- context for errors and the flight record. Step and directory are the process's, shared by all
  // its communicators (the trainer's MPI one and the CUDA backend's NCCL one).
  static void set_step(int64_t step);  // the optimizer step in progress (1-based)
  static int64_t step();
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout_s() const { return timeout_s_; }
  // Where flight_rank<R>.json goes on a timeout or a fatal error ("" = nowhere; the error says so).
  static void set_flight_dir(const std::string& dir);
  // Writes this rank's flight record now; returns its path ("" when no directory is set or it failed).
  std::string write_flight_record(const std::string& reason);

  // When on, every collective appends a line ("iallreduce f32 n=... op=avg") to trace(): tests
  // compare the traces of all ranks to prove they issue the same collectives in the same order.
  void set_tracing(bool on) { tracing_ = on; }
  const std::vector<std::string>& trace() const { return trace_; }

  static constexpr size_t kFlightEntries = 512;

 protected:
  // Every implementation calls this when it issues a collective, before starting it: records the
  // trace line and the flight entry, and returns the sequence number for the request.
  // trace_line: what set_tracing() records ("allreduce f32 n=1024 op=avg").
  int64_t begin_collective(const char* kind, const std::string& label, size_t bytes, const std::string& trace_line);
  // Called on a timeout before the job ends: tear the transport down without waiting for peers (NCCL).
  virtual void abort_backend() {}
  // Appended to a timeout's message when every peer arrived and the transport still did not complete.
  virtual std::string stuck_transport_hint() const { return ""; }
  // Blocks until ready() is true, with the timeout, its diagnosis and its end of the job as for collective
  // seq (what wait() does, without completing a request): for a transport's own steps within a collective.
  void wait_until(int64_t seq, const std::function<bool()>& ready);

 private:
  friend class CommRequest;
  struct FlightEntry {
    int64_t seq = -1, step = 0;
    const char* kind = "";
    std::string label;
    size_t bytes = 0;
    double t_start = 0, t_end = -1;  // seconds since the epoch; t_end < 0: not complete
  };
  // One side-channel message: "I have waited a while in collective seq" or "write your flight record".
  struct Notice {
    int64_t seq = -1, step = 0, bytes = 0;
    int32_t type = 0;  // kNoticeWaiting | kNoticeDump
    char kind[16] = {0};
    char label[48] = {0};
  };
  struct Outgoing {
    Notice notice;
    MPI_Request req = MPI_REQUEST_NULL;
  };
  void complete(CommRequest& r);
  void wait_for(CommRequest& r);
  [[noreturn]] void time_out(int64_t seq);
  void poll_side_channel();
  void notify_all(int32_t type, const FlightEntry& e);
  const FlightEntry* entry(int64_t seq) const;
  void maybe_stall_for_test(const std::string& label);
  static void report_on_fatal();

  MPI_Comm side_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_s_;
  int64_t next_seq_ = 0;
  std::vector<FlightEntry> flight_;  // ring of kFlightEntries, indexed by seq % kFlightEntries
  // Guards flight_'s entries: a fatal error on another thread (the batch prefetcher) writes the flight
  // record while this rank's main thread may be filling an entry. Timed: the writer gives up waiting
  // after a moment (the error may have been raised while the lock was held) and writes what it sees.
  mutable std::timed_mutex flight_mutex_;
  std::vector<Notice> last_notice_;  // per rank: the newest "waiting in" notice received
  std::deque<Outgoing> outgoing_;
  bool dumped_ = false;
  bool tracing_ = false;
  std::vector<std::string> trace_;
};

// root's `s` on every rank (its length first, then its bytes): one decision about files for all ranks.
std::string broadcast_string(Communicator& comm, std::string s, int root, const std::string& label);
// 52 bits of FNV-1a of `s`: exact in a double, so an all-reduce of (h, -h) under max tells whether every
// rank holds the same text.
double text_hash(const std::string& s);

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD, double timeout_s = 600.0);
  ~MpiCommunicator() override;
  const char* backend() const override { return "mpi"; }

  using Communicator::iallreduce;
  std::unique_ptr<CommRequest> iallreduce(void* buf, size_t n, DType t, ReduceOp op,
                                          const std::string& label) override;
  std::unique_ptr<CommRequest> ireduce_scatter(const void* send, void* recv, size_t n, DType t, ReduceOp op,
                                               const std::string& label) override;
  std::unique_ptr<CommRequest> iallgather(const void* send, void* recv, size_t n, DType t,
                                          const std::string& label) override;
  std::unique_ptr<CommRequest> igather(const void* send, void* recv, size_t n, DType t, int root,
                                       const std::string& label) override;
  std::unique_ptr<CommRequest> ibroadcast(void* buf, size_t bytes, int root, const std::string& label) override;
  std::unique_ptr<CommRequest> ibarrier(const std::string& label) override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace gpt2
