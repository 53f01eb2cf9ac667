// The CUDA backend behind ModelRunner: GPT2Cuda on this rank's GPU, DeviceGradReducer for the buckets.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "comm/device_reducer.hpp"
#include "comm/nccl_communicator.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "kernels/attention/attention_cuda.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/common/kernel_paths.hpp"
#include "model/gpt2_cuda.hpp"
#include "train/memory.hpp"
#include "train/runner.hpp"
#include "train/zero.hpp"

namespace gpt2 {

namespace {

// Dense peak of the device in TFLOP/s for the precision, from its name; 0 when unknown (then MFU is
// reported only with --peak-tflops). bf16 uses the tensor cores; fp32 here is plain (non-TF32) FMA.
double known_peak_tflops(const std::string& name, Precision p) {
  struct Peak {
    const char* tag;
    double bf16, fp32;
  };
  static const Peak kPeaks[] = {{"H200", 989.0, 67.0}, {"H100 PCIe", 756.0, 51.0}, {"H100", 989.0, 67.0},
                                {"A100", 312.0, 19.5}, {"L40S", 362.0, 91.6}, {"A10", 125.0, 31.2}};
  for (const Peak& k : kPeaks)
    if (name.find(k.tag) != std::string::npos) return p == Precision::kBf16 ? k.bf16 : k.fp32;
  return 0.0;
}

// Prints this rank's device memory estimate and refuses, before GPT2Cuda allocates anything, a run the
// GPU cannot hold, with the numbers (issue 11). estimate_device_memory counts the device's own buffers:
// the weights and gradients in the run's precision, fp32 master weights (bf16 runs), fp32 Adam moments,
// one micro-batch's activations as DeviceActivations keeps them under --recompute; and the GEMM
// backend's workspace (GPT2Cuda's one GemmContext: 32 MiB for cuBLASLt, 64 MiB for the hand GEMM's
// split-K, more than a small model's own buffers). Returns the estimate, and the free memory before
// anything was allocated in *free_before.
double check_device_memory(const GPT2Config& cfg, Precision p, GemmBackend gemm, int micro_batch, int seq_len,
                           Recompute recompute, int device, int optimizer_shards, size_t* free_before) {
  MemoryEstimate d = estimate_device_memory(cfg, micro_batch, seq_len, p == Precision::kBf16, recompute,
                                            static_cast<double>(gpt2_cuda_workspace_bytes(cfg, micro_batch, seq_len)));
  d.optimizer /= optimizer_shards;  // ZeRO-1: this rank's moments only
  const double master = p == Precision::kBf16 ? d.params * 4.0 / 6.0 : 0.0, weights = d.params - master;
  const double grads = d.grads, acts = d.activations;
  const double workspace = static_cast<double>(kernels::GemmContext::workspace_bytes(gemm));
  const double need = d.total() + workspace;
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  *free_before = free_b;
  log_info("device memory per rank (estimate): weights %s + master %s + gradients %s + optimizer %s + "
           "activations %s + GEMM workspace %s = %s of %s free on cuda:%d\n",
           format_bytes(weights).c_str(), format_bytes(master).c_str(), format_bytes(grads).c_str(),
           format_bytes(d.optimizer).c_str(), format_bytes(acts).c_str(), format_bytes(workspace).c_str(),
           format_bytes(need).c_str(), format_bytes(static_cast<double>(free_b)).c_str(), device);
  GPT2_REQUIRE(need <= static_cast<double>(free_b),
               "this run needs an estimated " << format_bytes(need) << " on the GPU per rank, but cuda:" << device
                                              << " has " << format_bytes(static_cast<double>(free_b)) << " free of "
                                              << format_bytes(static_cast<double>(total_b))
                                              << ": lower --micro-batch (gradient accumulation keeps the global "
                                                 "batch) or use more GPUs");
  return need;
}

class CudaRunner final : public ModelRunner {
 public:
  CudaRunner(GPT2& host, AdamW& opt, Communicator& host_comm, const BucketPlan& plan, const CudaRunnerOptions& o)
      : host_(host), opt_(opt), host_comm_(host_comm), plan_(plan), comm_kind_(o.comm), zero1_(o.zero1) {
    device_ = select_device(o.local_rank, o.local_size, comm_kind_);
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    device_name_ = prop.name;
    CudaModelOptions mo;
    mo.precision = o.precision;
    mo.gemm = o.gemm;
    mo.cuda_graph = o.cuda_graph;
    memory_estimate_ = check_device_memory(host.config(), mo.precision, mo.gemm, o.micro_batch, o.seq_len,
                                           o.recompute, device_, o.zero1 ? o.world_size : 1, &free_before_);
    stream_ = std::make_unique<CudaStream>();
    model_ = std::make_unique<GPT2Cuda>(host.config(), mo, stream_->get());
    model_->set_recompute(o.recompute);
    // ZeRO-1: the device keeps the moments of the runs the host AdamW owns, in the same layout.
    if (zero1_) model_->set_optimizer_shard(opt.owned());
    if (o.world_size > 1) {
      if (comm_kind_ == Comm::kNccl)
        nccl_ = std::make_unique<NcclCommunicator>(host_comm, o.comm_timeout_s, stream_->get());
      reducer_ = std::make_unique<DeviceGradReducer>(nccl_ ? *nccl_ : host_comm, plan, model_->grads_device(),
                                                     mo.precision, stream_->get(),
                                                     zero1_ ? BucketMode::kReduceScatter : BucketMode::kAllReduce);
    }
    GPT2_REQUIRE(!zero1_ || o.world_size == 1 || nccl_, "--zero 1 on GPUs needs --comm nccl");
    precision_ = mo.precision;
    desc_ = "cuda:" + std::to_string(device_) + " " + device_name_ + " | " + name_of(mo.precision) + " | gemm " +
            name_of(o.gemm) +
            (o.recompute != Recompute::kNone ? std::string(" | recompute ") + recompute_name(o.recompute) : "") +
            (o.cuda_graph ? " | cuda graph" : "") +
            (o.world_size > 1 ? std::string(" | comm ") + name_of(o.comm) : "");
    peak_ = known_peak_tflops(device_name_, mo.precision);
  }

  // A run that ends right after an update (no final checkpoint, no sample) still waits for its
  // all-gathers before the communicator goes.
  ~CudaRunner() override {
    if (std::uncaught_exceptions() == 0) finish_param_gathers();
  }

  std::string describe() const override { return desc_; }
  double default_peak_tflops() const override { return peak_; }
  void zero_grad() override { model_->zero_grad(); }
  void forward_train(const int32_t* inputs, const int32_t* targets, int B, int T, float dloss) override {
    model_->forward_train(inputs, targets, B, T, dloss);  // waits on the device, layer by layer
    finish_param_gathers();  // the forward is enqueued: now the host may wait (with the timeout)
  }
  double take_loss_sum() override { return model_->take_loss_sum(); }
  void backward(bool communicate) override {
    communicating_ = communicate && reducer_;
    if (!communicating_) return model_->backward();
    reducer_->begin_step();
    model_->backward([&](size_t ready_from) { reducer_->on_grads_ready(ready_from); });
  }
  double finish_communication() override {
    if (!communicating_) return 0.0;
    communicating_ = false;
    // (--profile-step: the device's wait for the buckets still in flight, or for the host-staged ones)
    model_->profile_mark("waiting for the gradient all-reduce", "communication");
    const double exposed_ms = reducer_->finish();
    model_->profile_pause();
    return exposed_ms;
  }
  float forward_eval(const int32_t* inputs, const int32_t* targets, int B, int T) override {
    finish_param_gathers();
    return model_->forward_eval(inputs, targets, B, T);
  }
  // Under ZeRO-1 each rank sums its shard on the device and the partial sums meet on the host.
  double grad_sum_squares() override {
    if (!zero1_) return model_->grad_sum_squares();
    return sharded_sum_squares(host_comm_, plan_, [&](size_t b, size_t e) { return model_->grad_sum_squares(b, e); },
                               "gradient norm");
  }
  // The AdamW kernel's flag (GPT2Cuda::last_update_finite), not a pass over the weights. Under ZeRO-1 it
  // covers this rank's own pieces, which the all-gather in flight does not change (the check need not wait
  // for it), and the ranks' flags are all-reduced.
  bool update_is_finite() override {
    int nonfinite = model_->last_update_finite() ? 0 : 1;
    ++update_checks_;
    if (host_comm_.rank() == fault_nonfinite_.rank && update_checks_ == fault_nonfinite_.check) nonfinite = 1;
    if (zero1_ && host_comm_.size() > 1) host_comm_.allreduce(&nonfinite, 1, ReduceOp::kMax, "update check");
    return nonfinite == 0;
  }
  double local_param_sum_squares() override {
    finish_param_gathers();
    return model_->param_sum_squares();
  }
  void optimizer_step(float lr, float grad_scale) override {
    finish_param_gathers();
    release_gathered_moments();
    opt_.set_step_count(opt_.step_count() + 1);
    const AdamWConfig& c = opt_.config();
    model_->adamw_step({lr, c.beta1, c.beta2, c.eps, c.weight_decay, grad_scale, opt_.step_count()});
    report_memory_once();
    if (!zero1_ || !nccl_) return;
    // Every rank updated its pieces: all-gather them on the device, in place, without waiting. The
    // parameters the forward reads go first, bucket by bucket in the order the forward reads them, and
    // the next forward waits on the device for each just before its first layer that needs it (the
    // gather of later layers overlaps the compute of earlier ones); the master weights (fp32: a
    // checkpoint or the sampler at the end reads the whole model from any rank) follow them. For fp32
    // the parameters are the master weights: one gather.
    const bool bf16 = precision_ == Precision::kBf16;
    pending_ = gather_pieces_async(*nccl_, plan_, bf16 ? model_->params_device() : model_->master_device(),
                                   bf16 ? DType::kBf16 : DType::kF32, "updated parameters");
    std::vector<GPT2Cuda::ParamArrival> arrivals;
    for (const PendingGather& g : pending_)
      arrivals.push_back({g.range, static_cast<cudaEvent_t>(g.request->device_event())});
    model_->set_param_arrivals(std::move(arrivals));
    if (bf16)
      for (PendingGather& g : gather_pieces_async(*nccl_, plan_, model_->master_device(), DType::kF32,
                                                  "updated master weights"))
        pending_.push_back(std::move(g));
  }
  OptimizerState checkpoint_state(bool writer) override {
    finish_param_gathers();
    OptimizerState s;
    s.config = opt_.config();
    s.step = opt_.step_count();
    if (zero1_) {  // every rank's moments, gathered on the writer's host (all ranks take part)
      model_->get_moments(opt_.m().data(), opt_.v().data());
      gather_moments(host_comm_, plan_, opt_, 0, m_full_, v_full_);
      if (!writer) return s;
      model_->get_params(host_.params().data());
      s.m = m_full_.data();
      s.v = v_full_.data();
      return s;
    }
    if (!writer) return s;  // the moments come from this rank's GPU only where they are written
    to_host();
    s.m = opt_.m().data();
    s.v = opt_.v().data();
    return s;
  }
  void to_host() override {
    finish_param_gathers();
    model_->get_params(host_.params().data());
    model_->get_moments(opt_.m().data(), opt_.v().data());
  }
  void from_host() override {
    finish_param_gathers();
    model_->set_params(host_.params().data());
    model_->set_moments(opt_.m().data(), opt_.v().data());
  }
  HostAllocator host_allocator() const override { return {pinned_host_allocate, pinned_host_release}; }
  void begin_profile() override { model_->begin_profile(); }
  StepProfile end_profile() override { return model_->end_profile(); }

 private:
  // The host waits for the all-gathers of the last update (the timeout holds: a hung peer ends the job
  // here) and orders the compute stream after them; the model has nothing left to wait for.
  void finish_param_gathers() {
    if (pending_.empty()) return;
    for (PendingGather& g : pending_) g.request->wait();
    model_->set_param_arrivals({});
    pending_.clear();
  }

  // After the first step everything is allocated (activations, workspaces, cuBLASLt's, NCCL's): the
  // memory this run took, next to the estimate the run was admitted on, so a user sizing a bigger model
  // or micro-batch sees how far the estimate is off on this machine.
  void report_memory_once() {
    if (memory_reported_) return;
    memory_reported_ = true;
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double used = static_cast<double>(free_before_) - static_cast<double>(free_b);
    log_info("device memory after the first step: %s in use by this run on cuda:%d (estimate %s; the estimate "
             "leaves out communication buffers)\n",
             format_bytes(used).c_str(), device_, format_bytes(memory_estimate_).c_str());
    // What ran where an operation has several kernels: an opt-in that did not apply fell back silently.
    log_info("kernels: %s\n", kernels::kernel_paths_used().c_str());
  }

  void release_gathered_moments() {
    std::vector<float>().swap(m_full_);
    std::vector<float>().swap(v_full_);
  }

  GPT2& host_;
  AdamW& opt_;
  Communicator& host_comm_;
  const BucketPlan& plan_;
  Comm comm_kind_;
  bool zero1_;
  Precision precision_ = Precision::kBf16;
  std::vector<float> m_full_, v_full_;  // ZeRO-1 checkpoint: the gathered moments
  int device_ = 0;
  double memory_estimate_ = 0;  // bytes: check_device_memory's estimate
  size_t free_before_ = 0;      // device memory free before this run allocated anything
  bool memory_reported_ = false;
  std::string device_name_, desc_;
  double peak_ = 0;
  std::unique_ptr<CudaStream> stream_;
  std::unique_ptr<GPT2Cuda> model_;
  std::unique_ptr<Communicator> nccl_;  // --comm nccl: the device communicator (before the reducer using it)
  std::unique_ptr<DeviceGradReducer> reducer_;
  bool communicating_ = false;
  // Test hook: GPT2_FAULT_NONFINITE_UPDATE=RANK:N makes that rank's Nth update check (counted in this process)
  // report its own update non-finite, as an overflow in its ZeRO-1 shard alone would: every rank must stop at
  // that step with the same error (tests/emu/train_emu.py).
  struct FaultNonfinite {
    int rank = -1;
    long long check = -1;
  } fault_nonfinite_ = [] {
    FaultNonfinite f;
    if (const char* e = std::getenv("GPT2_FAULT_NONFINITE_UPDATE")) std::sscanf(e, "%d:%lld", &f.rank, &f.check);
    return f;
  }();
  long long update_checks_ = 0;
  // ZeRO-1 all-gathers of the last update, not yet waited for (declared last: destroyed first, before
  // the communicator they belong to).
  std::vector<PendingGather> pending_;
};

}  // namespace

std::unique_ptr<ModelRunner> make_cuda_runner(GPT2& model, AdamW& opt, Communicator& host_comm, const BucketPlan& plan,
                                              const CudaRunnerOptions& options) {
  return std::make_unique<CudaRunner>(model, opt, host_comm, plan, options);
}

}  // namespace gpt2
