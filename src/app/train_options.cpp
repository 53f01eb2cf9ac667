#include "app/train_options.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "app/option_errors.hpp"
#include "model/config.hpp"

namespace po = boost::program_options;

namespace gpt2 {

namespace {

// Levenshtein distance, for "did you mean" on misspelled options.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The option nearest to `name` (its dashes aside) within 3 edits, or "".
std::string closest_option(const std::string& name, const po::options_description& all) {
  std::string bare = name;
  while (!bare.empty() && bare[0] == '-') bare.erase(0, 1);
  std::string best;
  size_t best_d = 4;
  for (const auto& opt : all.options()) {
    const std::string& n = opt->long_name();
    const size_t d = edit_distance(bare, n);
    if (d < best_d) {
      best_d = d;
      best = n;
    }
  }
  return best;
}

std::string suggest(const std::string& name, const po::options_description& all) {
  const std::string best = closest_option(name, all);
  return best.empty() ? "" : " (did you mean --" + best + "?)";
}

// The same for a key of a config file, where options are written without their dashes ("lr = 6e-4").
std::string suggest_in_file(const std::string& key, const po::options_description& all) {
  std::string bare = key;
  while (!bare.empty() && bare[0] == '-') bare.erase(0, 1);
  if (bare != key && all.find_nothrow(bare, /*approx=*/false) != nullptr)
    return " (a config file names options without their dashes: '" + bare + " = ...')";
  const std::string best = closest_option(bare, all);
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

const char* kUsage =
    "gpt2-train: data-parallel GPT-2 training, one MPI rank per GPU (or per CPU socket/core group).\n"
    "\n"
    "Usage:\n"
    "  gpt2-train --config configs/quickstart.ini [--option value ...]\n"
    "  mpirun -np 8 gpt2-train --config configs/gpt2-124m.ini --train-data 'data/train_*.h5' --out runs/a\n"
    "  srun --mpi=pmix gpt2-train --config ...\n"
    "  gpt2-train --model d4 --vocab-size 256 --benchmark --max-steps 20\n"
    "\n"
    "Configs are INI files of 'option = value' lines using the long option names below; --config may be\n"
    "repeated (later files override earlier ones) and the command line overrides every file.\n";

// An option's value as text, for the ranks' comparison: every type this file declares (float and double in
// their shortest form that reads back as the same number: 0.1, not 0.10000000149011612).
template <class F>
std::string shortest(F x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}
std::string value_text(const boost::any& v) {
  std::ostringstream os;
  if (const auto* x = boost::any_cast<int>(&v))
    os << *x;
  else if (const auto* x = boost::any_cast<long>(&v))
    os << *x;
  else if (const auto* x = boost::any_cast<long long>(&v))
    os << *x;
  else if (const auto* x = boost::any_cast<unsigned long>(&v))
    os << *x;
  else if (const auto* x = boost::any_cast<unsigned long long>(&v))
    os << *x;
  else if (const auto* x = boost::any_cast<float>(&v))
    os << shortest(*x);
  else if (const auto* x = boost::any_cast<double>(&v))
    os << shortest(*x);
  else if (const auto* x = boost::any_cast<bool>(&v))
    os << (*x ? "true" : "false");
  else if (const auto* x = boost::any_cast<std::string>(&v))
    os << *x;
  else if (const auto* x = boost::any_cast<std::vector<std::string>>(&v))
    for (const std::string& e : *x) os << e << '\n';
  else
    os << "(a value of type " << v.type().name() << ")";  // a new option type: add it above
  return os.str();
}

}  // namespace

ParsedArgs parse_train_args(int argc, char** argv) {
  ParsedArgs out;
  TrainConfig& c = out.config;
  std::string model_preset, schedule = "cosine", recompute = "none", verify_data = "none";
  std::string device = "auto", precision = "auto", gemm = "cublaslt", comm = "auto";  // parsed once, below
  int n_layer = 0, n_head = 0, n_embd = 0;
  std::vector<std::string> config_files;

  po::options_description general("General");
  general.add_options()
      ("help,h", "print this help and exit")
      ("config", po::value<std::vector<std::string>>(&config_files)->composing(),
       "INI file of options; repeatable, later files win")
      ("device", po::value<std::string>(&device)->default_value("auto"),
       "cpu | cuda | auto (cuda when a GPU is visible and the build has CUDA)")
      ("precision", po::value<std::string>(&precision)->default_value("auto"),
       "bf16 | fp32 | auto: storage of parameters, activations and gradients on the GPU (master weights and "
       "Adam state are fp32 either way); auto = bf16 on cuda, fp32 on cpu (the CPU backend is fp32 only)")
      ("gemm", po::value<std::string>(&gemm)->default_value("cublaslt"),
       "hand | cublaslt: the CUDA GEMM backend (hand-written tensor-core kernels, or cuBLASLt)")
      ("recompute", po::value<std::string>(&recompute)->default_value("none"),
       "none | selective | full: activations dropped in forward and recomputed in backward, trading compute "
       "for memory with the same gradients: bit-identical, except selective with --gemm cublaslt in bf16 "
       "(cuBLASLt's fused GELU rounds unlike the GELU kernel that recomputes it: within bf16 rounding). "
       "selective: the layernorm and GELU outputs; full: everything but each block's input (backward reruns "
       "each block's forward). Both backends")
      ("cuda-graph", po::bool_switch(&c.cuda_graph),
       "GPU: replay each micro-step's forward and backward as one CUDA Graph (captured at the second micro-step "
       "of a shape; the first runs eagerly) instead of ~20 launches per layer. Micro-steps that communicate "
       "gradients, and the first forward after a ZeRO-1 update, run eagerly; the bits are the same either way")
      ("zero", po::value<int>(&c.zero)->default_value(0),
       "0 | 1: ZeRO stage. 1 shards the AdamW state (fp32 moments) over the ranks: gradients are "
       "reduce-scattered in buckets during backward, each rank updates its 1/W of the parameters, and "
       "the updated parameters are all-gathered. Optimizer memory per rank / W; same results as 0. "
       "Checkpoints are the same format either way (resume across --zero levels and world sizes). On GPUs "
       "it needs --comm nccl")
      ("threads", po::value<int>(&c.threads)->default_value(0),
       "OpenMP threads per rank (0: the rank's cores, shared fairly between ranks on a node)")
      ("seed", po::value<uint64_t>(&c.seed)->default_value(1337), "seed for initialisation and data order")
      ("out", po::value<std::string>(&c.out_dir)->default_value(""),
       "output directory for metrics.jsonl and ckpt/ (empty: write nothing)");

  po::options_description model("Model");
  model.add_options()
      ("model", po::value<std::string>(&model_preset),
       ("preset: " + model_preset_names()).c_str())
      ("n-layer", po::value<int>(&n_layer), "transformer blocks (overrides the preset)")
      ("n-head", po::value<int>(&n_head), "attention heads; must divide n-embd (overrides the preset)")
      ("n-embd", po::value<int>(&n_embd), "channels (overrides the preset)")
      ("vocab-size", po::value<int>(&c.model.vocab_size)->default_value(50257),
       "vocabulary (50257 for GPT-2 BPE, 256 for byte-level); padded to a multiple of 128 internally")
      ("max-seq-len", po::value<int>(&c.model.max_seq_len)->default_value(1024), "rows of the position embedding");

  po::options_description batch("Batch");
  batch.add_options()
      ("micro-batch", po::value<int>(&c.micro_batch)->default_value(4), "sequences per rank per micro-step (B)")
      ("seq-len", po::value<int>(&c.seq_len)->default_value(64), "tokens per sequence (T) <= max-seq-len")
      ("global-batch-tokens", po::value<int64_t>(&c.global_batch_tokens)->default_value(0),
       "tokens per optimizer step over all ranks; gradient accumulation = this / (B * T * ranks). "
       "0: one micro-batch per rank");

  po::options_description optim("Optimizer and schedule");
  optim.add_options()
      ("lr", po::value<float>(&c.schedule.lr)->default_value(6e-4f, "6e-4"), "peak learning rate")
      ("warmup-steps", po::value<long>(&c.schedule.warmup_steps)->default_value(0), "linear warmup steps")
      ("min-lr-frac", po::value<float>(&c.schedule.min_lr_frac)->default_value(0.1f, "0.1"),
       "final learning rate as a fraction of --lr")
      ("schedule", po::value<std::string>(&schedule)->default_value("cosine"),
       "cosine | constant | linear | wsd (warmup-stable-decay)")
      ("decay-frac", po::value<float>(&c.schedule.decay_frac)->default_value(0.2f, "0.2"),
       "wsd: fraction of steps in the final decay")
      ("weight-decay", po::value<float>(&c.optim.weight_decay)->default_value(0.1f, "0.1"),
       "AdamW decoupled weight decay (2-D weights and embeddings only)")
      ("beta1", po::value<float>(&c.optim.beta1)->default_value(0.9f, "0.9"), "AdamW beta1")
      ("beta2", po::value<float>(&c.optim.beta2)->default_value(0.95f, "0.95"), "AdamW beta2")
      ("eps", po::value<float>(&c.optim.eps)->default_value(1e-8f, "1e-8"), "AdamW epsilon")
      ("grad-clip", po::value<float>(&c.optim.grad_clip)->default_value(1.0f, "1.0"),
       "clip the global gradient norm to this (0: off)")
      ("max-steps", po::value<int64_t>(&c.max_steps)->default_value(100), "optimizer steps to train");

  po::options_description data("Data and evaluation");
  data.add_options()
      ("train-data", po::value<std::string>(&c.train_data), "token file (HDF5) or glob of shards")
      ("val-data", po::value<std::string>(&c.val_data), "validation token file or glob")
      ("val-every", po::value<int>(&c.val_every)->default_value(0), "steps between validations (0: start and end only)")
      ("val-batches", po::value<int>(&c.val_batches)->default_value(20),
       "micro-batches of --micro-batch windows per validation, split over the ranks (the same on any world size)")
      ("eval-only", po::bool_switch(&c.eval_only), "write the validation loss of the initial model, then exit")
      ("verify-data", po::value<std::string>(&verify_data)->default_value("none")->implicit_value("shared"),
       "none | shared (the default when given alone) | local: before the first step, read every token of "
       "--train-data and --val-data and check each file's CRC-32 (the crc32 that gpt2-data writes), so that a "
       "byte changed on disk is an error naming the file, not tokens trained on silently. shared: the data is "
       "one copy on a file system every node sees, each token read once by one rank; local: each node has its "
       "own copy (node-local disks), each node's copy read in full by its ranks");

  po::options_description ckpt("Checkpoints and distribution");
  ckpt.add_options()
      ("init-from", po::value<std::string>(&c.init_from),
       "checkpoint to start from (optimizer state too, if present), or a Hugging Face GPT-2 model.safetensors "
       "(e.g. the released gpt2 weights, for fine-tuning)")
      ("ckpt-every", po::value<int>(&c.ckpt_every)->default_value(0), "steps between checkpoints (0: at the end only)")
      ("ckpt-keep", po::value<int>(&c.ckpt_keep)->default_value(0), "newest checkpoints to keep (0: all)")
      ("resume", po::value<std::string>(&c.resume)->default_value("none"),
       "none | auto (<out>/ckpt/latest if present) | PATH")
      ("bucket-mb", po::value<double>(&c.bucket_mb)->default_value(25.0), "gradient all-reduce bucket size in MiB")
      ("comm", po::value<std::string>(&comm)->default_value("auto"),
       "nccl | mpi | auto: gradient all-reduce; nccl needs one GPU per rank, mpi (host-staged) lets ranks share "
       "a GPU; auto = nccl on cuda, mpi on cpu")
      ("comm-timeout-s", po::value<double>(&c.comm_timeout_s)->default_value(600.0, "600"),
       "seconds any collective may take before the job is aborted as having lost a peer (flight records of "
       "the last collectives go to <out>/flight_rank<R>.json)");

  po::options_description logging("Logging, benchmark and sampling");
  logging.add_options()
      ("log-every", po::value<int>(&c.log_every)->default_value(1), "steps between progress lines")
      ("benchmark", po::bool_switch(&c.benchmark), "synthetic tokens, no files: measure tokens/s and ms/step")
      ("profile-step", po::value<int64_t>(&c.profile_step)->default_value(0),
       "GPU: time every op of step N on the device (CUDA events) and print where the step's time went: ms, share, "
       "TFLOP/s or GB/s per op, summed over the layers (also a line in metrics.jsonl); 0: off. The step runs eagerly "
       "under --cuda-graph and is left out of --benchmark's mean")
      ("peak-tflops", po::value<double>(&c.peak_tflops)->default_value(0.0),
       "per-rank peak for MFU (0: estimate, 0.096 per CPU thread)")
      ("sample-tokens", po::value<int>(&c.sample.max_new_tokens)->default_value(0),
       "generate this many tokens at the end (byte-level data)")
      ("sample-prompt", po::value<std::string>(&c.sample_prompt)->default_value("\n", "newline"), "prompt for the sample")
      ("sample-top-k", po::value<int>(&c.sample.top_k)->default_value(40), "top-k for the sample (0: all)")
      ("sample-temperature", po::value<float>(&c.sample.temperature)->default_value(1.0f, "1.0"),
       "temperature for the sample (0: greedy)")
      ("sample-seed", po::value<uint64_t>(&c.sample.seed)->default_value(42), "seed for the sample");

  po::options_description all;
  all.add(general).add(model).add(batch).add(optim).add(data).add(ckpt).add(logging);

  po::variables_map vm;
  std::set<std::string> on_cmdline;  // the options the command line gave (it overrides every file)
  try {
    // No prefix guessing: a misspelled option is an error, never silently another option.
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::parsed_options cmdline = po::command_line_parser(argc, argv).options(all).style(style).run();
    reject_stray_words(cmdline, "; a config file goes after --config");
    reject_negative_unsigned(cmdline, {"seed", "sample-seed"});
    // Repeating an option on the command line: the last one wins, as in most tools (--config composes).
    auto& opts = cmdline.options;
    for (size_t i = 0; i < opts.size(); ++i) {
      if (opts[i].string_key == "config") continue;
      for (size_t j = i + 1; j < opts.size(); ++j)
        if (opts[j].string_key == opts[i].string_key) {
          opts.erase(opts.begin() + static_cast<long>(i));
          --i;
          break;
        }
    }
    po::store(cmdline, vm);
    for (const auto& o : cmdline.options) on_cmdline.insert(o.string_key);
    if (vm.count("help")) {
      std::ostringstream os;
      os << kUsage << "\n" << all;
      out.outcome = ParsedArgs::Outcome::kHelp;
      out.message = os.str();
      return out;
    }
    // po::store keeps the first value it sees: the command line, then the files from last to first.
    if (vm.count("config")) {
      const auto files = vm["config"].as<std::vector<std::string>>();
      for (auto it = files.rbegin(); it != files.rend(); ++it) {
        // A directory opens as a stream that reads nothing: it would silently be an empty config.
        std::error_code ec;
        if (std::filesystem::is_directory(*it, ec)) throw po::error("config file '" + *it + "' is a directory");
        std::ifstream is(*it);
        if (!is.good()) throw po::error("cannot read config file '" + *it + "'");
        try {
          po::parsed_options parsed = po::parse_config_file(is, all, /*allow_unregistered=*/false);
          reject_negative_unsigned(parsed, {"seed", "sample-seed"});
          for (const auto& o : parsed.options)
            if (o.string_key == "config" || o.string_key == "help")
              throw po::error("'" + o.string_key + "' is not allowed inside a config file (give --" + o.string_key +
                              " on the command line)");
          po::store(parsed, vm);
        } catch (const po::unknown_option& e) {
          throw po::error("in config file '" + *it + "': unknown option '" + e.get_option_name() + "'" +
                          suggest_in_file(e.get_option_name(), all));
        } catch (const po::error& e) {
          throw po::error("in config file '" + *it + "': " + option_error_message(e));
        }
      }
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    out.outcome = ParsedArgs::Outcome::kError;
    out.message = "unknown option '" + e.get_option_name() + "'" + suggest(e.get_option_name(), all);
    return out;
  } catch (const po::error& e) {
    out.outcome = ParsedArgs::Outcome::kError;
    out.message = option_error_message(e);
    return out;
  }

  // Left out of the ranks' comparison: what may differ from node to node. Paths (a node-local copy of the data
  // or of a checkpoint; the trainer compares the data files' contents across ranks, and the models they build),
  // and --threads (cores per node; the results do not depend on it).
  static const char* const kPerNode[] = {"help",     "config",    "out",    "train-data",
                                         "val-data", "init-from", "resume", "threads"};
  for (const auto& d : all.options()) {
    const std::string& name = d->long_name();
    if (std::find(std::begin(kPerNode), std::end(kPerNode), name) != std::end(kPerNode)) continue;
    out.option_values.push_back("--" + name + (vm.count(name) ? " " + value_text(vm[name].value()) : ""));
  }

  auto error = [&](const std::string& m) {
    out.outcome = ParsedArgs::Outcome::kError;
    out.message = m;
    return out;
  };
  if (!model_preset.empty() && !apply_model_preset(model_preset, &c.model))
    return error("unknown --model '" + model_preset + "'; presets: " + model_preset_names());
  // --n-layer/--n-head/--n-embd refine a preset given beside them or in a file, but a --model on the command
  // line overrides the shape a config file gives, as the command line overrides every file.
  const bool preset_on_cmdline = on_cmdline.count("model") > 0;
  auto refines = [&](const char* key) { return vm.count(key) > 0 && (!preset_on_cmdline || on_cmdline.count(key) > 0); };
  if (refines("n-layer")) c.model.n_layer = n_layer;
  if (refines("n-head")) c.model.n_head = n_head;
  if (refines("n-embd")) c.model.n_embd = n_embd;
  if (c.model.n_layer == 0 && c.model.n_head == 0 && c.model.n_embd == 0) {
    // As from_pretrained: with --init-from (or a resume) the checkpoint gives the architecture;
    // the trainer reads it (an explicit --vocab-size / --max-seq-len must then match it).
    if (c.init_from.empty() && c.resume == "none")
      return error("no model given: use --model PRESET, or --n-layer, --n-head and --n-embd, or --init-from "
                   "CHECKPOINT");
    c.model_from_checkpoint = true;
    if (vm["vocab-size"].defaulted()) c.model.vocab_size = 0;
    if (vm["max-seq-len"].defaulted()) c.model.max_seq_len = 0;
  } else {
    const std::string merr = c.model.validate();
    if (!merr.empty()) return error("invalid model: " + merr);
    if (c.seq_len > c.model.max_seq_len)
      return error("--seq-len " + std::to_string(c.seq_len) + " exceeds --max-seq-len " + std::to_string(c.model.max_seq_len));
  }
  if (c.micro_batch <= 0) return error("--micro-batch must be positive");
  if (c.seq_len <= 0) return error("--seq-len must be positive");
  if (c.global_batch_tokens < 0) return error("--global-batch-tokens must not be negative");
  if (c.max_steps < 0) return error("--max-steps must not be negative");
  if (!parse_choice(device, &c.device)) return error("--device must be cpu, cuda or auto (got '" + device + "')");
  if (!parse_choice(precision, &c.precision))
    return error("--precision must be bf16, fp32 or auto (got '" + precision + "')");
  if (verify_data == "none") c.verify_data = DataVerify::kNone;
  else if (verify_data == "shared") c.verify_data = DataVerify::kShared;
  else if (verify_data == "local") c.verify_data = DataVerify::kLocal;
  else return error("--verify-data must be none, shared or local (got '" + verify_data + "')");
  if (recompute == "none") c.recompute = Recompute::kNone;
  else if (recompute == "selective") c.recompute = Recompute::kSelective;
  else if (recompute == "full") c.recompute = Recompute::kFull;
  else return error("--recompute must be none, selective or full (got '" + recompute + "')");
  if (c.zero != 0 && c.zero != 1) return error("--zero must be 0 or 1 (got " + std::to_string(c.zero) + ")");
  if (!parse_choice(gemm, &c.gemm)) return error("--gemm must be hand or cublaslt (got '" + gemm + "')");
  if (!parse_choice(comm, &c.comm)) return error("--comm must be nccl, mpi or auto (got '" + comm + "')");
  if (!(std::isfinite(c.comm_timeout_s) && c.comm_timeout_s > 0)) return error("--comm-timeout-s must be a finite number > 0");
  if (!parse_schedule_kind(schedule, &c.schedule.kind))
    return error("--schedule must be cosine, constant, linear or wsd (got '" + schedule + "')");
  // Each float option must be finite and in its range; NaN fails every comparison, so each test is
  // written as "inside", never as "not outside".
  struct FloatRange {
    const char* name;
    double value, lo, hi;
    bool lo_open, hi_open;
  };
  const double inf = INFINITY;
  const FloatRange floats[] = {
      {"lr", c.schedule.lr, 0, inf, true, true},
      {"min-lr-frac", c.schedule.min_lr_frac, 0, 1, false, false},
      {"decay-frac", c.schedule.decay_frac, 0, 1, false, false},
      {"beta1", c.optim.beta1, 0, 1, false, true},
      {"beta2", c.optim.beta2, 0, 1, false, true},
      {"eps", c.optim.eps, 0, inf, true, true},
      {"weight-decay", c.optim.weight_decay, 0, inf, false, true},
      {"grad-clip", c.optim.grad_clip, 0, inf, false, true},
      {"sample-temperature", c.sample.temperature, 0, inf, false, true},
      {"peak-tflops", c.peak_tflops, 0, inf, false, true},
  };
  for (const FloatRange& f : floats) {
    const bool above = f.lo_open ? f.value > f.lo : f.value >= f.lo;
    const bool below = f.hi_open ? f.value < f.hi : f.value <= f.hi;
    if (!(std::isfinite(f.value) && above && below)) {
      std::ostringstream os;
      os << "--" << f.name << " must be a finite number ";
      if (std::isinf(f.hi)) os << (f.lo_open ? "> " : ">= ") << f.lo;
      else os << "in " << (f.lo_open ? "(" : "[") << f.lo << ", " << f.hi << (f.hi_open ? ")" : "]");
      os << " (got " << f.value << ")";
      return error(os.str());
    }
  }
  if (c.schedule.warmup_steps < 0) return error("--warmup-steps must not be negative");
  const std::pair<const char*, int> counts[] = {{"threads", c.threads},       {"ckpt-every", c.ckpt_every},
                                                {"ckpt-keep", c.ckpt_keep},   {"val-every", c.val_every},
                                                {"sample-tokens", c.sample.max_new_tokens},
                                                {"sample-top-k", c.sample.top_k}};
  for (const auto& [name, value] : counts)
    if (value < 0) return error("--" + std::string(name) + " must not be negative (got " + std::to_string(value) + ")");
  if (!(c.bucket_mb > 0 && c.bucket_mb <= 65536)) return error("--bucket-mb must be in (0, 65536]");
  if (c.log_every <= 0) return error("--log-every must be positive");
  if (c.profile_step < 0 || c.profile_step > c.max_steps)
    return error("--profile-step must be a step of the run, 1 to --max-steps (" + std::to_string(c.max_steps) +
                 "), or 0 for none (got " + std::to_string(c.profile_step) + ")");
  if (c.val_batches <= 0) return error("--val-batches must be positive");
  // --benchmark reads no files, --eval-only reads nothing else (it once said "--eval-only needs --val-data" with
  // --val-data given)
  if (c.benchmark && c.eval_only) return error("--benchmark and --eval-only cannot be combined");
  c.schedule.max_steps = c.max_steps;
  return out;
}

}  // namespace gpt2
