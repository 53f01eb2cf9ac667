#include <string>

#include "comm/grad_reducer.hpp"
#include "core/error.hpp"
#include "kernels/reduce/reduce.hpp"
#include "train/runner.hpp"

namespace gpt2 {

namespace {

class CpuRunner final : public ModelRunner {
 public:
  CpuRunner(GPT2& model, AdamW& opt, Communicator& comm, const BucketPlan& plan, int threads)
      : model_(model), opt_(opt), reducer_(comm, plan, model.grads().data()), threads_(threads) {}

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
    reducer_.begin_step();
    model_.backward([&](size_t ready_from) { reducer_.on_grads_ready(ready_from); });
  }
  double finish_communication() override {
    if (!communicating_) return 0.0;
    communicating_ = false;
    return reducer_.finish();
  }
  float forward_eval(const int32_t* inputs, const int32_t* targets, int B, int T) override {
    return model_.forward_eval(inputs, targets, B, T);
  }
  double grad_sum_squares() override {
    return kernels::sum_squares_cpu(model_.grads().data(), static_cast<long>(model_.grads().size()));
  }
  double param_sum_squares() override {
    return kernels::sum_squares_cpu(model_.params().data(), static_cast<long>(model_.params().size()));
  }
  void optimizer_step(float lr, float grad_scale) override {
    opt_.step(model_.params().data(), model_.grads().data(), lr, grad_scale);
  }
  void to_host() override {}
  void from_host() override {}

 private:
  GPT2& model_;
  AdamW& opt_;
  GradReducer reducer_;
  int threads_;
  double loss_sum_ = 0;
  bool communicating_ = false;
};

}  // namespace

std::unique_ptr<ModelRunner> make_cpu_runner(GPT2& model, AdamW& opt, Communicator& comm, const BucketPlan& plan,
                                             int threads) {
  return std::make_unique<CpuRunner>(model, opt, comm, plan, threads);
}

#ifndef GPT2_HAVE_CUDA
std::unique_ptr<ModelRunner> make_cuda_runner(GPT2&, AdamW&, Communicator&, const BucketPlan&, const CudaRunnerOptions&) {
  fatal("--device cuda: this binary was built without the CUDA backend (GPT2_ENABLE_CUDA=OFF or no nvcc); "
        "use --device cpu");
}
#endif

}  // namespace gpt2
