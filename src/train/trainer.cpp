#include "train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/fail_together.hpp"
#include "comm/mpi_env.hpp"
#include "comm/nccl_version.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "data/batch_loader.hpp"
#include "data/byte_tokenizer.hpp"
#include "kernels/common/device.hpp"
#include "kernels/gemm/gemm.hpp"
#include "model/gpt2.hpp"
#include "train/batch_source.hpp"
#include "train/checkpoint.hpp"
#include "train/checkpointer.hpp"
#include "train/memory.hpp"
#include "train/metrics.hpp"
#include "train/restore.hpp"
#include "train/runner.hpp"
#include "train/stop_signal.hpp"
#include "train/verify_data.hpp"

namespace gpt2 {

namespace {

// The cores this rank may use: those it sees (omp_get_num_procs respects the launcher's CPU binding), and
// how many ranks share them. A bound rank sees only its own cores; unbound ranks see every core of the node.
struct RankCores {
  int visible, sharers;
  bool bound;
};
RankCores rank_cores(const MpiEnv& env) {
  const int visible = omp_get_num_procs();
  const bool bound = visible < static_cast<int>(std::thread::hardware_concurrency());
  return {visible, bound ? 1 : env.local_size(), bound};
}

int choose_threads(const TrainConfig& cfg, const MpiEnv& env) {
  if (cfg.threads > 0) return cfg.threads;
  const RankCores c = rank_cores(env);
  return std::max(1, c.visible / c.sharers);
}

void make_dir(const std::string& d) {
  std::error_code ec;
  std::filesystem::create_directories(d, ec);
  GPT2_REQUIRE(!ec, "cannot create output directory " << d << ": " << ec.message());
}

// Every rank must read the same files: a node with another copy of the data (other shards, a
// re-tokenised file) would train on other windows without any error. Compares each rank's file list,
// token counts and attributes with rank 0's; each rank that differs names its first differing file
// beside rank 0's, printed once for the ranks that differ alike (fail_together).
// Called on every rank for every role, with or without a dataset, so the collectives always match.
void require_same_data_on_all_ranks(Communicator& comm, const TokenDataset* ds, const char* role) {
  if (comm.size() == 1) return;
  const std::string mine = ds != nullptr ? ds->describe_files() : "(no " + std::string(role) + " data)\n";
  const std::string rank0 = broadcast_string(comm, mine, 0, std::string(role) + " data files");
  fail_together(comm, std::string(role) + " data check", [&] {
    if (mine == rank0) return;
    auto first_diff = [](const std::string& a, const std::string& b) {
      size_t i = 0;
      while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
      const size_t line = a.rfind('\n', i == 0 ? 0 : i - 1);
      const size_t from = (line == std::string::npos || i == 0) ? 0 : line + 1;
      std::string out = a.substr(from, a.find('\n', from) - from);
      return out.empty() ? std::string("(no more files)") : out;
    };
    fatal(msg() << "this rank sees other " << role << " data files than rank 0 for '"
                << (ds != nullptr ? ds->pattern() : "")
                << "'; every rank must read the same files (same names, token counts and attributes).\n"
                << "  this rank: " << first_diff(mine, rank0) << "\n  rank 0:    " << first_diff(rank0, mine));
  });
}

// Prints the per-rank memory estimate (rank 0) and refuses, before anything large is allocated, a
// configuration whose ranks on this node cannot fit in its available memory.
void check_memory(const TrainConfig& cfg, bool on_gpu, int64_t seqs_per_rank, const MpiEnv& env) {
  const MemoryEstimate e = estimate_training_memory(cfg.model, cfg.micro_batch, cfg.seq_len, seqs_per_rank, on_gpu,
                                                    cfg.recompute, cfg.zero == 1 ? env.world_size() : 1);
  log_info("memory per rank (estimate%s, --recompute %s, --zero %d): %s\n", on_gpu ? ", host side" : "",
           recompute_name(cfg.recompute), cfg.zero, e.describe().c_str());
  const double avail = available_host_memory();
  if (avail <= 0) return;  // unknown: nothing to compare with
  const int ranks = env.local_size();
  GPT2_REQUIRE(e.total() * ranks <= avail,
               "this run needs an estimated " << format_bytes(e.total()) << " of host memory per rank ("
                   << e.describe() << ") x " << ranks << " rank(s) on this node, but only " << format_bytes(avail)
                   << " is available (MemAvailable): use a smaller model, --micro-batch or --global-batch-tokens, "
                      "or fewer ranks per node");
}

// The shape of an optimizer step on this rank: accum micro-batches of B sequences of T tokens.
struct StepGeometry {
  int B = 0, T = 0;
  int64_t accum = 1;
  int world = 1;
};

struct StepResult {
  double loss = 0, grad_norm = 0;  // reduced over the ranks: the same everywhere
  float lr = 0;
  double exposed_ms = 0;  // communication backward did not hide
};

// One optimizer step (0-based `step`): the micro-steps' forward and backward, the gradient buckets
// communicated during the last backward, the loss and gradient norm reduced over the ranks, then
// the update. Every decision is taken on reduced values, so all ranks take it alike: a non-finite
// loss, gradient or update stops the run before anything non-finite can be checkpointed.
StepResult train_step(ModelRunner& runner, Communicator& comm, const RankBatch& batch, const StepGeometry& g,
                      const TrainConfig& cfg, int64_t step, std::vector<int32_t>& inputs,
                      std::vector<int32_t>& targets) {
  const int B = g.B, T = g.T;
  const float dloss = 1.0f / (static_cast<float>(B) * T * g.accum);
  runner.zero_grad();
  for (int64_t m = 0; m < g.accum; ++m) {
    batch.micro_batch(m, B, inputs.data(), targets.data());
    runner.forward_train(inputs.data(), targets.data(), B, T, dloss);
    // Only the last micro-step communicates: earlier ones just accumulate into the same buffer.
    runner.backward(/*communicate=*/m == g.accum - 1 && g.world > 1);
  }
  StepResult r;
  r.exposed_ms = runner.finish_communication();
  r.loss = runner.take_loss_sum() / g.accum;
  if (g.world > 1) comm.allreduce(&r.loss, 1, ReduceOp::kAvg, "loss");
  GPT2_REQUIRE_ON_ALL_RANKS(comm, std::isfinite(r.loss),
                            "the loss is " << r.loss << " at step " << step + 1
                                           << ": training diverged (try a lower --lr or --grad-clip, or check the "
                                              "data); the weights were not updated");
  r.grad_norm = std::sqrt(runner.grad_sum_squares());
  GPT2_REQUIRE_ON_ALL_RANKS(comm, std::isfinite(r.grad_norm),
                            "the gradient norm is " << r.grad_norm << " at step " << step + 1 << " (loss " << r.loss
                                                    << "): training diverged (try a lower --lr, or check the data); "
                                                       "the weights were not updated");
  r.lr = cfg.schedule.at(step);
  GPT2_REQUIRE_ON_ALL_RANKS(comm, std::isfinite(r.lr),
                            "the learning rate is " << r.lr << " at step " << step + 1 << ": check --lr");
  runner.optimizer_step(r.lr, clip_factor(r.grad_norm, cfg.optim.grad_clip));
  // A finite loss and gradient can still overflow in the update (a huge --lr): stop at this step,
  // before anything is written, rather than at the next one with a NaN checkpoint on disk.
  GPT2_REQUIRE_ON_ALL_RANKS(comm, runner.update_is_finite(),
                            "the update of step " << step + 1 << " made the weights non-finite (loss " << r.loss
                                                  << ", gradient norm " << r.grad_norm << ", lr " << r.lr
                                                  << "): lower --lr (or check the data); no checkpoint holds these "
                                                     "weights");
  return r;
}

// Stragglers: each rank's busy time (its step less the communication it waited for), gathered; the
// slowest over the median, and which rank it is.
void measure_skew(Communicator& comm, StepMetrics& sm) {
  const double busy = std::max(0.0, sm.ms - sm.comm_exposed_ms);
  std::vector<double> all(static_cast<size_t>(comm.size()));
  comm.iallgather(&busy, all.data(), 1, DType::kF64, "step times")->wait();
  std::vector<double> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  const size_t h = sorted.size() / 2;
  const double median = sorted.size() % 2 ? sorted[h] : 0.5 * (sorted[h - 1] + sorted[h]);
  sm.slowest_rank = static_cast<int>(std::max_element(all.begin(), all.end()) - all.begin());
  sm.skew = median > 0 ? all[static_cast<size_t>(sm.slowest_rank)] / median : 1.0;
}

// --profile-step: where the step's device time went on this rank's GPU (rank 0 prints it and writes it
// to metrics.jsonl).
void report_profile(const StepProfile& p, int64_t step, double step_ms, const StepGeometry& g, MetricsWriter& metrics,
                    int rank) {
  char heading[256];
  std::snprintf(heading, sizeof(heading),
                "profile of step %lld on rank 0's GPU: each op's device time (CUDA events at its launches), summed "
                "over the layers and %lld micro-step(s) of %d x %d tokens",
                static_cast<long long>(step), static_cast<long long>(g.accum), g.B, g.T);
  log_info("%s", p.table(heading, step_ms).c_str());
  if (rank == 0) metrics.raw(p.json(static_cast<long>(step), step_ms));
}

// Each rank resolves the backends on its own node, and they must be the same on every rank, or the ranks would
// run different collectives and hang or corrupt each other: a node without a working GPU driver falls back to
// --device cpu, one with fewer GPUs than ranks to --comm mpi. One all-reduce of (x, -x) under max gives every
// decision's highest and lowest value; a job where they differ ends on every rank, one line for each choice.
void agree_backends(const Backends& be, Communicator& comm) {
  const int mine[4] = {static_cast<int>(be.device), static_cast<int>(be.precision), static_cast<int>(be.comm),
                       static_cast<int>(be.gemm)};
  int v[8];
  for (int i = 0; i < 4; ++i) v[i] = mine[i], v[4 + i] = -mine[i];
  comm.allreduce(v, 8, ReduceOp::kMax, "backends check");
  bool same = true;
  for (int i = 0; i < 4; ++i) same = same && v[i] == -v[4 + i];
  // Every rank fails alike here, with its own choice: one line for each choice, with how many ranks made it.
  fail_together(comm, "backends check", [&] {
    GPT2_REQUIRE(same, "the ranks chose different backends; this one: --device "
                           << name_of(be.device) << " --precision " << name_of(be.precision) << " --comm "
                           << name_of(be.comm) << " --gemm " << name_of(be.gemm)
                           << ". A node without a working GPU driver falls back to --device cpu, and one with fewer "
                              "GPUs than ranks to --comm mpi: launch as many ranks per node as it has GPUs, or give "
                              "--device, --precision and --comm explicitly");
  });
}

}  // namespace

Backends resolve_backends(const TrainConfig& cfg, const MpiEnv& env) {
  Backends be;
  std::string why;
  // --device cpu never touches the CUDA runtime.
  const int gpus = cfg.device == Device::kCpu ? 0 : gpu_count(&why);
  be.device = cfg.device.value_or(gpus > 0 ? Device::kCuda : Device::kCpu);
  GPT2_REQUIRE(be.device != Device::kCuda || gpus > 0, "--device cuda: " << why << "; use --device cpu");
  const bool on_gpu = be.on_gpu();
  be.precision = cfg.precision.value_or(on_gpu ? Precision::kBf16 : Precision::kFp32);
  // NCCL refuses two ranks on one GPU: auto falls back to the host-staged MPI path when ranks share GPUs.
  const bool gpus_shared = on_gpu && env.local_size() > gpus;
  be.comm = cfg.comm.value_or(on_gpu && !gpus_shared ? Comm::kNccl : Comm::kMpi);
  if (!cfg.comm && gpus_shared)
    log_warn("%d ranks share %d GPU(s) on a node: using --comm mpi (host-staged, slow); run one rank per GPU "
             "for NCCL\n", env.local_size(), gpus);
  be.gemm = cfg.gemm;
  GPT2_REQUIRE_OPTIONS(on_gpu || be.precision == Precision::kFp32,
                       "--precision " << name_of(be.precision) << " needs --device cuda (the CPU backend is fp32)");
  GPT2_REQUIRE_OPTIONS(on_gpu || be.comm == Comm::kMpi,
                       "--comm " << name_of(be.comm) << " needs --device cuda (the CPU backend uses --comm mpi)");
  GPT2_REQUIRE_OPTIONS(on_gpu || !cfg.cuda_graph, "--cuda-graph needs --device cuda");
  GPT2_REQUIRE_OPTIONS(on_gpu || cfg.profile_step == 0,
                       "--profile-step times the CUDA backend's kernels: it needs --device cuda");
  GPT2_REQUIRE_OPTIONS(!on_gpu || cfg.zero == 0 || be.comm == Comm::kNccl,
                       "--zero 1 on GPUs needs --comm nccl (one GPU per rank); the host-staged --comm mpi path "
                       "keeps the whole optimizer: use --zero 0 there");
  return be;
}

// The batch geometry on W ranks: each rank's accum micro-batches of B sequences of T tokens make the global
// batch. Fills in the default --global-batch-tokens (one micro-batch a rank).
StepGeometry plan_batch(TrainConfig& cfg, int W) {
  const int B = cfg.micro_batch, T = cfg.seq_len;
  GPT2_REQUIRE_OPTIONS(B > 0 && T > 0, "--micro-batch and --seq-len must be positive");
  GPT2_REQUIRE_OPTIONS(T <= cfg.model.max_seq_len,
                       "--seq-len " << T << " exceeds the model's --max-seq-len " << cfg.model.max_seq_len);
  if (cfg.global_batch_tokens == 0) cfg.global_batch_tokens = static_cast<int64_t>(B) * T * W;
  GPT2_REQUIRE_OPTIONS(cfg.global_batch_tokens % T == 0,
                       "--global-batch-tokens " << cfg.global_batch_tokens << " is not a multiple of --seq-len " << T);
  const int64_t G = cfg.global_batch_tokens / T;  // sequences per optimizer step, all ranks
  GPT2_REQUIRE_OPTIONS(G % (static_cast<int64_t>(B) * W) == 0,
                       "the global batch of " << G << " sequences (--global-batch-tokens " << cfg.global_batch_tokens
                                              << ") does not divide into micro-batches of " << B << " on " << W
                                              << " ranks: make it a multiple of micro-batch x seq-len x ranks = "
                                              << static_cast<int64_t>(B) * T * W << " tokens");
  // The kernels index a micro-batch's B*T tokens with int.
  GPT2_REQUIRE_OPTIONS(static_cast<int64_t>(B) * T <= INT32_MAX,
                       "--micro-batch " << B << " x --seq-len " << T
                                        << " tokens is more than one micro-batch can index (2^31)");
  // 64-bit: never narrowed (it once read past a buffer)
  return StepGeometry{B, T, G / (static_cast<int64_t>(B) * W), W};
}

int run_training(const TrainConfig& cfg_in, MpiEnv& env) {
  TrainConfig cfg = cfg_in;
  const int W = env.world_size(), rank = env.rank();

  // Every collective of the run goes through this communicator, so all of them share the timeout (a lost
  // or hung peer ends the job) and the flight record (<out>/flight_rank<R>.json on a timeout or error).
  MpiCommunicator comm(MPI_COMM_WORLD, cfg.comm_timeout_s);
  comm.set_flight_dir(cfg.out_dir);
  // The start-up checks run alike on every rank, and so usually fail alike: each group of them is a
  // fail_together(), whose error is printed once for all the ranks it happened on.

  // ---- backends --------------------------------------------------------------------------------
  Backends be;
  fail_together(comm, "backends", [&] { be = resolve_backends(cfg, env); });
  const bool on_gpu = be.on_gpu();
  const int threads = choose_threads(cfg, env);
  kernels::set_cpu_threads(threads);
  agree_backends(be, comm);
  if (const RankCores c = rank_cores(env); !on_gpu && cfg.threads > 0 && cfg.threads * c.sharers > c.visible)
    log_warn("--threads %d%s asks for %d cores, and %s %d: threads share cores, each step is slower, and the MFU "
             "(its peak counts every thread) reads low; --threads 0 shares the cores out\n",
             cfg.threads, c.bound ? "" : (" x " + std::to_string(c.sharers) + " rank(s) on this node").c_str(),
             cfg.threads * c.sharers, c.bound ? "this rank is bound to" : "the node has", c.visible);

  // ---- which checkpoint, which model ---------------------------------------------------------------
  const std::string resume_path = choose_checkpoint(cfg, comm);

  // ---- batch geometry, memory, data --------------------------------------------------------------
  StepGeometry geo;
  std::unique_ptr<TokenDataset> train, val;
  fail_together(comm, "batch and data", [&] {
    geo = plan_batch(cfg, W);
    check_memory(cfg, on_gpu, geo.accum * geo.B, env);
    if (!cfg.benchmark) {
      GPT2_REQUIRE_OPTIONS(!cfg.train_data.empty() || cfg.eval_only, "--train-data is required (or use --benchmark)");
      if (!cfg.train_data.empty()) train = std::make_unique<TokenDataset>(cfg.train_data, geo.T);
      if (train && !cfg.eval_only) require_one_global_batch(*train, cfg.global_batch_tokens / geo.T);
      if (!cfg.val_data.empty()) val = std::make_unique<TokenDataset>(cfg.val_data, geo.T);
      if (val) require_one_val_micro_batch(*val, geo.B);
    }
    GPT2_REQUIRE_OPTIONS(!cfg.eval_only || val, "--eval-only needs --val-data");
    for (const TokenDataset* ds : {train.get(), val.get()}) {
      if (ds == nullptr) continue;
      GPT2_REQUIRE_OPTIONS(ds->vocab_size() <= cfg.model.vocab_size,
                           ds->pattern() << " has vocab_size " << ds->vocab_size() << " but the model's vocabulary is "
                                         << cfg.model.vocab_size << " (set --vocab-size " << ds->vocab_size() << ")");
    }
  });
  const int B = geo.B, T = geo.T;
  const int64_t accum = geo.accum;
  const int64_t G = cfg.global_batch_tokens / T;  // sequences per optimizer step, all ranks
  require_same_data_on_all_ranks(comm, train.get(), "training");
  require_same_data_on_all_ranks(comm, val.get(), "validation");
  if (cfg.verify_data != DataVerify::kNone) {
    const bool each_copy = cfg.verify_data == DataVerify::kLocal;
    if (train) verify_token_crcs(comm, *train, "training", each_copy);
    if (val) verify_token_crcs(comm, *val, "validation", each_copy);
  }

  // ---- model, optimizer, state -------------------------------------------------------------------
  GPT2 model(cfg.model);
  model.set_recompute(cfg.recompute);
  model.init(cfg.seed);
  // --bucket-mb counts the bytes all-reduced: bf16 gradients fit twice as many elements. Under ZeRO-1
  // every bucket splits over the W ranks, and each rank's optimizer owns its piece of each.
  const bool zero1 = cfg.zero == 1;
  const BucketPlan plan = BucketPlan::in_bytes(model.table().total(), be.precision == Precision::kBf16 ? 2 : 4,
                                               static_cast<size_t>(cfg.bucket_mb * (1 << 20)), size_t{1} << 20,
                                               zero1 ? W : 1);
  AdamW opt(model.table().segments(),
            zero1 ? plan.owned_by(rank) : std::vector<FlatRange>{{0, model.table().total()}}, cfg.optim);
  TrainState state;
  fail_together(comm, "checkpoint", [&] { state = restore_state(cfg, resume_path, model, opt, W); });
  comm.set_step(state.step);
  // A finished run resumed again (a requeued job, or --max-steps not raised): nothing to train, and its
  // last checkpoint stays as it is rather than being written again by this job's ranks.
  if (!resume_path.empty() && !cfg.eval_only && state.step >= cfg.max_steps) {
    log_info("step %6lld | %s already reaches --max-steps %lld: nothing to train (raise --max-steps to go on)\n",
             static_cast<long long>(state.step), resume_path.c_str(), static_cast<long long>(cfg.max_steps));
    return 0;
  }
  std::unique_ptr<ModelRunner> runner;
  if (on_gpu) {
    CudaRunnerOptions o;
    o.precision = be.precision;
    o.gemm = be.gemm;
    o.comm = be.comm;
    o.comm_timeout_s = cfg.comm_timeout_s;
    o.local_rank = env.local_rank();
    o.local_size = env.local_size();
    o.world_size = W;
    o.micro_batch = B;
    o.seq_len = T;
    o.zero1 = zero1;
    o.recompute = cfg.recompute;
    o.cuda_graph = cfg.cuda_graph;
    runner = make_cuda_runner(model, opt, comm, plan, o);
    runner->from_host();
  } else {
    runner = make_cpu_runner(model, opt, comm, plan, threads, zero1);
  }
  if (W > 1) {  // Every rank must start from the same weights (same seed or same file): check, cheaply.
    double hi = runner->local_param_sum_squares();  // each rank's own copy: a sharded sum would agree always
    double lo = hi;
    comm.allreduce(&hi, 1, ReduceOp::kMax, "initial weights check (max)");
    comm.allreduce(&lo, 1, ReduceOp::kMin, "initial weights check (min)");
    // (--seed is an option the ranks agreed on, and --init-from is rank 0's file on every rank.)
    GPT2_REQUIRE_ON_ALL_RANKS(comm, hi == lo,
                              "ranks start from different weights: the checkpoint differs from rank to rank (another "
                              "--resume file, or a node-local copy that differs); give every rank the same file");
  }

  if (rank == 0 && !cfg.out_dir.empty()) make_dir(cfg.out_dir);
  MetricsWriter metrics(rank == 0 ? cfg.out_dir : "", /*append=*/!resume_path.empty() || cfg.eval_only,
                        resume_path.empty() ? -1 : static_cast<long>(state.step));

  const double peak_tflops = cfg.peak_tflops > 0 ? cfg.peak_tflops : runner->default_peak_tflops();
  log_info("gpt2-train | model %s | %d rank(s) on %d node(s) | device %s\n", cfg.model.describe().c_str(), W,
           env.num_nodes(), runner->describe().c_str());
  if (peak_tflops <= 0) log_warn("unknown peak TFLOP/s for this device: MFU is reported as 0 (give --peak-tflops)\n");
  if (built_with_cuda()) log_info("built with CUDA: %s, %s\n", cuda_library_versions().c_str(), nccl_version_string().c_str());
  log_info("batch: %lld tokens/step = %lld seqs x T=%d = %d rank(s) x micro-batch %d x %lld accumulation step(s)\n",
           static_cast<long long>(cfg.global_batch_tokens), static_cast<long long>(G), T, W, B,
           static_cast<long long>(accum));
  if (W > 1 && !zero1) log_info("all-reduce: %zu bucket(s) of up to %.1f MiB\n", plan.buckets().size(), cfg.bucket_mb);
  if (zero1) {
    size_t owned = 0;
    for (const FlatRange& r : opt.owned()) owned += r.size();
    log_info("ZeRO-1: %zu bucket(s) of up to %.3g MiB reduce-scattered over %d rank(s); this rank updates %s of %s "
             "parameters, AdamW state %s per rank (%s unsharded)\n",
             plan.buckets().size(), cfg.bucket_mb, W, format_count(static_cast<double>(owned)).c_str(),
             format_count(static_cast<double>(model.table().total())).c_str(),
             format_bytes(2.0 * sizeof(float) * static_cast<double>(owned)).c_str(),
             format_bytes(2.0 * sizeof(float) * static_cast<double>(model.table().total())).c_str());
  }
  if (std::isfinite(kill_grace_s()))
    log_info("preemption: the launcher sends SIGKILL %.1f s after SIGTERM (%s)\n", kill_grace_s(), kill_grace_source());

  // ---- validation ------------------------------------------------------------------------------
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(static_cast<size_t>(B) * T);
  // The validation set is the first val_batches micro-batches of B windows in file order, whatever the
  // world size: micro-batch j goes to rank j % W, and the loss is the sum of per-token losses over the
  // token count, so 1, 2 or 8 ranks give the same val_loss (each micro-batch is computed alike; only
  // the order of the final double sum differs).
  RankBatch vb;  // one validation micro-batch, reused
  auto validate = [&]() -> double {
    const uint64_t avail = val->num_windows() / static_cast<uint64_t>(B);
    GPT2_CHECK(avail >= 1, "validation data smaller than a micro-batch (require_one_val_micro_batch passed it)");
    const uint64_t nb = std::min<uint64_t>(avail, static_cast<uint64_t>(std::max(1, cfg.val_batches)));
    double sum_count[2] = {0.0, 0.0};  // sum of per-token losses, tokens
    for (uint64_t i = static_cast<uint64_t>(rank); i < nb; i += static_cast<uint64_t>(W)) {
      read_val_micro_batch(*val, i, B, vb);
      vb.micro_batch(0, B, inputs.data(), targets.data());
      const double tokens = static_cast<double>(B) * T;
      sum_count[0] += static_cast<double>(runner->forward_eval(inputs.data(), targets.data(), B, T)) * tokens;
      sum_count[1] += tokens;
    }
    comm.allreduce(sum_count, 2, ReduceOp::kSum, "val loss");
    return sum_count[0] / sum_count[1];
  };
  auto run_val = [&](int64_t step) {
    const double vl = validate();
    // The same value on every rank (all-reduced): every rank stops here, before the step's checkpoint
    GPT2_REQUIRE_ON_ALL_RANKS(comm, std::isfinite(vl),
                              "the validation loss is " << vl << " at step " << step
                                                        << ": the model diverged (try a lower --lr or --grad-clip); "
                                                           "no checkpoint of this step is written");
    log_info("step %6lld | val loss %.4f\n", static_cast<long long>(step), vl);
    if (rank == 0) metrics.val(static_cast<long>(step), vl);
  };

  // A stop signal during start-up (handlers are installed before MPI_Init): nothing new to save, the
  // checkpoint this run resumed from (if any) stays the latest; stop before the first step, together.
  int early_stop = stop_signal();
  comm.allreduce(&early_stop, 1, ReduceOp::kMax, "early stop signal");
  if (early_stop != 0) {
    log_warn("received signal %d before the first step: nothing new to checkpoint (%s); exiting for requeue "
             "(status %d)\n", early_stop, resume_path.empty() ? "no checkpoint yet" : resume_path.c_str(),
             kExitPreempted);
    return kExitPreempted;
  }

  if (cfg.eval_only) {
    run_val(state.step);
    return 0;
  }

  // ---- the step loop ---------------------------------------------------------------------------
  // (The data's size was checked with the rest, before anything started: this starts the prefetch thread.)
  const std::unique_ptr<BatchSource> batches =
      cfg.benchmark ? make_synthetic_batches(B * accum, T, cfg.model.vocab_size, cfg.seed, rank, W)
                    : make_file_batches(*train, G, rank, W, state.seed, state.step, cfg.max_steps,
                                        runner->host_allocator());
  if (val && state.step == 0) run_val(0);

  const int64_t first_step = state.step;
  if (!cfg.benchmark && cfg.schedule.kind != ScheduleKind::kConstant && cfg.schedule.warmup_steps >= cfg.max_steps)
    log_warn("--warmup-steps %ld reaches --max-steps %lld: the learning rate rises for the whole run and never "
             "decays (the last step at %.3g, %.0f%% of --lr); lower --warmup-steps, or give --schedule constant\n",
             cfg.schedule.warmup_steps, static_cast<long long>(cfg.max_steps), cfg.schedule.at(cfg.max_steps - 1),
             100.0 * cfg.schedule.at(cfg.max_steps - 1) / cfg.schedule.lr);
  if (cfg.profile_step > 0 && cfg.profile_step <= first_step)
    log_warn("--profile-step %lld: this run starts after it (at step %lld), so no step is profiled\n",
             static_cast<long long>(cfg.profile_step), static_cast<long long>(first_step + 1));
  if (cfg.profile_step == first_step + 1)
    log_warn("--profile-step %lld is this run's first step: its times include what only the first step pays "
             "(allocations, cuBLASLt's choice of algorithms); profile a later one\n",
             static_cast<long long>(cfg.profile_step));
  // Steps left out of the --benchmark mean at the start: the first pays for allocations and cuBLASLt's choice of
  // algorithms; with --cuda-graph a micro-step's shape is run once eagerly (that warm-up) and captured the next
  // time it comes, which is the second step when a step is one micro-step.
  const int warmup_steps = accum == 1 && cfg.cuda_graph ? 2 : 1;
  double bench_ms_sum = 0.0, bench_exposed_sum = 0.0;
  int bench_n = 0;
  Checkpointer checkpoints(cfg, comm, *runner, model);

  // Test hook: GPT2_FAULT_INJECT=RANK:STEP kills that rank (SIGKILL, no cleanup) when it reaches that
  // step, to prove that a lost peer ends the job instead of hanging it.
  int fault_rank = -1;
  long long fault_step = -1;
  if (const char* f = std::getenv("GPT2_FAULT_INJECT")) std::sscanf(f, "%d:%lld", &fault_rank, &fault_step);
  // Test hook: GPT2_TEST_STRAGGLER=RANK:MS makes that rank MS slower each step (a slow node), so the
  // skew report can be checked.
  int straggler_rank = -1, straggler_ms = 0;
  if (const char* s = std::getenv("GPT2_TEST_STRAGGLER")) std::sscanf(s, "%d:%d", &straggler_rank, &straggler_ms);

  // Preemption (SLURM --signal=B:USR1@120 forwarded by slurm/train.sbatch, or a plain SIGTERM): the
  // signal may reach only some ranks, so after each step every rank reports whether it saw one and
  // all stop together at the same step (handlers: install_stop_handlers() in main, before MPI_Init).
  bool preempted = false;
  double kill_in_s = 0.0;  // after a stop: the least time any rank has before its launcher's SIGKILL

  for (int64_t step = state.step; step < cfg.max_steps; ++step) {
    if (rank == fault_rank && step == fault_step) std::raise(SIGKILL);
    comm.set_step(step + 1);
    Timer timer;
    const RankBatch* batch = &batches->next(step);  // valid until the next call
    if (rank == straggler_rank) std::this_thread::sleep_for(std::chrono::milliseconds(straggler_ms));
    const bool profiling = step + 1 == cfg.profile_step;
    if (profiling) runner->begin_profile();
    const StepResult r = train_step(*runner, comm, *batch, geo, cfg, step, inputs, targets);
    const double loss = r.loss, grad_norm = r.grad_norm, exposed_ms = r.exposed_ms;
    const float lr = r.lr;
    state.step = step + 1;
    state.tokens_seen += cfg.global_batch_tokens;

    StepMetrics sm;
    sm.step = static_cast<long>(state.step);
    sm.loss = loss;
    sm.lr = lr;
    sm.grad_norm = grad_norm;
    sm.ms = timer.ms();
    sm.tokens_per_s = static_cast<double>(cfg.global_batch_tokens) / (sm.ms / 1000.0);
    sm.mfu = peak_tflops > 0 ? cfg.model.flops_per_token(T) * sm.tokens_per_s / (peak_tflops * 1e12 * W) : 0.0;
    sm.comm_exposed_ms = exposed_ms;
    if (W > 1) measure_skew(comm, sm);
    if (rank == 0) metrics.step(sm);
    // The warm-up steps and the profiled one (its events) stay out of the mean.
    if (step >= first_step + warmup_steps && !profiling) {
      bench_ms_sum += sm.ms;
      bench_exposed_sum += exposed_ms;
      ++bench_n;
    }
    const bool last = state.step == cfg.max_steps;
    if (state.step % std::max(1, cfg.log_every) == 0 || step == first_step || last) {
      char skew[48] = "";
      if (W > 1) std::snprintf(skew, sizeof(skew), " | skew %.2f (rank %d)", sm.skew, sm.slowest_rank);
      log_info("step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %s tok/s | mfu %.1f%% | comm %.1f ms%s\n",
               static_cast<long long>(state.step), static_cast<long long>(cfg.max_steps), loss, lr, grad_norm, sm.ms,
               format_count(sm.tokens_per_s).c_str(), 100.0 * sm.mfu, exposed_ms, skew);
    }
    if (profiling) report_profile(runner->end_profile(), state.step, sm.ms, geo, metrics, rank);
    if (val && cfg.val_every > 0 && state.step % cfg.val_every == 0 && !last) run_val(state.step);
    checkpoints.after_step(state, last);
    int stop = stop_signal();
    if (W > 1) comm.allreduce(&stop, 1, ReduceOp::kMax, "stop signal");
    if (stop != 0 && !last) {
      kill_in_s = seconds_until_kill();
      if (W > 1) comm.allreduce(&kill_in_s, 1, ReduceOp::kMin, "seconds until kill");
      log_warn("step %6lld | received signal %d: checkpointing and exiting for requeue (status %d)\n",
               static_cast<long long>(state.step), stop, kExitPreempted);
      preempted = true;
      break;
    }
  }
  if (preempted) {
    checkpoints.on_stop(state, kill_in_s);
    return kExitPreempted;
  }
  if (val && state.step > first_step) run_val(state.step);
  checkpoints.at_end(state);

  if (cfg.benchmark && bench_n > 0) {
    const double ms = bench_ms_sum / bench_n;
    const double tps = static_cast<double>(cfg.global_batch_tokens) / (ms / 1000.0);
    const double mfu = peak_tflops > 0 ? cfg.model.flops_per_token(T) * tps / (peak_tflops * 1e12 * W) : 0.0;
    const bool profiled = cfg.profile_step > first_step + warmup_steps && cfg.profile_step <= cfg.max_steps;
    log_info(
        "benchmark: %.2f ms/step | %.0f tokens/s | mfu %.1f%% | comm_exposed %.2f ms (mean of %d steps after %s%s)\n",
        ms, tps, 100.0 * mfu, bench_exposed_sum / bench_n, bench_n,
        warmup_steps == 1 ? "the first" : "the first two: the second captured the CUDA graph",
        profiled ? ", without the profiled one" : "");
    char line[512];
    std::snprintf(line, sizeof(line),
                  "{\"benchmark\":true,\"device\":\"%s\",\"precision\":\"%s\",\"ranks\":%d,\"threads\":%d,"
                  "\"steps\":%d,\"warmup_steps\":%d,\"ms_per_step\":%.3f,"
                  "\"tokens_per_s\":%.1f,\"mfu\":%.5f,\"comm_exposed_ms\":%.3f,\"global_batch_tokens\":%lld}",
                  name_of(be.device), name_of(be.precision), W, threads, bench_n, warmup_steps, ms, tps, mfu,
                  bench_exposed_sum / bench_n, static_cast<long long>(cfg.global_batch_tokens));
    if (rank == 0) metrics.raw(line);
  }

  if (cfg.sample.max_new_tokens > 0 && rank == 0 && train && train->tokenizer() == "byte") {
    std::vector<uint32_t> p = ByteTokenizer::encode(cfg.sample_prompt.empty() ? "\n" : cfg.sample_prompt);
    std::vector<int32_t> prompt(p.begin(), p.end());
    runner->to_host();  // sampling runs on the host copy of the model
    const std::vector<int32_t> out = generate(model, prompt, cfg.sample);
    log_info("---- sample (top-k %d, temperature %.2f, seed %llu) ----\n%s%s\n----\n", cfg.sample.top_k,
             cfg.sample.temperature, static_cast<unsigned long long>(cfg.sample.seed), cfg.sample_prompt.c_str(),
             ByteTokenizer::decode(out).c_str());
  }
  return 0;
}

}  // namespace gpt2
