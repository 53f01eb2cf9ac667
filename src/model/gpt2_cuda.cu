#include "model/gpt2_cuda.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "kernels/adamw/adamw_cuda.hpp"
#include "kernels/attention/attention_cuda.hpp"
#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/common/kernel_paths.hpp"
#include "kernels/encoder/encoder_cuda.hpp"
#include "kernels/gelu/gelu_cuda.hpp"
#include "kernels/gemm/gemm_cuda.hpp"
#include "kernels/layernorm/layernorm_cuda.hpp"
#include "kernels/reduce/reduce_cuda.hpp"
#include "kernels/softmax_xent/softmax_xent_cuda.hpp"
#include "model/step_profile.hpp"

namespace gpt2 {

using kernels::GemmEpilogue;

// Activations of one micro-batch (B,T) on the device, kept for backward; the same fields as the CPU
// model's Activations except `att` (attention never materialises T x T: lse is saved instead).
// Shapes as kept with --recompute none; [sel] and [full] mark the fields that hold one layer's slot
// under selective (and full) or full recompute, refilled in backward, as in the CPU model.
template <class T>
struct DeviceActivations {
  int B = 0, T_ = 0;
  Recompute recompute = Recompute::kNone;
  // the attention backward's path the workspace was sized for (gpt2_cuda_workspace_bytes), and whether it
  // holds the qkv bias gradient's chunks after the attention's scratch (attention_bias_sums)
  kernels::AttentionBackwardPath attention_path = kernels::AttentionBackwardPath::kRecomputeDq;
  bool attention_bias_sums = false;
  DeviceBuffer<T> encoded;      // (B,T,C)
  DeviceBuffer<T> ln1;          // (L,B,T,C)   [sel]
  DeviceBuffer<float> ln1_mean, ln1_rstd;  // (L,B,T)
  DeviceBuffer<T> qkv;          // (L,B,T,3C)  [full]
  DeviceBuffer<T> atty;         // (L,B,T,C)   [full] attention output (backward reads it for rowsum(dout*out))
  DeviceBuffer<float> lse;      // (L,B,NH,T)  [full] log-sum-exp of each query row's scores
  DeviceBuffer<T> residual2;    // (L,B,T,C)   [full]
  DeviceBuffer<T> ln2;          // (L,B,T,C)   [sel]
  DeviceBuffer<float> ln2_mean, ln2_rstd;  // (L,B,T) [full]
  DeviceBuffer<T> fch;          // (L,B,T,4C)  [full] MLP pre-activation (the GELU epilogue's aux output)
  DeviceBuffer<T> fch_gelu;     // (L,B,T,4C)  [sel]
  DeviceBuffer<T> residual3;    // (L,B,T,C)   block outputs, always all of them
  DeviceBuffer<T> lnf;          // (B,T,C)
  DeviceBuffer<float> lnf_mean, lnf_rstd;  // (B,T)
  DeviceBuffer<T> logits;       // (B,T,Vp)    after a training forward: dlogits
  DeviceBuffer<float> losses;   // (B,T)
  // scratch
  DeviceBuffer<T> btc;          // (B,T,C)   forward: projections before the residual add; backward: d(LN input)
  DeviceBuffer<T> dresidual;    // (B,T,C)
  DeviceBuffer<T> dqkv;         // (B,T,3C)
  DeviceBuffer<T> dbt4c;        // (B,T,4C)
  DeviceBuffer<char> workspace; // scratch of the layernorm/bias/attention backward and the reductions
  DeviceBuffer<int32_t> inputs, targets;  // (B,T)
  DeviceBuffer<int32_t> plan;   // encoder backward plan: 3N+1 ints at most
};

// Generation state (GPT2Cuda::decode_step): the key/value cache and one token's activations, apart
// from the training activations. Allocated at the first decode_step.
template <class T>
struct DeviceDecodeState {
  DeviceBuffer<T> k, v;                    // (L,NH,maxT,hs) keys and values of positions 0..len-1
  DeviceBuffer<T> x, ln, atty, proj, res;  // (C) residual stream, layernorm output, attention output,
                                           //     projection output, residual + attention branch
  DeviceBuffer<T> qkv;                     // (3C)
  DeviceBuffer<T> fch, fch_gelu;           // (4C) MLP pre-activation and its GELU
  DeviceBuffer<T> logits;                  // (Vp)
  DeviceBuffer<float> mean, rstd;          // (1) layernorm statistics (not needed, but the launchers write them)
  DeviceBuffer<int32_t> token;             // (1)
  PinnedBuffer<int32_t> token_host;        // (1)
  PinnedBuffer<T> logits_host;             // (Vp)
  std::vector<float> logits_f32;           // (Vp) bf16 logits widened for the caller (fp32: logits_host is returned)
  int len = 0;                             // tokens in the cache; the next one goes to position len
};

class GPT2Cuda::Impl {
 public:
  virtual ~Impl() = default;
  virtual void set_params(const float* host) = 0;
  virtual void get_params(float* host) const = 0;
  virtual void set_moments(const float* m, const float* v) = 0;
  virtual void get_moments(float* m, float* v) const = 0;
  virtual std::vector<float> get_grads() const = 0;
  virtual void* grads_device() = 0;
  virtual void zero_grad() = 0;
  virtual void forward_train(const int32_t* inputs, const int32_t* targets, int B, int T, float dloss) = 0;
  virtual double take_loss_sum() = 0;
  virtual float forward_eval(const int32_t* inputs, const int32_t* targets, int B, int T) = 0;
  virtual void backward(const GradReadyFn& on_ready) = 0;
  virtual double grad_sum_squares(size_t begin, size_t end) = 0;
  virtual double param_sum_squares() = 0;
  virtual void set_optimizer_shard(const std::vector<FlatRange>& owned) = 0;
  virtual float* master_device() = 0;
  virtual void* params_device() = 0;
  virtual void adamw_step(const kernels::AdamWStep& s) = 0;
  virtual bool last_update_finite() = 0;
  virtual void set_recompute(Recompute r) = 0;
  virtual void set_param_arrivals(std::vector<GPT2Cuda::ParamArrival> arrivals) = 0;
  virtual const float* decode_step(int32_t token) = 0;
  virtual void reset_cache() = 0;
  virtual int cache_len() const = 0;
  virtual void begin_profile() = 0;
  virtual StepProfile end_profile() = 0;
  virtual void profile_mark(const char* name, const char* kind) = 0;
  virtual void profile_pause() = 0;

  Impl(const GPT2Config& cfg, const CudaModelOptions& opt, cudaStream_t s)
      : cfg_(cfg), table_(cfg), opt_(opt), stream_(s), gemm_(opt.gemm) {}
  GPT2Config cfg_;
  ParamTable table_;
  CudaModelOptions opt_;
  cudaStream_t stream_;
  kernels::GemmContext gemm_;
};

namespace {
// Where the qkv bias gradient's chunks sit in the workspace (attention_bias_sums): after the attention
// backward's scratch, 256-byte aligned, so that they outlive the attention backward until the qkv weight
// gradient adds them up.
size_t qkv_bias_chunks_offset(const GPT2Config& cfg, int B, int T_) {
  const size_t attention =
      kernels::attention_backward_scratch_bytes(B, T_, cfg.n_embd, cfg.n_head, kernels::attention_backward_path());
  return (attention + 255) / 256 * 256;
}
}  // namespace

size_t gpt2_cuda_workspace_bytes(const GPT2Config& cfg, int B, int T_) {
  const int N = B * T_, C = cfg.n_embd;
  size_t ws = kernels::layernorm_backward_scratch_bytes(N, C);
  ws = std::max(ws, kernels::weight_bias_grad_scratch_bytes(N, 4 * C));
  ws = std::max(ws, kernels::weight_bias_grad_scratch_bytes(N, 3 * C));
  // The attention backward's scratch for the path this process runs (GPT2_ATTENTION_BWD, read once): row
  // dots alone for the default recompute-dq, the fp32 dQ accumulator for accumulate-dq and wgmma, the dS
  // tiles for the store-ds paths (204 MiB at 124M, micro-batch 16). A path that falls back (wgmma where
  // it does not apply: recompute-dq; wgmma-store-ds: store-ds) needs no more than the one asked for.
  // With GPT2_ATTENTION_BIAS_SUMS=on, the qkv bias gradient's chunks after it (2.3 MiB at 124M, micro-batch 16).
  ws =
      std::max(ws, kernels::attention_backward_scratch_bytes(B, T_, C, cfg.n_head, kernels::attention_backward_path()));
  if (kernels::attention_bias_sums())
    ws = std::max(ws, qkv_bias_chunks_offset(cfg, B, T_) + kernels::attention_bias_chunks_bytes(B, T_, C));
  return ws;
}

namespace {

// --profile-step: where a step's device time goes. A timing event is recorded on the stream where each op's
// launches begin (mark), and where the host stops feeding the device (pause: the model is about to wait
// for the stream, or returns to its caller); the time from a mark to the next event is the op's, from a
// pause to the next mark the device's idle time. An op is what one call site launches (a GEMM with its
// epilogue, one kernel, a memset), named for the step's profile and summed there over the layers. Off,
// which it is but for the one step profiled, every call returns at once.
class OpClock {
 public:
  bool on() const { return on_; }
  void begin(cudaStream_t s) {
    on_ = true;
    stream_ = s;
    marks_.clear();
    recomputing_ = false;
  }
  // The launches that follow, until the next mark or pause, are op `name` (kind: the report's group);
  // flops and bytes are its work, 0 where not counted.
  void mark(const char* name, const char* kind, double flops = 0, double bytes = 0) {
    if (on_) record(name, kind, flops, bytes);
  }
  void pause() {
    if (on_ && !(marks_.empty() || marks_.back().name == nullptr)) record(nullptr, nullptr, 0, 0);
  }
  // Marks made while backward refills an activation (--recompute) are reported as "recompute: <op>".
  void set_recomputing(bool r) { recomputing_ = r; }
  // Synchronises the stream.
  StepProfile end() {
    pause();
    on_ = false;
    StepProfile p;
    if (marks_.empty()) return p;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i + 1 < marks_.size(); ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i]->get(), events_[i + 1]->get()));
      const Mark& m = marks_[i];
      if (m.name == nullptr) p.add_idle(ms);
      else p.add(m.recompute ? std::string("recompute: ") + m.name : std::string(m.name), m.kind, ms, m.flops, m.bytes);
    }
    return p;
  }

 private:
  struct Mark {
    const char* name;  // nullptr: a pause
    const char* kind;
    double flops, bytes;
    bool recompute;
  };
  void record(const char* name, const char* kind, double flops, double bytes) {
    if (events_.size() == marks_.size()) events_.push_back(std::make_unique<CudaEvent>(/*timing=*/true));
    events_[marks_.size()]->record(stream_);
    marks_.push_back({name, kind, flops, bytes, recomputing_});
  }
  bool on_ = false, recomputing_ = false;
  cudaStream_t stream_ = nullptr;
  std::vector<Mark> marks_;
  std::vector<std::unique_ptr<CudaEvent>> events_;  // marks_[i] recorded events_[i]; kept for the next profile
};

template <class T>
class ModelImpl final : public GPT2Cuda::Impl {
  // The parameter table's pointers, typed for T (the table itself hands out float pointers).
  struct BlockT {
    T *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  };
  struct ModelTensorsT {
    T *wte, *wpe, *lnfw, *lnfb;
    std::vector<BlockT> blocks;
  };

 public:
  ModelImpl(const GPT2Config& cfg, const CudaModelOptions& opt, cudaStream_t s) : Impl(cfg, opt, s) {
    const size_t n = table_.total();
    master_.resize(n);
    if constexpr (!std::is_same_v<T, float>) params_.resize(n);  // fp32: the master weights are the parameters
    grads_.resize(n);
    m_.resize(n);
    v_.resize(n);
    master_.zero(stream_);
    if constexpr (!std::is_same_v<T, float>) params_.zero(stream_);
    grads_.zero(stream_);
    m_.zero(stream_);
    v_.zero(stream_);
    set_pieces(owned_pieces(table_.segments(), {{0, n}}));
    result_.resize(1);
    nonfinite_.resize(1);
    nonfinite_.zero(stream_);
    nonfinite_host_.resize(1);
    staging_free_ = std::make_unique<CudaEvent>();
    staging_free_->record(stream_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  ~ModelImpl() override {
    for (const CapturedStep& g : graphs_) cudaGraphExecDestroy(g.exec);  // no CHECK: may run while an error unwinds
  }

  T* params() {
    if constexpr (std::is_same_v<T, float>) return master_.data();
    else return params_.data();
  }

  void set_param_arrivals(std::vector<GPT2Cuda::ParamArrival> arrivals) override { arrivals_ = std::move(arrivals); }
  // The stream waits for the parameters of [begin, end) that are still arriving (set_param_arrivals),
  // and those entries are done with.
  void wait_params(size_t begin, size_t end) {
    size_t kept = 0;
    for (const GPT2Cuda::ParamArrival& a : arrivals_) {
      if (a.range.begin < end && begin < a.range.end) {
        clock_.mark("waiting for the parameters' all-gather (ZeRO-1)", "communication");
        CUDA_CHECK(cudaStreamWaitEvent(stream_, a.ready, 0));
      } else {
        arrivals_[kept++] = a;
      }
    }
    arrivals_.resize(kept);
  }
  void wait_all_params() { wait_params(0, table_.total()); }

  void set_params(const float* host) override {
    const size_t n = table_.total();
    flush_deferred();  // a deferred forward (CUDA Graph mode) runs on the weights it was given
    wait_all_params();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(master_.data(), host, n * sizeof(float), cudaMemcpyHostToDevice));
    if constexpr (!std::is_same_v<T, float>) params_.upload(host, n);
    CUDA_CHECK(cudaDeviceSynchronize());  // pageable copies may return early; the compute stream is non-blocking
    dec_.len = 0;                         // cached keys and values came from the old weights
  }
  void get_params(float* host) const override {
    GPT2_CHECK(arrivals_.empty(), "get_params while parameters are still arriving (wait for the all-gather)");
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(host, master_.data(), master_.bytes(), cudaMemcpyDeviceToHost));
  }
  void set_moments(const float* m, const float* v) override {
    flush_deferred();  // as in set_params
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(m_.data(), m, m_.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(v_.data(), v, v_.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());  // as in set_params
  }
  void get_moments(float* m, float* v) const override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(m, m_.data(), m_.bytes(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(v, v_.data(), v_.bytes(), cudaMemcpyDeviceToHost));
  }
  std::vector<float> get_grads() const override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return grads_.download();
  }
  void* grads_device() override { return grads_.data(); }
  void zero_grad() override {
    clock_.mark("zero the gradients", "memset", 0, static_cast<double>(grads_.bytes()));
    grads_.zero(stream_);
    clock_.pause();
  }

  // ---- forward ---------------------------------------------------------------------------------
  void set_recompute(Recompute r) override {
    if (r == recompute_) return;
    flush_deferred();
    recompute_ = r;
    have_dlogits_ = false;  // the activations are laid out anew at the next forward
  }

  void ensure_activations(int B, int T_) {
    DeviceActivations<T>& a = acts_;
    const kernels::AttentionBackwardPath attention_path = kernels::attention_backward_path();
    const bool bias_sums = kernels::attention_bias_sums();
    if (a.B == B && a.T_ == T_ && a.recompute == recompute_ && a.attention_path == attention_path &&
        a.attention_bias_sums == bias_sums)
      return;
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // buffers may be in use by enqueued work
    ++layout_;  // a graph captured over the old buffers is stale
    const size_t L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, Vp = cfg_.padded_vocab_size();
    const size_t N = static_cast<size_t>(B) * T_, NC = N * C;
    const KeptLayers k = kept_layers(cfg_.n_layer, recompute_);
    a.B = B;
    a.T_ = T_;
    a.recompute = recompute_;
    a.attention_path = attention_path;  // a path set later lays the buffers out anew at the next forward
    a.attention_bias_sums = bias_sums;
    a.encoded.resize(NC);
    a.ln1.resize(k.ln * NC);
    a.ln1_mean.resize(L * N);
    a.ln1_rstd.resize(L * N);
    a.qkv.resize(k.inner * 3 * NC);
    a.atty.resize(k.inner * NC);
    a.lse.resize(k.inner * N * NH);
    a.residual2.resize(k.inner * NC);
    a.ln2.resize(k.ln * NC);
    a.ln2_mean.resize(k.inner * N);
    a.ln2_rstd.resize(k.inner * N);
    a.fch.resize(k.inner * 4 * NC);
    a.fch_gelu.resize(k.gelu * 4 * NC);
    a.residual3.resize(L * NC);
    a.lnf.resize(NC);
    a.lnf_mean.resize(N);
    a.lnf_rstd.resize(N);
    a.logits.resize(N * Vp);
    a.losses.resize(N);
    a.btc.resize(NC);
    a.dresidual.resize(NC);
    a.dqkv.resize(3 * NC);
    a.dbt4c.resize(4 * NC);
    a.inputs.resize(N);
    a.targets.resize(N);
    a.plan.resize(3 * N + 1);
    a.workspace.resize(gpt2_cuda_workspace_bytes(cfg_, B, T_));
    staging_.resize(2 * N);
    plan_staging_.resize(3 * N + 1);
  }

  // out (M,N) = a @ b (+ bias, epilogue): the one place GEMMs are issued, but for the weight gradients
  // (weight_bias_grad in backward_blocks, which fuses the bias gradient into them). `op` names it in a
  // --profile-step report.
  void matmul(const char* op, T* out, const T* a, const T* b, const T* bias, T* aux, int M, int N, int K, bool ta,
              bool tb, bool accumulate, GemmEpilogue ep) {
    clock_.mark(op, "gemm", 2.0 * M * N * K);
    kernels::gemm_cuda<T>(gemm_, out, a, b, bias, aux, M, N, K, ta, tb, accumulate, ep, stream_);
  }

  void upload_batch(const int32_t* inputs, const int32_t* targets, int B, int T_, bool with_plan) {
    GPT2_REQUIRE(T_ >= 1 && T_ <= cfg_.max_seq_len,
                 "sequence length " << T_ << " exceeds the model's max_seq_len " << cfg_.max_seq_len);
    GPT2_REQUIRE(B >= 1, "batch size must be positive");
    const int N = B * T_, V = cfg_.vocab_size;
    for (int i = 0; i < N; ++i) {
      GPT2_REQUIRE(inputs[i] >= 0 && inputs[i] < V, "token id " << inputs[i] << " out of range [0, " << V << ")");
      GPT2_REQUIRE(targets == nullptr || (targets[i] >= 0 && targets[i] < V),
                   "target token id " << targets[i] << " out of range [0, " << V << ")");
    }
    ensure_activations(B, T_);
    // The encoder backward's plan is host work: done before the copies are enqueued, not between them.
    if (with_plan) num_unique_ = kernels::encoder_backward_plan(inputs, N, &plan_host_);
    // The staging buffers are reused: wait until the previous micro-step's copies have left them.
    CUDA_CHECK(cudaEventSynchronize(staging_free_->get()));
    std::memcpy(staging_.data(), inputs, N * sizeof(int32_t));
    if (targets) std::memcpy(staging_.data() + N, targets, N * sizeof(int32_t));
    if (with_plan) {
      GPT2_CHECK(plan_host_.size() <= plan_staging_.size(), "encoder plan of " << plan_host_.size() << " ints");
      std::memcpy(plan_staging_.data(), plan_host_.data(), plan_host_.size() * sizeof(int32_t));
    }
    // (after the host's copies into the staging buffers: the op is the device's copies alone)
    clock_.mark("inputs to the device", "copy", 0,
                sizeof(int32_t) * (static_cast<double>(N) * (targets ? 2 : 1) + (with_plan ? plan_host_.size() : 0)));
    CUDA_CHECK(cudaMemcpyAsync(acts_.inputs.data(), staging_.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice,
                               stream_));
    if (targets)
      CUDA_CHECK(cudaMemcpyAsync(acts_.targets.data(), staging_.data() + N, N * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
    if (with_plan)
      CUDA_CHECK(cudaMemcpyAsync(acts_.plan.data(), plan_staging_.data(), plan_host_.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_));
    staging_free_->record(stream_);
    clock_.pause();
  }

  // The work of an op for a --profile-step report. Bytes count each tensor read or written once (what
  // the op must move at least, so GB/s compares with the copy bandwidth); attention's flops are counted
  // as FlashAttention reports them (the causal half of the 2 products, the backward 2.5x that; the
  // kernel benchmark's convention).
  static double bytes_of(double elements) { return elements * sizeof(T); }
  double attention_flops(bool backward) const {
    const double f = 2.0 * acts_.B * static_cast<double>(acts_.T_) * acts_.T_ * cfg_.n_embd;
    return backward ? 2.5 * f : f;
  }

  // Layer l's slice of an activation holding `per` elements per layer, or the one-layer slot
  // (refilled in backward) when the buffer holds a single layer: the CPU model's slot().
  template <class E>
  static E* slot(DeviceBuffer<E>& b, int l, size_t per) {
    return b.data() + (b.size() == per ? 0 : static_cast<size_t>(l) * per);
  }

  void forward(int B, int T_) {
    DeviceActivations<T>& a = acts_;
    const int L = cfg_.n_layer, C = cfg_.n_embd, Vp = cfg_.padded_vocab_size();
    const int N = B * T_;
    const size_t NC = static_cast<size_t>(N) * C;
    const ModelTensorsT p = tensors(params());
    wait_params(0, table_.block_begin(1));  // wte, wpe (the LM head's too) and block 0's ln_1 below
    clock_.mark("encoder forward", "encoder", 0, bytes_of(2.0 * NC + static_cast<double>(T_) * C) + 4.0 * N);
    kernels::encoder_forward_cuda<T>(a.encoded.data(), a.inputs.data(), p.wte, p.wpe, B, T_, C, stream_);
    clock_.mark("layernorm forward", "layernorm", 0, bytes_of(2.0 * NC) + 8.0 * N);
    kernels::layernorm_forward_cuda<T>(slot(a.ln1, 0, NC), a.ln1_mean.data(), a.ln1_rstd.data(), a.encoded.data(),
                                       p.blocks[0].ln1w, p.blocks[0].ln1b, N, C, stream_);
    for (int l = 0; l < L; ++l) {
      // Block l reads its own tensors and, in its fused residual add, the next layernorm's (block l+1's
      // ln_1, or ln_f).
      wait_params(table_.block_begin(l), l + 2 <= L ? table_.block_begin(l + 2) : table_.total());
      forward_block(p, l, /*rerun=*/false);
    }
    wait_all_params();  // nothing else should be left; whatever is, is waited for before the head
    // Tied LM head: logits (N,Vp) = lnf (N,C) @ wte^T, wte stored (Vp,C).
    matmul("gemm lm_head forward", a.logits.data(), a.lnf.data(), p.wte, nullptr, nullptr, N, Vp, C, false, true,
           false, GemmEpilogue::kNone);
  }

  // Block l's forward from its input (GPT2::forward_block). rerun: backward is recomputing it (full
  // recompute): ln_1 is re-applied from the saved statistics, and it stops after the MLP
  // up-projection, the last activation backward reads; otherwise it goes on to the residual add
  // fused with the next layernorm. Same launches on the same inputs: the same bits both times.
  void forward_block(const ModelTensorsT& p, int l, bool rerun) {
    DeviceActivations<T>& a = acts_;
    const int L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head;
    const int B = a.B, T_ = a.T_, N = B * T_;
    const size_t NC = static_cast<size_t>(N) * C;
    const BlockT& w = p.blocks[l];
    const T* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * NC;
    T* ln1 = slot(a.ln1, l, NC);
    T* qkv = slot(a.qkv, l, 3 * NC);
    T* atty = slot(a.atty, l, NC);
    float* lse = slot(a.lse, l, static_cast<size_t>(N) * NH);
    T* residual2 = slot(a.residual2, l, NC);
    T* ln2 = slot(a.ln2, l, NC);
    T* fch = slot(a.fch, l, 4 * NC);
    T* fch_gelu = slot(a.fch_gelu, l, 4 * NC);
    T* residual3 = a.residual3.data() + l * NC;

    clock_.set_recomputing(rerun);
    // ln_1 of block l was written by the previous block's fused residual add (or by forward()).
    if (rerun) {
      clock_.mark("layernorm apply", "layernorm", 0, bytes_of(2.0 * NC));
      kernels::layernorm_apply_cuda<T>(ln1, residual, a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, w.ln1w,
                                       w.ln1b, N, C, stream_);
    }
    matmul("gemm qkv forward (+bias)", qkv, ln1, w.qkvw, w.qkvb, nullptr, N, 3 * C, C, false, false, false,
           GemmEpilogue::kBias);  // -> (B,T,3C)
    clock_.mark("attention forward", "attention", attention_flops(false), bytes_of(4.0 * NC) + 4.0 * N * NH);
    kernels::attention_forward_cuda<T>(atty, lse, qkv, B, T_, C, NH, stream_);  // -> (B,T,C)
    matmul("gemm attn_proj forward (+bias)", a.btc.data(), atty, w.attprojw, w.attprojb, nullptr, N, C, C, false,
           false, false, GemmEpilogue::kBias);  // -> (B,T,C)
    clock_.mark("residual + layernorm forward", "layernorm", 0, bytes_of(4.0 * NC) + 8.0 * N);
    kernels::residual_layernorm_forward_cuda<T>(residual2, ln2, slot(a.ln2_mean, l, N), slot(a.ln2_rstd, l, N),
                                                residual, a.btc.data(), w.ln2w, w.ln2b, N, C, stream_);
    // MLP up-projection with GELU fused into the epilogue: fch keeps the pre-activation for backward.
    matmul("gemm mlp_up forward (+bias, GELU)", fch_gelu, ln2, w.fcw, w.fcb, fch, N, 4 * C, C, false, false, false,
           GemmEpilogue::kBiasGelu);
    clock_.set_recomputing(false);
    if (rerun) return;  // residual3 (block l's output) and what follows from it are kept
    matmul("gemm mlp_down forward (+bias)", a.btc.data(), fch_gelu, w.fcprojw, w.fcprojb, nullptr, N, C, 4 * C, false,
           false, false, GemmEpilogue::kBias);  // -> (B,T,C)
    // residual3 = residual2 + fcproj, fused with the next layernorm: ln_1 of block l+1, or ln_f.
    const bool last = l + 1 == L;
    clock_.mark("residual + layernorm forward", "layernorm", 0, bytes_of(4.0 * NC) + 8.0 * N);
    kernels::residual_layernorm_forward_cuda<T>(
        residual3, last ? a.lnf.data() : slot(a.ln1, l + 1, NC),
        last ? a.lnf_mean.data() : a.ln1_mean.data() + (l + 1) * N,
        last ? a.lnf_rstd.data() : a.ln1_rstd.data() + (l + 1) * N, residual2, a.btc.data(),
        last ? p.lnfw : p.blocks[l + 1].ln1w, last ? p.lnfb : p.blocks[l + 1].ln1b, N, C, stream_);
  }

  void forward_train(const int32_t* inputs, const int32_t* targets, int B, int T_, float dloss) override {
    flush_deferred();  // a forward_train not followed by backward(): it still counts, as when eager
    upload_batch(inputs, targets, B, T_, /*with_plan=*/true);
    have_dlogits_ = true;
    if (opt_.cuda_graph && arrivals_.empty()) {  // the device work waits for backward(): one graph, or eager
      deferred_ = {B, T_, dloss};
      have_deferred_ = true;
      return;
    }
    forward_with_loss(B, T_, dloss);
    queue_losses(B * T_);
    clock_.pause();
  }

  // The forward and the loss (with dlogits) of the uploaded batch.
  void forward_with_loss(int B, int T_, float dloss) {
    forward(B, T_);
    const double N = static_cast<double>(B) * T_;
    clock_.mark("softmax + cross-entropy (+dlogits)", "softmax-xent", 0,
                bytes_of(2.0 * N * cfg_.padded_vocab_size()) + 8.0 * N);
    kernels::softmax_xent_cuda<T>(acts_.losses.data(), acts_.logits.data(), acts_.targets.data(), B * T_,
                                  cfg_.vocab_size, cfg_.padded_vocab_size(), dloss, /*write_grad=*/true, stream_);
  }

  // ---- CUDA Graph of a micro-step (CudaModelOptions::cuda_graph) --------------------------------
  // What a captured graph was made for: the shape, the loss weight (a kernel argument) and the buffers.
  struct GraphKey {
    int B = 0, T_ = 0;
    float dloss = 0;
    uint64_t layout = 0;
    bool operator==(const GraphKey& o) const {
      return B == o.B && T_ == o.T_ && dloss == o.dloss && layout == o.layout;
    }
  };
  // forward_with_loss and the backward of every block (not the encoder: its launch depends on the
  // batch's token plan), as one graph launch; the first micro-step of a key runs eagerly instead.
  // Up to kMaxGraphs keys keep their graphs, so keys that alternate (two micro-batch shapes, two loss
  // weights) are captured once each, not again at every switch.
  void run_step_graph(const GraphKey& key) {
    auto device_work = [&] {
      forward_with_loss(key.B, key.T_, key.dloss);
      backward_blocks({});
    };
    drop_stale_graphs();
    auto hit = std::find_if(graphs_.begin(), graphs_.end(), [&](const CapturedStep& g) { return g.key == key; });
    if (hit == graphs_.end()) {
      if (std::find(warmed_.begin(), warmed_.end(), key) == warmed_.end()) {
        // warm-up: allocations, cuBLASLt heuristics, kernel attributes happen outside the capture
        if (warmed_.size() == kMaxGraphs) warmed_.erase(warmed_.begin());
        warmed_.push_back(key);
        device_work();
        return;
      }
      if (graphs_.size() == kMaxGraphs) {  // the least recently used goes
        CUDA_CHECK(cudaGraphExecDestroy(graphs_.front().exec));
        graphs_.erase(graphs_.begin());
      }
      graphs_.push_back({key, capture(device_work)});
      hit = graphs_.end() - 1;
    } else {
      std::rotate(hit, hit + 1, graphs_.end());  // most recently used last
      hit = graphs_.end() - 1;
    }
    CUDA_CHECK(cudaGraphLaunch(hit->exec, stream_));
  }
  // The work `enqueue` puts on the stream, as an instantiated graph. Thread-local capture mode: another
  // thread's CUDA calls (the communication threads) neither join nor invalidate the capture. If
  // `enqueue` throws, the capture is ended before the error goes on, so the stream stays usable.
  template <class F>
  cudaGraphExec_t capture(F&& enqueue) {
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      enqueue();
    } catch (...) {
      if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    GPT2_CHECK(end == cudaSuccess && graph != nullptr,
               "--cuda-graph: capturing the micro-step failed ("
                   << cudaGetErrorString(end)
                   << "): a call in the step is not allowed while a stream is captured; run without --cuda-graph");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(inst);
    return exec;
  }
  // Graphs captured over buffers that were since reallocated (ensure_activations) are never replayed.
  void drop_stale_graphs() {
    auto stale = [&](const GraphKey& k) { return k.layout != layout_; };
    for (const CapturedStep& g : graphs_)
      if (stale(g.key)) CUDA_CHECK(cudaGraphExecDestroy(g.exec));
    graphs_.erase(std::remove_if(graphs_.begin(), graphs_.end(), [&](const CapturedStep& g) { return stale(g.key); }),
                  graphs_.end());
    warmed_.erase(std::remove_if(warmed_.begin(), warmed_.end(), stale), warmed_.end());
  }

  // The per-token losses go to pinned host memory asynchronously; take_loss_sum() adds them up after
  // one synchronisation per step instead of one per micro-step.
  void queue_losses(int N) {
    if (pending_ > 0 && (pending_ == loss_slots_ || N != pending_n_)) {  // full, or another shape: fold in
      clock_.pause();
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      loss_carry_ += sum_pending(pending_n_);
      pending_ = 0;
      if (N == pending_n_) loss_slots_ *= 2;  // grows to the number of micro-steps per step
    }
    loss_host_.resize(static_cast<size_t>(loss_slots_) * N);  // only ever when nothing is pending
    clock_.mark("losses to the host", "copy", 0, 4.0 * N);
    CUDA_CHECK(cudaMemcpyAsync(loss_host_.data() + static_cast<size_t>(pending_) * N, acts_.losses.data(),
                               N * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    ++pending_;
    pending_n_ = N;
  }
  double sum_pending(int N) {
    double total = 0;
    for (int m = 0; m < pending_; ++m) {
      double s = 0;
      const float* l = loss_host_.data() + static_cast<size_t>(m) * N;
      for (int i = 0; i < N; ++i) s += l[i];
      total += s / N;
    }
    return total;
  }
  // A forward_train whose device work is still deferred (CUDA Graph mode, no backward() yet) runs now,
  // eagerly: its loss is asked for, or something else is about to use the activations.
  void flush_deferred() {
    if (!have_deferred_) return;
    have_deferred_ = false;
    forward_with_loss(deferred_.B, deferred_.T_, deferred_.dloss);
    queue_losses(deferred_.B * deferred_.T_);
    clock_.pause();
  }

  double take_loss_sum() override {
    flush_deferred();
    clock_.pause();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const double s = loss_carry_ + (pending_ ? sum_pending(pending_n_) : 0.0);
    loss_carry_ = 0;
    pending_ = 0;
    return s;
  }

  float forward_eval(const int32_t* inputs, const int32_t* targets, int B, int T_) override {
    flush_deferred();
    upload_batch(inputs, targets, B, T_, /*with_plan=*/false);
    have_dlogits_ = false;
    forward(B, T_);
    const int N = B * T_;
    kernels::softmax_xent_cuda<T>(acts_.losses.data(), acts_.logits.data(), acts_.targets.data(), N, cfg_.vocab_size,
                                  cfg_.padded_vocab_size(), 0.0f, /*write_grad=*/false, stream_);
    std::vector<float> losses(N);
    CUDA_CHECK(cudaMemcpyAsync(losses.data(), acts_.losses.data(), N * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    clock_.pause();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    double s = 0;
    for (float x : losses) s += x;
    return static_cast<float>(s / N);
  }

  // ---- backward --------------------------------------------------------------------------------
  void backward(const GradReadyFn& on_ready) override {
    GPT2_CHECK(have_dlogits_, "backward() needs a forward_train() first");
    have_dlogits_ = false;
    wait_all_params();
    if (have_deferred_) {
      have_deferred_ = false;
      const Deferred d = deferred_;
      if (on_ready || clock_.on()) {  // gradients communicated as they are ready (host callbacks), or each op
                                      // timed (--profile-step): eager
        forward_with_loss(d.B, d.T_, d.dloss);
        backward_blocks(on_ready);
      } else {
        run_step_graph({d.B, d.T_, d.dloss, layout_});
      }
      backward_encoder(on_ready);
      queue_losses(d.B * d.T_);
      clock_.pause();
      return;
    }
    backward_blocks(on_ready);
    backward_encoder(on_ready);
    clock_.pause();
  }

  // Backward from dlogits through every block: the LM head, ln_f, blocks L-1 .. 0, calling on_ready
  // as each is enqueued (GPT2::backward's order). The encoder is backward_encoder's.
  void backward_blocks(const GradReadyFn& on_ready) {
    DeviceActivations<T>& a = acts_;
    const int L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, Vp = cfg_.padded_vocab_size();
    const int B = a.B, T_ = a.T_, N = B * T_;
    const size_t NC = static_cast<size_t>(N) * C;
    const ModelTensorsT p = tensors(params());
    const ModelTensorsT g = tensors(grads_.data());
    void* ws = a.workspace.data();
    // attention_backward_cuda takes no size: the path it runs must be the one the workspace was sized for
    GPT2_CHECK(
        kernels::attention_backward_path() == a.attention_path &&
            kernels::attention_bias_sums() == a.attention_bias_sums,
        "the attention backward's path (or GPT2_ATTENTION_BIAS_SUMS) changed between the forward and the backward "
        "of a step");
    // the qkv bias gradient's chunks, where the attention backward sums them (attention_bias_sums)
    float* qkv_bias_chunks =
        a.attention_bias_sums ? reinterpret_cast<float*>(static_cast<char*>(ws) + qkv_bias_chunks_offset(cfg_, B, T_))
                              : nullptr;
    auto ready = [&](size_t from) {
      if (!on_ready) return;
      clock_.mark("gradient buckets handed to the reducer", "communication");
      on_ready(from);
    };
    // dw (IC,OC) += inp^T @ dout and dbias (OC) += column sums of dout, in one pass where the GEMM can
    // (weight_bias_grad_cuda)
    auto weight_bias_grad = [&](const char* op, T* dw, T* dbias, const T* inp, const T* dout, int IC, int OC) {
      clock_.mark(op, "gemm", 2.0 * N * IC * OC);
      kernels::weight_bias_grad_cuda<T>(gemm_, dw, dbias, ws, inp, dout, N, IC, OC, stream_);
    };
    // dinp (N,C) += layernorm backward; dweight, dbias (C) +=
    auto layernorm_backward = [&](T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                                  const float* mean, const float* rstd) {
      clock_.mark("layernorm backward", "layernorm", 0, bytes_of(4.0 * NC) + 8.0 * N);
      kernels::layernorm_backward_cuda<T>(dinp, dweight, dbias, ws, dout, inp, weight, mean, rstd, N, C, stream_);
    };

    // LM head (tied): dwte gets its first contribution here; its last comes from the encoder below.
    matmul("gemm lm_head dinp", a.btc.data(), a.logits.data(), p.wte, nullptr, nullptr, N, C, Vp, false, false, false,
           GemmEpilogue::kNone);  // dlnf (N,C) = dlogits (N,Vp) @ wte (Vp,C)
    matmul("gemm lm_head dw", g.wte, a.logits.data(), a.lnf.data(), nullptr, nullptr, Vp, C, N, true, false, true,
           GemmEpilogue::kNone);  // dwte (Vp,C) += dlogits^T @ lnf
    clock_.mark("zero dresidual", "memset", 0, bytes_of(static_cast<double>(NC)));
    a.dresidual.zero(stream_);
    layernorm_backward(a.dresidual.data(), g.lnfw, g.lnfb, a.btc.data(), a.residual3.data() + (L - 1) * NC, p.lnfw,
                       a.lnf_mean.data(), a.lnf_rstd.data());
    ready(table_.block_begin(L));

    for (int l = L - 1; l >= 0; --l) {
      const BlockT& w = p.blocks[l];
      const BlockT& dw = g.blocks[l];
      const T* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * NC;
      T* ln1 = slot(a.ln1, l, NC);
      const T* qkv = slot(a.qkv, l, 3 * NC);
      const T* atty = slot(a.atty, l, NC);
      const float* lse = slot(a.lse, l, static_cast<size_t>(N) * NH);
      const T* residual2 = slot(a.residual2, l, NC);
      T* ln2 = slot(a.ln2, l, NC);
      const float* ln2_mean = slot(a.ln2_mean, l, N);
      const float* ln2_rstd = slot(a.ln2_rstd, l, N);
      T* fch = slot(a.fch, l, 4 * NC);
      T* fch_gelu = slot(a.fch_gelu, l, 4 * NC);
      // Refill what the forward dropped, with the forward's kernels, so the gradients do not change
      // (selective under cuBLASLt in bf16 excepted: its fused GELU epilogue rounds differently from
      // the GELU kernel that recomputes it; see --recompute in the README).
      if (a.recompute == Recompute::kFull) {
        forward_block(p, l, /*rerun=*/true);  // ln1 .. fch_gelu of block l from its input
      } else if (a.recompute == Recompute::kSelective) {
        clock_.set_recomputing(true);
        clock_.mark("layernorm apply", "layernorm", 0, bytes_of(2.0 * NC));
        kernels::layernorm_apply_cuda<T>(ln2, residual2, ln2_mean, ln2_rstd, w.ln2w, w.ln2b, N, C, stream_);
        clock_.mark("layernorm apply", "layernorm", 0, bytes_of(2.0 * NC));
        kernels::layernorm_apply_cuda<T>(ln1, residual, a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, w.ln1w,
                                         w.ln1b, N, C, stream_);
        clock_.mark("gelu forward", "gelu", 0, bytes_of(8.0 * NC));
        kernels::gelu_forward_cuda<T>(fch_gelu, fch, 4 * static_cast<long>(NC), stream_);
        clock_.set_recomputing(false);
      }
      T* dres = a.dresidual.data();
      // dresidual holds d(residual3[l]); the identity paths add into it via layernorm_backward's +=.
      // MLP down-projection: d(fch) = (dresidual @ fcprojw^T) * gelu'(fch), GELU backward fused.
      // Where cuBLASLt can (gemm_dgelu_bias_grad_cuda), the same product also sums MLP up's bias gradient.
      clock_.mark("gemm mlp_down dinp (+GELU backward)", "gemm", 2.0 * N * 4 * C * C);
      const bool fc_bias_done = kernels::gemm_dgelu_bias_grad_cuda<T>(
          gemm_, a.dbt4c.data(), dw.fcb, ws, dres, w.fcprojw, fch, N, 4 * C, C, false, true, stream_);
      weight_bias_grad("gemm mlp_down dw (+dbias)", dw.fcprojw, dw.fcprojb, fch_gelu, dres, 4 * C, C);
      // MLP up-projection
      matmul("gemm mlp_up dinp", a.btc.data(), a.dbt4c.data(), w.fcw, nullptr, nullptr, N, C, 4 * C, false, true,
             false, GemmEpilogue::kNone);
      if (fc_bias_done)
        matmul("gemm mlp_up dw", dw.fcw, ln2, a.dbt4c.data(), nullptr, nullptr, C, 4 * C, N, true, false, true,
               GemmEpilogue::kNone);  // dfcw (C,4C) += ln2^T @ d(fch)
      else
        weight_bias_grad("gemm mlp_up dw (+dbias)", dw.fcw, dw.fcb, ln2, a.dbt4c.data(), C, 4 * C);
      layernorm_backward(dres, dw.ln2w, dw.ln2b, a.btc.data(), residual2, w.ln2w, ln2_mean, ln2_rstd);
      // dresidual now holds d(residual2[l]). Attention projection:
      matmul("gemm attn_proj dinp", a.btc.data(), dres, w.attprojw, nullptr, nullptr, N, C, C, false, true, false,
             GemmEpilogue::kNone);
      weight_bias_grad("gemm attn_proj dw (+dbias)", dw.attprojw, dw.attprojb, atty, dres, C, C);
      clock_.mark("attention backward", "attention", attention_flops(true),
                  bytes_of(8.0 * NC) + 4.0 * N * NH);
      const int chunk_rows = kernels::attention_backward_cuda<T>(a.dqkv.data(), ws, a.btc.data(), qkv, atty, lse, B, T_,
                                                                 C, NH, stream_, qkv_bias_chunks);
      // QKV projection
      matmul("gemm qkv dinp", a.btc.data(), a.dqkv.data(), w.qkvw, nullptr, nullptr, N, C, 3 * C, false, true, false,
             GemmEpilogue::kNone);
      if (chunk_rows > 0) {
        // the attention backward summed dqkv's columns a 64-row tile at a time: add its chunks up
        matmul("gemm qkv dw", dw.qkvw, ln1, a.dqkv.data(), nullptr, nullptr, C, 3 * C, N, true, false, true,
               GemmEpilogue::kNone);  // dqkvw (C,3C) += ln1^T @ dqkv
        clock_.mark("qkv bias gradient (the attention's column sums)", "bias", 0,
                    static_cast<double>(chunk_rows) * 3 * C * sizeof(float) + bytes_of(2.0 * 3 * C));
        kernels::record_kernel_path("bias gradient", "attention column sums");
        kernels::column_sums_add_cuda<T>(dw.qkvb, nullptr, 3 * C, qkv_bias_chunks, chunk_rows, 3 * C, stream_);
      } else {
        weight_bias_grad("gemm qkv dw (+dbias)", dw.qkvw, dw.qkvb, ln1, a.dqkv.data(), C, 3 * C);
      }
      layernorm_backward(dres, dw.ln1w, dw.ln1b, a.btc.data(), residual, w.ln1w, a.ln1_mean.data() + l * N,
                         a.ln1_rstd.data() + l * N);
      // dresidual now holds d(residual entering block l)
      ready(table_.block_begin(l));
    }
  }

  void backward_encoder(const GradReadyFn& on_ready) {
    const ModelTensorsT g = tensors(grads_.data());
    const double NC = static_cast<double>(acts_.B) * acts_.T_ * cfg_.n_embd;
    // dresidual read once; the rows of dwte it touches and dwpe's first T rows read and written
    clock_.mark("encoder backward", "encoder", 0,
                bytes_of(NC + 2.0 * (num_unique_ + static_cast<double>(acts_.T_)) * cfg_.n_embd));
    kernels::encoder_backward_cuda<T>(g.wte, g.wpe, acts_.dresidual.data(), acts_.plan.data(), num_unique_, acts_.B,
                                      acts_.T_, cfg_.n_embd, stream_);
    if (!on_ready) return;
    clock_.mark("gradient buckets handed to the reducer", "communication");
    on_ready(0);  // wte (tied) is final only now, so the bucket holding it is always the last one
  }

  // ---- generation --------------------------------------------------------------------------------
  void ensure_decode_state() {
    DeviceDecodeState<T>& d = dec_;
    const size_t L = cfg_.n_layer, C = cfg_.n_embd, maxT = cfg_.max_seq_len, Vp = cfg_.padded_vocab_size();
    if (d.k.size() == L * maxT * C) return;  // (L,NH,maxT,hs): L * maxT * C elements; allocated already
    d.k.resize(L * maxT * C);
    d.v.resize(L * maxT * C);
    for (DeviceBuffer<T>* b : {&d.x, &d.ln, &d.atty, &d.proj, &d.res}) b->resize(C);
    d.qkv.resize(3 * C);
    d.fch.resize(4 * C);
    d.fch_gelu.resize(4 * C);
    d.logits.resize(Vp);
    d.mean.resize(1);
    d.rstd.resize(1);
    d.token.resize(1);
    d.token_host.resize(1);
    d.logits_host.resize(Vp);
    d.logits_f32.assign(Vp, 0.0f);
    d.len = 0;
  }

  // GPT2::decode_step with the launchers of forward() at one row (N = 1, B = T = 1).
  const float* decode_step(int32_t token) override {
    const int L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, hs = C / NH, V = cfg_.vocab_size;
    const int maxT = cfg_.max_seq_len, Vp = cfg_.padded_vocab_size();
    ensure_decode_state();
    wait_all_params();
    DeviceDecodeState<T>& d = dec_;
    const int pos = d.len;
    GPT2_REQUIRE(pos < maxT, "the key/value cache is full (" << maxT << " tokens)");
    GPT2_REQUIRE(token >= 0 && token < V, "token id " << token << " out of range [0, " << V << ")");
    const size_t per_layer = static_cast<size_t>(NH) * maxT * hs;
    const ModelTensorsT p = tensors(params());

    // The previous call ended with a stream synchronisation, so the pinned token slot is free.
    d.token_host.data()[0] = token;
    CUDA_CHECK(cudaMemcpyAsync(d.token.data(), d.token_host.data(), sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    // x = wte[token] + wpe[pos]: the encoder adds wpe row t for t < T, so at T = 1 it gets wpe from row pos.
    kernels::encoder_forward_cuda<T>(d.x.data(), d.token.data(), p.wte, p.wpe + static_cast<size_t>(pos) * C, 1, 1, C,
                                     stream_);
    kernels::layernorm_forward_cuda<T>(d.ln.data(), d.mean.data(), d.rstd.data(), d.x.data(), p.blocks[0].ln1w,
                                       p.blocks[0].ln1b, 1, C, stream_);
    for (int l = 0; l < L; ++l) {
      const BlockT& w = p.blocks[l];
      T* kc = d.k.data() + l * per_layer;
      T* vc = d.v.data() + l * per_layer;
      matmul("decode gemm qkv", d.qkv.data(), d.ln.data(), w.qkvw, w.qkvb, nullptr, 1, 3 * C, C, false, false, false,
             GemmEpilogue::kBias);  // (C) -> (3C) = [q | k | v]
      // This token's k and v into row pos of every head: NH rows of hs elements, (NH,hs) -> (NH,maxT,hs).
      const size_t row = static_cast<size_t>(hs) * sizeof(T), head_pitch = static_cast<size_t>(maxT) * row;
      CUDA_CHECK(cudaMemcpy2DAsync(kc + static_cast<size_t>(pos) * hs, head_pitch, d.qkv.data() + C, row, row, NH,
                                   cudaMemcpyDeviceToDevice, stream_));
      CUDA_CHECK(cudaMemcpy2DAsync(vc + static_cast<size_t>(pos) * hs, head_pitch, d.qkv.data() + 2 * C, row, row, NH,
                                   cudaMemcpyDeviceToDevice, stream_));
      kernels::attention_decode_cuda<T>(d.atty.data(), d.qkv.data(), kc, vc, pos + 1, maxT, C, NH, stream_);  // -> (C)
      matmul("decode gemm attn_proj", d.proj.data(), d.atty.data(), w.attprojw, w.attprojb, nullptr, 1, C, C, false,
             false, false, GemmEpilogue::kBias);  // (C) -> (C)
      kernels::residual_layernorm_forward_cuda<T>(d.res.data(), d.ln.data(), d.mean.data(), d.rstd.data(), d.x.data(),
                                                  d.proj.data(), w.ln2w, w.ln2b, 1, C, stream_);
      matmul("decode gemm mlp_up", d.fch_gelu.data(), d.ln.data(), w.fcw, w.fcb, d.fch.data(), 1, 4 * C, C, false,
             false, false, GemmEpilogue::kBiasGelu);  // (C) -> (4C)
      matmul("decode gemm mlp_down", d.proj.data(), d.fch_gelu.data(), w.fcprojw, w.fcprojb, nullptr, 1, C, 4 * C,
             false, false, false, GemmEpilogue::kBias);  // (4C) -> (C)
      // x = res + proj, fused with the next layernorm: ln_1 of block l+1, or ln_f.
      const bool last = l + 1 == L;
      kernels::residual_layernorm_forward_cuda<T>(d.x.data(), d.ln.data(), d.mean.data(), d.rstd.data(), d.res.data(),
                                                  d.proj.data(), last ? p.lnfw : p.blocks[l + 1].ln1w,
                                                  last ? p.lnfb : p.blocks[l + 1].ln1b, 1, C, stream_);
    }
    // Tied LM head: logits (Vp) = lnf (C) @ wte^T.
    matmul("decode gemm lm_head", d.logits.data(), d.ln.data(), p.wte, nullptr, nullptr, 1, Vp, C, false, true, false,
           GemmEpilogue::kNone);
    CUDA_CHECK(cudaMemcpyAsync(d.logits_host.data(), d.logits.data(), static_cast<size_t>(Vp) * sizeof(T),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    d.len = pos + 1;
    if constexpr (std::is_same_v<T, float>) {
      return d.logits_host.data();
    } else {
      for (int j = 0; j < Vp; ++j) d.logits_f32[j] = to_float_host(d.logits_host.data()[j]);
      return d.logits_f32.data();
    }
  }
  void reset_cache() override { dec_.len = 0; }
  int cache_len() const override { return dec_.len; }

  // ---- optimizer and norms ---------------------------------------------------------------------
  double grad_sum_squares(size_t begin, size_t end) override {
    return sum_squares("gradient norm", grads_.data() + begin, end - begin);
  }
  double param_sum_squares() override { return sum_squares("parameter norm", master_.data(), master_.size()); }
  void set_optimizer_shard(const std::vector<FlatRange>& owned) override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    set_pieces(owned_pieces(table_.segments(), owned));
    m_.resize(total_size(owned));
    v_.resize(total_size(owned));
    m_.zero(stream_);
    v_.zero(stream_);
  }
  float* master_device() override { return master_.data(); }
  void* params_device() override { return params(); }
  template <class E>
  double sum_squares(const char* op, const E* x, size_t n) {
    scratch_.resize(std::max(scratch_.size(), kernels::sum_squares_scratch_bytes(static_cast<long>(n))));
    clock_.mark(op, "norm", 0, static_cast<double>(n) * sizeof(E));
    kernels::sum_squares_cuda<E>(result_.data(), scratch_.data(), x, static_cast<long>(n), stream_);
    double r = 0;
    CUDA_CHECK(cudaMemcpyAsync(&r, result_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
    clock_.pause();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return r;
  }

  // What adamw_step updates, as the chunk table of one multi-tensor launch (uploaded once here, not
  // every step). Synchronous.
  void set_pieces(const std::vector<OwnedPiece>& pieces) {
    const std::vector<kernels::AdamWChunk> chunks = kernels::adamw_chunks(pieces);
    chunks_.resize(chunks.size());
    if (!chunks.empty())
      CUDA_CHECK(cudaMemcpy(chunks_.data(), chunks.data(), chunks.size() * sizeof(kernels::AdamWChunk),
                            cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());  // as in set_params: the pageable copy may land after it returns
  }

  // One launch for every owned piece of every tensor (kernels::adamw_update_multi_cuda).
  void adamw_step(const kernels::AdamWStep& step) override {
    flush_deferred();   // as in set_params
    wait_all_params();  // the update must not race the gather still writing the parameters
    // per updated parameter: the master weight, m and v read and written (fp32), the gradient read (T), and
    // in bf16 the stored parameter written (in fp32 it is the master weight)
    const double per_param = 24.0 + sizeof(T) + (std::is_same_v<T, float> ? 0.0 : sizeof(T));
    clock_.mark("adamw", "adamw", 0, static_cast<double>(m_.size()) * per_param);
    nonfinite_.zero(stream_);
    kernels::adamw_update_multi_cuda<T>(master_.data(), params(), grads_.data(), m_.data(), v_.data(), chunks_.data(),
                                        static_cast<int>(chunks_.size()), step, stream_, nonfinite_.data());
    clock_.pause();
  }
  // The flag the last adamw_step's kernel set if it made a weight non-finite: 4 bytes to the host instead of
  // a pass over every weight (param_sum_squares, the step's check until 2026-12-02: ~0.1 ms at 124M).
  bool last_update_finite() override {
    clock_.mark("the update's check (its non-finite flag)", "copy", 0, sizeof(int));
    CUDA_CHECK(cudaMemcpyAsync(nonfinite_host_.data(), nonfinite_.data(), sizeof(int), cudaMemcpyDeviceToHost,
                               stream_));
    clock_.pause();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return nonfinite_host_.data()[0] == 0;
  }

  void begin_profile() override {
    flush_deferred();  // deferred work (CUDA Graph mode) belongs to the step before
    clock_.begin(stream_);
  }
  StepProfile end_profile() override { return clock_.end(); }
  void profile_mark(const char* name, const char* kind) override { clock_.mark(name, kind); }
  void profile_pause() override { clock_.pause(); }

 private:
  ModelTensorsT tensors(T* base) const {
    // The table's order is fixed (model/params.cpp): wte, wpe, 12 tensors per block, ln_f.weight, ln_f.bias.
    const std::vector<ParamInfo>& info = table_.params();
    auto at = [&](size_t i) { return base + info[i].offset; };
    const size_t L = static_cast<size_t>(cfg_.n_layer);
    GPT2_CHECK(info.size() == 4 + 12 * L, "parameter table of " << info.size() << " tensors");
    ModelTensorsT t;
    t.wte = at(0);
    t.wpe = at(1);
    for (size_t l = 0; l < L; ++l) {
      const size_t i = 2 + 12 * l;
      t.blocks.push_back({at(i), at(i + 1), at(i + 2), at(i + 3), at(i + 4), at(i + 5), at(i + 6), at(i + 7), at(i + 8),
                          at(i + 9), at(i + 10), at(i + 11)});
    }
    t.lnfw = at(2 + 12 * L);
    t.lnfb = at(3 + 12 * L);
    return t;
  }

  DeviceBuffer<float> master_;  // (total) fp32 master weights
  DeviceBuffer<T> params_;      // (total) the weights the kernels read (unused for fp32: master_ is used)
  DeviceBuffer<T> grads_;       // (total)
  DeviceBuffer<float> m_, v_;   // AdamW moments of the owned runs (all: total), concatenated
  DeviceBuffer<kernels::AdamWChunk> chunks_;  // what adamw_step updates: the owned part of each tensor
  DeviceBuffer<double> result_; // one reduction result
  DeviceBuffer<int> nonfinite_; // set by adamw_step's kernel when an updated weight is not finite
  PinnedBuffer<int> nonfinite_host_;
  DeviceBuffer<char> scratch_;  // reductions outside a step's workspace
  DeviceActivations<T> acts_;
  DeviceDecodeState<T> dec_;
  PinnedBuffer<int32_t> staging_, plan_staging_;
  std::unique_ptr<CudaEvent> staging_free_;
  std::vector<int32_t> plan_host_;
  int num_unique_ = 0;
  PinnedBuffer<float> loss_host_;
  int pending_ = 0, pending_n_ = 0, loss_slots_ = 4;
  double loss_carry_ = 0;
  bool have_dlogits_ = false;
  Recompute recompute_ = Recompute::kNone;  // what the next forward keeps (set_recompute)
  // CUDA Graph mode: forward_train's device work deferred to backward(); the graph and its key.
  struct Deferred {
    int B = 0, T_ = 0;
    float dloss = 0;
  } deferred_;
  bool have_deferred_ = false;
  uint64_t layout_ = 0;  // bumped whenever the activations are reallocated
  struct CapturedStep {
    GraphKey key;
    cudaGraphExec_t exec = nullptr;
  };
  static constexpr size_t kMaxGraphs = 4;
  std::vector<CapturedStep> graphs_;  // least recently used first
  std::vector<GraphKey> warmed_;      // keys whose eager warm-up micro-step has run
  std::vector<GPT2Cuda::ParamArrival> arrivals_;  // parameters still arriving (set_param_arrivals)
  OpClock clock_;  // --profile-step
};

}  // namespace

GPT2Cuda::GPT2Cuda(const GPT2Config& cfg, const CudaModelOptions& opt, cudaStream_t stream) {
  if (opt.precision == Precision::kBf16) impl_ = std::make_unique<ModelImpl<bf16>>(cfg, opt, stream);
  else impl_ = std::make_unique<ModelImpl<float>>(cfg, opt, stream);
}
GPT2Cuda::~GPT2Cuda() = default;

const GPT2Config& GPT2Cuda::config() const { return impl_->cfg_; }
const ParamTable& GPT2Cuda::table() const { return impl_->table_; }
Precision GPT2Cuda::precision() const { return impl_->opt_.precision; }
cudaStream_t GPT2Cuda::stream() const { return impl_->stream_; }
void GPT2Cuda::set_params(const float* host) { impl_->set_params(host); }
void GPT2Cuda::get_params(float* host) const { impl_->get_params(host); }
void GPT2Cuda::set_moments(const float* m, const float* v) { impl_->set_moments(m, v); }
void GPT2Cuda::get_moments(float* m, float* v) const { impl_->get_moments(m, v); }
std::vector<float> GPT2Cuda::get_grads() const { return impl_->get_grads(); }
void* GPT2Cuda::grads_device() { return impl_->grads_device(); }
void GPT2Cuda::zero_grad() { impl_->zero_grad(); }
void GPT2Cuda::forward_train(const int32_t* inputs, const int32_t* targets, int B, int T, float dloss) {
  impl_->forward_train(inputs, targets, B, T, dloss);
}
double GPT2Cuda::take_loss_sum() { return impl_->take_loss_sum(); }
float GPT2Cuda::forward_eval(const int32_t* inputs, const int32_t* targets, int B, int T) {
  return impl_->forward_eval(inputs, targets, B, T);
}
void GPT2Cuda::backward(const GradReadyFn& on_ready) { impl_->backward(on_ready); }
double GPT2Cuda::grad_sum_squares() { return impl_->grad_sum_squares(0, impl_->table_.total()); }
double GPT2Cuda::param_sum_squares() { return impl_->param_sum_squares(); }
double GPT2Cuda::grad_sum_squares(size_t begin, size_t end) { return impl_->grad_sum_squares(begin, end); }
void GPT2Cuda::set_optimizer_shard(const std::vector<FlatRange>& owned) { impl_->set_optimizer_shard(owned); }
float* GPT2Cuda::master_device() { return impl_->master_device(); }
void* GPT2Cuda::params_device() { return impl_->params_device(); }
void GPT2Cuda::adamw_step(const kernels::AdamWStep& s) { impl_->adamw_step(s); }
bool GPT2Cuda::last_update_finite() { return impl_->last_update_finite(); }
const float* GPT2Cuda::decode_step(int32_t token) { return impl_->decode_step(token); }
void GPT2Cuda::reset_cache() { impl_->reset_cache(); }
void GPT2Cuda::set_recompute(Recompute r) { impl_->set_recompute(r); }
void GPT2Cuda::set_param_arrivals(std::vector<ParamArrival> arrivals) {
  impl_->set_param_arrivals(std::move(arrivals));
}
int GPT2Cuda::cache_len() const { return impl_->cache_len(); }
void GPT2Cuda::begin_profile() { impl_->begin_profile(); }
StepProfile GPT2Cuda::end_profile() { return impl_->end_profile(); }
void GPT2Cuda::profile_mark(const char* name, const char* kind) { impl_->profile_mark(name, kind); }
void GPT2Cuda::profile_pause() { impl_->profile_pause(); }

}  // namespace gpt2
