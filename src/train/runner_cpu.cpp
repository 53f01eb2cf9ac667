#include <cmath>
#include <string>
#include <vector>

#include "comm/bucket_scheduler.hpp"
#include "core/error.hpp"
#include "kernels/reduce/reduce.hpp"
#include "train/runner.hpp"
#include "train/zero.hpp"

namespace gpt2 {

namespace {

class CpuRunner final : public ModelRunner {
 public:
  CpuRunner(GPT2& model, AdamW& opt, Communicator& comm, const BucketPlan& plan, int threads, bool zero1)
      : model_(model),
        opt_(opt),
        comm_(comm),
        plan_(plan),
        scheduler_(comm, plan, model.grads().data(), DType::kF32,
                   zero1 ? BucketMode::kReduceScatter : BucketMode::kAllReduce),
        zero1_(zero1),
        threads_(threads) {}

  std::string describe() const override { return "cpu, " + std::to_string(threads_) + " thread(s)"; }
  // Two 8-wide FMA pipes at ~3 GHz (AVX2) per thread: an estimate; pass --peak-tflops for your hardware.
  double default_peak_tflops() const override { return 0.096 * threads_; }

  void zero_grad() override { model_.zero_grad(); }
  void forward_train(const int32_t* inputs, const int32_t* targets, int B, int T, float dloss) override {
    loss_sum_ += model_.forward_train(inputs, targets, B, T, dloss);
  }
  double take_loss_sum() override {
    const double s = loss_sum_;
    loss_sum_ = 0;
    return s;
  }
  void backward(bool communicate) override {
    communicating_ = communicate;
    if (!communicate) return model_.backward();
    // Only the last micro-step communicates: earlier ones just accumulate into the same buffer.
    scheduler_.begin_step();
    model_.backward([&](size_t ready_from) { scheduler_.on_grads_ready(ready_from); });
  }
  double finish_communication() override {
    if (!communicating_) return 0.0;
    communicating_ = false;
    return scheduler_.finish();
  }
  float forward_eval(const int32_t* inputs, const int32_t* targets, int B, int T) override {
    return model_.forward_eval(inputs, targets, B, T);
  }
  double grad_sum_squares() override { return sum_squares(model_.grads().data(), "gradient norm"); }
  bool update_is_finite() override { return std::isfinite(sum_squares(model_.params().data(), "parameter norm")); }
  double local_param_sum_squares() override {
    return kernels::sum_squares_cpu(model_.params().data(), static_cast<long>(model_.params().size()));
  }
  void optimizer_step(float lr, float grad_scale) override {
    release_gathered_moments();
    opt_.step(model_.params().data(), model_.grads().data(), lr, grad_scale);
    if (zero1_) gather_pieces(comm_, plan_, model_.params().data(), DType::kF32, "updated parameters");
  }
  OptimizerState checkpoint_state(bool writer) override {
    OptimizerState s;
    s.config = opt_.config();
    s.step = opt_.step_count();
    if (!zero1_) {  // opt_ owns the whole buffer: its moments are the flat layout already
      s.m = opt_.m().data();
      s.v = opt_.v().data();
      return s;
    }
    // All ranks take part; only the writer (rank 0) receives, and only it needs the state.
    gather_moments(comm_, plan_, opt_, 0, m_full_, v_full_);
    if (!writer) return s;
    s.m = m_full_.data();
    s.v = v_full_.data();
    return s;
  }
  void to_host() override {}
  void from_host() override {}

 private:
  // Whole-model sum of squares: the full buffer when every rank holds it averaged, else the shards'.
  double sum_squares(const float* buf, const char* label) {
    if (!zero1_) return kernels::sum_squares_cpu(buf, static_cast<long>(plan_.total()));
    return sharded_sum_squares(
        comm_, plan_, [buf](size_t b, size_t e) { return kernels::sum_squares_cpu(buf + b, static_cast<long>(e - b)); },
        label);
  }
  void release_gathered_moments() {
    std::vector<float>().swap(m_full_);
    std::vector<float>().swap(v_full_);
  }

  GPT2& model_;
  AdamW& opt_;
  Communicator& comm_;
  const BucketPlan& plan_;
  BucketScheduler scheduler_;
  bool zero1_;
  int threads_;
  double loss_sum_ = 0;
  bool communicating_ = false;
  std::vector<float> m_full_, v_full_;  // ZeRO-1 checkpoint: the gathered moments
};

}  // namespace

std::unique_ptr<ModelRunner> make_cpu_runner(GPT2& model, AdamW& opt, Communicator& comm, const BucketPlan& plan,
                                             int threads, bool zero1) {
  return std::make_unique<CpuRunner>(model, opt, comm, plan, threads, zero1);
}

#ifndef GPT2_HAVE_CUDA
std::unique_ptr<ModelRunner> make_cuda_runner(GPT2&, AdamW&, Communicator&, const BucketPlan&, const CudaRunnerOptions&) {
  fatal("--device cuda: this binary was built without the CUDA backend (GPT2_ENABLE_CUDA=OFF or no nvcc); "
        "use --device cpu");
}
#endif

}  // namespace gpt2
