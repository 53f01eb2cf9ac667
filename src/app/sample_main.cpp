// gpt2-sample: text from a trained model (our HDF5 checkpoint or a Hugging Face model.safetensors),
// seeded top-k sampling with temperature, a key/value cache so each new token costs one token's forward,
// on the CPU or a GPU (--device); one sampling loop (train/sample.hpp) drives both.
#include <boost/program_options.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "app/option_errors.hpp"
#include "core/backend.hpp"
#include "core/error.hpp"
#include "data/byte_tokenizer.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "kernels/common/device.hpp"
#include "kernels/gemm/gemm.hpp"
#include "model/gpt2.hpp"
#include "train/checkpoint.hpp"
#include "train/hf_interop.hpp"
#include "train/sample.hpp"

#ifdef GPT2_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/common/cuda_check.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/gemm/gemm_cuda.hpp"
#include "model/gpt2_cuda.hpp"
#endif

namespace po = boost::program_options;
using namespace gpt2;

namespace {

const char* kUsage =
    "gpt2-sample: generate text from a trained GPT-2.\n"
    "\n"
    "  gpt2-sample --ckpt runs/quickstart/ckpt/step_00000600.h5 --prompt 'And God said' --max-new-tokens 200\n"
    "  gpt2-sample --ckpt hf/gpt2/model.safetensors --prompt 'Hello, I am' --top-k 40 --seed 7\n"
    "\n"
    "The checkpoint is one of gpt2-train's (HDF5) or a Hugging Face GPT-2 model.safetensors (n_head from the\n"
    "config.json beside it, or --n-head). The tokenizer follows the vocabulary: 256 -> byte-level, 50257 ->\n"
    "GPT-2 BPE, whose encoder.json and vocab.bpe tools/get-gpt2-vocab.sh fetches (--vocab-dir).\n"
    "Runs on a GPU when there is one (--device auto; --precision bf16|fp32, --gemm cublaslt|hand), else on\n"
    "the CPU (--threads); the prompt and the new text go to stdout, timing to stderr.\n";

// Generation on the current GPU: the host model's weights go to a GPT2Cuda, whose decode_step (device
// key/value cache, one stream synchronisation per token) feeds the shared sampling loop. *start is reset
// once the weights are on the device, so the timing covers generation only, as on the CPU.
void generate_on_gpu(GPT2& host, const std::vector<int32_t>& prompt, const SampleOptions& opt,
                     Precision precision, GemmBackend gemm, std::string* describe,
                     std::chrono::steady_clock::time_point* start, const TokenSinkFn& emit) {
#ifdef GPT2_HAVE_CUDA
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  CudaModelOptions mo;
  mo.precision = precision;
  mo.gemm = gemm;
  CudaStream stream;
  GPT2Cuda model(host.config(), mo, stream.get());
  model.set_params(host.params().data());
  *start = std::chrono::steady_clock::now();
  *describe = "cuda:" + std::to_string(device) + " " + prop.name + " | " + name_of(mo.precision) + " | gemm " +
              name_of(gemm);
  auto next_logits = [&](int32_t token, bool restart) {
    if (restart) model.reset_cache();
    return model.decode_step(token);
  };
  generate(next_logits, host.config().vocab_size, host.config().max_seq_len, prompt, opt, emit);
#else
  (void)host, (void)prompt, (void)opt, (void)precision, (void)gemm, (void)describe, (void)start, (void)emit;
  fatal("gpt2-sample was built without the CUDA backend");  // not reached: gpu_count() is 0 in such builds
#endif
}

}  // namespace

int main(int argc, char** argv) {
  install_terminate_handler();
  std::string ckpt, prompt, tokenizer = "auto", vocab_dir = Gpt2Tokenizer::default_vocab_dir();
  std::string device = "auto", precision = "bf16", gemm = "cublaslt";
  SampleOptions opt;
  int n_head = 0, threads = 0;
  po::options_description opts("Options");
  opts.add_options()("help,h", "print this help and exit")(
      "ckpt", po::value<std::string>(&ckpt)->required(),
      "checkpoint: gpt2-train's .h5 (or a run's --out directory: its latest) or a Hugging Face .safetensors")(
      "prompt", po::value<std::string>(&prompt)->default_value(""),
      "text to continue (empty: start from <|endoftext|>, or a newline for byte-level models)")(
      "max-new-tokens", po::value<int>(&opt.max_new_tokens)->default_value(200), "tokens to generate")(
      "temperature", po::value<float>(&opt.temperature)->default_value(1.0f, "1.0"), "softmax temperature (0: greedy)")(
      "top-k", po::value<int>(&opt.top_k)->default_value(40), "sample among the k most likely tokens (0: all)")(
      "seed", po::value<uint64_t>(&opt.seed)->default_value(42), "random seed (the same seed gives the same text)")(
      "tokenizer", po::value<std::string>(&tokenizer)->default_value("auto"), "auto | byte | gpt2")(
      "vocab-dir", po::value<std::string>(&vocab_dir)->default_value(vocab_dir),
      "directory with GPT-2's encoder.json and vocab.bpe (tools/get-gpt2-vocab.sh)")(
      "n-head", po::value<int>(&n_head)->default_value(0), "attention heads, for a .safetensors without config.json")(
      "threads", po::value<int>(&threads)->default_value(1),
      "CPU threads (0: all). One token's work is small: more threads pay off only for large models, and "
      "threads that share a busy core slow decoding down many times")(
      "device", po::value<std::string>(&device)->default_value("auto"),
      "cpu | cuda | auto (cuda when a GPU is visible, else cpu)")(
      "precision", po::value<std::string>(&precision)->default_value("bf16"),
      "GPU storage precision: bf16 | fp32 (the CPU is always fp32)")(
      "gemm", po::value<std::string>(&gemm)->default_value("cublaslt"), "GPU GEMM backend: cublaslt | hand");
  po::variables_map vm;
  try {
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    const po::parsed_options parsed = po::command_line_parser(argc, argv).options(opts).style(style).run();
    gpt2::reject_stray_words(parsed);
    gpt2::reject_negative_unsigned(parsed, {"seed"});
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::cout << kUsage << "\n" << opts;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "gpt2-sample: error: %s\nRun 'gpt2-sample --help' for the options.\n", gpt2::option_error_message(e).c_str());
    return 2;
  }
  for (const auto& [name, value] : {std::pair<const char*, int>{"max-new-tokens", opt.max_new_tokens},
                                    {"top-k", opt.top_k}, {"n-head", n_head}, {"threads", threads}})
    if (value < 0) {
      std::fprintf(stderr, "gpt2-sample: error: --%s must not be negative (got %d)\n", name, value);
      return 2;
    }
  if (!(std::isfinite(opt.temperature) && opt.temperature >= 0.0f)) {
    std::fprintf(stderr, "gpt2-sample: error: --temperature must be a finite number >= 0 (got %g)\n",
                 static_cast<double>(opt.temperature));
    return 2;
  }
  if (tokenizer != "auto" && tokenizer != "byte" && tokenizer != "gpt2") {
    std::fprintf(stderr, "gpt2-sample: error: --tokenizer must be auto, byte or gpt2 (got '%s')\n", tokenizer.c_str());
    return 2;
  }
  std::optional<Device> dev;
  Precision prec = Precision::kBf16;
  GemmBackend gemm_backend = GemmBackend::kCublasLt;
  if (!parse_choice(device, &dev)) {
    std::fprintf(stderr, "gpt2-sample: error: --device must be cpu, cuda or auto (got '%s')\n", device.c_str());
    return 2;
  }
  if (!parse_choice(precision, &prec)) {
    std::fprintf(stderr, "gpt2-sample: error: --precision must be bf16 or fp32 (got '%s')\n", precision.c_str());
    return 2;
  }
  if (!parse_choice(gemm, &gemm_backend)) {
    std::fprintf(stderr, "gpt2-sample: error: --gemm must be cublaslt or hand (got '%s')\n", gemm.c_str());
    return 2;
  }
  // Decided before the (possibly large) checkpoint is read: --device cuda without a GPU fails at once.
  std::string no_gpu_why;
  const bool have_gpu = dev != Device::kCpu && gpu_count(&no_gpu_why) > 0;
  if (dev == Device::kCuda && !have_gpu) {
    std::fprintf(stderr, "gpt2-sample: error: --device cuda: %s; use --device cpu (or auto)\n", no_gpu_why.c_str());
    return 1;
  }
  const bool on_gpu = dev.value_or(have_gpu ? Device::kCuda : Device::kCpu) == Device::kCuda;
  if (threads > 0) kernels::set_cpu_threads(threads);
  if (threads == 0) kernels::set_cpu_threads(static_cast<int>(std::thread::hardware_concurrency()));

  // ---- model ------------------------------------------------------------------------------------
  ckpt = resolve_checkpoint(ckpt);  // a run's --out directory: its latest checkpoint
  std::unique_ptr<GPT2> model;
  if (is_safetensors(ckpt)) {
    GPT2Config fallback;
    fallback.n_head = n_head;
    model = std::make_unique<GPT2>(read_hf_config(ckpt, fallback));
    load_hf_weights(ckpt, *model);
  } else {
    model = std::make_unique<GPT2>(read_checkpoint_config(ckpt));
    load_checkpoint(ckpt, *model, nullptr, nullptr);
  }
  const int V = model->config().vocab_size;
  if (tokenizer == "auto") tokenizer = V == ByteTokenizer::kVocabSize ? "byte" : "gpt2";

  // ---- tokens in, tokens out --------------------------------------------------------------------
  std::vector<int32_t> ids;
  std::unique_ptr<Gpt2Tokenizer> bpe;
  if (tokenizer == "byte") {
    GPT2_REQUIRE(V >= ByteTokenizer::kVocabSize, "--tokenizer byte needs a vocabulary of 256, the model has " << V);
    const std::vector<uint32_t> t = ByteTokenizer::encode(prompt.empty() ? "\n" : prompt);
    ids.assign(t.begin(), t.end());
  } else {
    GPT2_REQUIRE(V >= static_cast<int>(Gpt2Tokenizer::kVocabSize),
                 "--tokenizer gpt2 needs GPT-2's vocabulary of 50257 tokens, the model has " << V);
    bpe = std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::from_dir(vocab_dir));
    ids.push_back(static_cast<int32_t>(Gpt2Tokenizer::kEot));  // a document starts after <|endoftext|>
    for (uint32_t t : bpe->encode(prompt)) ids.push_back(static_cast<int32_t>(t));
  }
  // Each token is written as soon as it is chosen (a BPE token may end inside a UTF-8 character; the
  // next one completes it), so a long generation shows progress and holds no growing text.
  size_t generated = 0;
  auto emit = [&](int32_t t) {
    ++generated;
    const std::string piece =
        bpe ? std::string(bpe->token_bytes(static_cast<uint32_t>(t))) : ByteTokenizer::decode(std::vector<int32_t>{t});
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };

  auto start = std::chrono::steady_clock::now();
  std::string where = "cpu";
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  if (on_gpu) generate_on_gpu(*model, ids, opt, prec, gemm_backend, &where, &start, emit);
  else generate(*model, ids, opt, emit);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fputc('\n', stdout);
  std::fprintf(stderr, "gpt2-sample: %zu prompt + %zu new tokens in %.2f s (%.1f tokens/s) on %s, %s, top-k %d, "
               "temperature %.2f, seed %llu\n", ids.size(), generated, s, static_cast<double>(generated) / s,
               where.c_str(), model->config().describe().c_str(), opt.top_k, opt.temperature,
               static_cast<unsigned long long>(opt.seed));
  return 0;
}
