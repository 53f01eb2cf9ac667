// gpt2-data: prepares token files (DESIGN.md section 5), inspects them and checkpoints, exports a model.
#include <boost/program_options.hpp>
#include <algorithm>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "app/option_errors.hpp"
#include "core/error.hpp"
#include "core/hdf5.hpp"
#include "data/byte_tokenizer.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "data/prepare.hpp"
#include "data/token_file.hpp"
#include "train/checkpoint.hpp"
#include "train/hf_interop.hpp"

namespace po = boost::program_options;
using namespace gpt2;

namespace {

// inspect's part of the usage, which `gpt2-data inspect --help` prints alone
#define GPT2_DATA_INSPECT_USAGE                                                                              \
  "  gpt2-data inspect FILE|RUN_DIR...\n"                                                                   \
  "      A token file: prints token count, vocabulary, dtype, documents and a decoded excerpt, and\n"        \
  "      reads every token back, verifying its id and the file's CRC-32 (exit 1 if damaged).\n"              \
  "      Several files, or a quoted glob ('data/train_*.h5'), are inspected one after another, to\n"         \
  "      the first damaged one (gpt2-train --verify-data does the same check on its ranks).\n"              \
  "      A checkpoint (or a run's --out directory: the checkpoint its ckpt/latest names): prints its\n"      \
  "      model and step, and reads every tensor back, verifying its CRC-32 and that it is finite;\n"         \
  "      exits 1 naming the first damaged tensor (e.g. after copying checkpoints between clusters).\n"

const char* kUsage =
    "gpt2-data: token files for gpt2-train.\n"
    "\n"
    "  gpt2-data prepare --input FILE|DIR... --out DIR [--tokenizer byte|gpt2] [--jsonl-field text]\n"
    "                    [--val-fraction 0.1] [--shard-tokens N] [--threads N]\n"
    "      Tokenizes the documents (each text file, or each JSON line's field), in parallel, with\n"
    "      <|endoftext|> between documents (gpt2), and writes DIR/train.h5 and DIR/val.h5 (or shards\n"
    "      DIR/train_000000.h5, ...). Every 1/val-fraction-th document goes to validation.\n"
    GPT2_DATA_INSPECT_USAGE
    "  gpt2-data export-hf CKPT DIR\n"
    "      Writes the model of checkpoint CKPT (a step_*.h5 file, or a run's --out directory for its\n"
    "      latest checkpoint) as DIR/model.safetensors and DIR/config.json, which Hugging Face\n"
    "      transformers loads with GPT2LMHeadModel.from_pretrained(DIR).\n";

// The smallest --shard-tokens: one training window (seq_len + 1 tokens) at GPT-2's context of 1024.
constexpr int64_t kMinShardTokens = 1025;

int prepare(int argc, char** argv) {
  std::string tokenizer, out, vocab_dir;
  std::vector<std::string> inputs, texts;
  PrepareOptions p;
  bool no_progress = false;
  int64_t shard_tokens = 0;  // signed: "-1" must be an error, not 2^64 - 1
  po::options_description opts("gpt2-data prepare");
  opts.add_options()("help,h", "help")(
      "input", po::value<std::vector<std::string>>(&inputs)->multitoken(),
      "input files or directories (searched recursively, sorted); repeatable")(
      "text", po::value<std::vector<std::string>>(&texts)->multitoken(), "the same as --input")(
      "out", po::value<std::string>(&out)->required(), "output directory (created)")(
      "tokenizer", po::value<std::string>(&tokenizer)->default_value("byte"), "byte | gpt2 (GPT-2 BPE, 50257 tokens)")(
      "vocab-dir", po::value<std::string>(&vocab_dir)->default_value(Gpt2Tokenizer::default_vocab_dir()),
      "directory with GPT-2's encoder.json and vocab.bpe (tools/get-gpt2-vocab.sh fills it)")(
      "jsonl-field", po::value<std::string>(&p.jsonl_field)->default_value(""),
      "inputs are JSON lines: one document per line, the text in this string field (e.g. text)")(
      "val-fraction", po::value<double>(&p.val_fraction)->default_value(0.1, "0.1"),
      "fraction of the documents for validation, spread evenly (a single document: of its tokens)")(
      "shard-tokens", po::value<int64_t>(&shard_tokens)->default_value(0),
      "tokens per file: train_000000.h5, ... (0: one train.h5 and one val.h5); at least 1025, one window of "
      "GPT-2's 1024-token context, since training windows never cross a file")(
      "threads", po::value<int>(&p.threads)->default_value(0), "tokenizer threads (0: all cores)")(
      "no-progress", po::bool_switch(&no_progress), "no progress output");
  po::variables_map vm;
  try {
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    const po::parsed_options parsed = po::command_line_parser(argc, argv).options(opts).style(style).run();
    gpt2::reject_stray_words(parsed);
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::cout << kUsage << "\n" << opts;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "gpt2-data prepare: error: %s\n", gpt2::option_error_message(e).c_str());
    return 2;
  }
  inputs.insert(inputs.end(), texts.begin(), texts.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "gpt2-data prepare: error: no inputs: give --input FILE|DIR ...\n");
    return 2;
  }
  if (tokenizer != "byte" && tokenizer != "gpt2") {
    std::fprintf(stderr, "gpt2-data prepare: error: unknown --tokenizer '%s' (available: byte, gpt2)\n",
                 tokenizer.c_str());
    return 2;
  }
  if (!(p.val_fraction >= 0.0 && p.val_fraction < 1.0)) {
    std::fprintf(stderr, "gpt2-data prepare: error: --val-fraction must be in [0, 1)\n");
    return 2;
  }
  if (p.threads < 0) {
    std::fprintf(stderr, "gpt2-data prepare: error: --threads must not be negative (got %d)\n", p.threads);
    return 2;
  }
  // A shard shorter than one training window holds no window at all (windows never cross a file).
  if (shard_tokens != 0 && shard_tokens < kMinShardTokens) {
    std::fprintf(stderr, "gpt2-data prepare: error: --shard-tokens %lld is below one sequence: give 0 (no shards) "
                 "or at least %lld tokens\n", static_cast<long long>(shard_tokens), static_cast<long long>(kMinShardTokens));
    return 2;
  }
  p.shard_tokens = static_cast<uint64_t>(shard_tokens);
  std::unique_ptr<Gpt2Tokenizer> bpe;
  if (tokenizer == "gpt2") {
    bpe = std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::from_dir(vocab_dir));
    const Gpt2Tokenizer* t = bpe.get();
    p.encode = [t](std::string_view text) { return t->encode(text); };
    p.vocab_size = static_cast<int>(Gpt2Tokenizer::kVocabSize);
    p.eot_token = static_cast<int>(Gpt2Tokenizer::kEot);
  } else {
    p.encode = [](std::string_view text) { return ByteTokenizer::encode(std::string(text)); };
    p.vocab_size = ByteTokenizer::kVocabSize;
    p.eot_token = -1;  // the byte vocabulary has no end-of-text token
  }
  p.inputs = inputs;
  p.out_dir = out;
  p.tokenizer = tokenizer;
  p.progress = !no_progress;
  const PrepareResult r = prepare_dataset(p);
  std::printf("wrote %llu train tokens in %zu file(s) and %llu val tokens in %zu file(s) to %s: %llu document(s), "
              "tokenizer %s, vocab %d, %.3g MB in %.3g s (%.1f MB/s)\n",
              static_cast<unsigned long long>(r.train_tokens), r.train_files.size(),
              static_cast<unsigned long long>(r.val_tokens), r.val_files.size(), out.c_str(),
              static_cast<unsigned long long>(r.documents), tokenizer.c_str(), p.vocab_size,
              static_cast<double>(r.bytes) / 1e6, r.seconds, static_cast<double>(r.bytes) / 1e6 / std::max(r.seconds, 1e-9));
  return 0;
}

// A checkpoint: an HDF5 file with a /model group, or a run directory (ckpt/ inside).
bool is_checkpoint(const std::string& path) {
  if (std::filesystem::is_directory(path)) return true;
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::Id f = h5::open_read(path);
  return h5::has_object(f.get(), "model");
}

int inspect_checkpoint_file(const std::string& arg) {
  // A run directory: the checkpoint its ckpt/latest names, with no fallback to an older one (as --resume auto
  // has): a damaged latest must fail here, not pass by verifying another file.
  std::string path = arg;
  if (std::filesystem::is_directory(arg)) {
    path = read_latest(arg);
    GPT2_REQUIRE(!path.empty(), arg << " has no ckpt/latest naming a checkpoint: give a checkpoint file (e.g. "
                                    << arg << "/ckpt/step_*.h5)");
  }
  const CheckpointReport r = inspect_checkpoint(path);
  std::printf("file:       %s\n", path.c_str());
  std::printf("model:      %s\n", r.config.describe().c_str());
  std::printf("step:       %lld (%lld tokens seen, written by %d rank(s), seed %llu)\n",
              static_cast<long long>(r.state.step), static_cast<long long>(r.state.tokens_seen), r.state.world_size,
              static_cast<unsigned long long>(r.state.seed));
  if (r.has_optimizer)
    std::printf("optimizer:  AdamW moments, step %ld\n", r.optimizer_step);
  else
    std::printf("optimizer:  none (--init-from only)\n");
  std::printf("tensors:    %d read back (%.1f MB), all finite; CRC-32 verified on %d%s\n", r.tensors, r.bytes / 1e6,
              r.crc_verified,
              r.crc_verified == r.tensors ? " (all)" : r.crc_verified == 0 ? " (written without checksums)" : "");
  return 0;
}

int inspect(const std::string& path) {
  if (is_checkpoint(path)) return inspect_checkpoint_file(path);
  TokenFile f(path);
  std::printf("file:       %s\n", path.c_str());
  std::printf("tokens:     %llu\n", static_cast<unsigned long long>(f.size()));
  std::printf("dtype:      uint%d\n", f.dtype_bits());
  std::printf("vocab_size: %d\n", f.vocab_size());
  std::printf("tokenizer:  %s\n", f.tokenizer().c_str());
  if (f.eot_token() >= 0) std::printf("eot_token:  %d\n", f.eot_token());
  if (f.num_documents() >= 0) std::printf("documents:  %lld starting in this file\n", static_cast<long long>(f.num_documents()));
  std::fflush(stdout);  // the description first: the check below reads the whole file
  const bool crc = f.verify_crc32();
  std::printf("checked:    every token read back and < vocab_size; CRC-32 %s\n",
              crc ? "verified" : "not verified (the file has none: written by another tool, or before 2026-12-07)");
  const size_t n = static_cast<size_t>(std::min<uint64_t>(f.size(), 200));
  std::vector<int32_t> head(n);
  if (n > 0) f.read(0, n, head.data());
  const std::string vocab_dir = Gpt2Tokenizer::default_vocab_dir();
  if (f.tokenizer() == "byte") {
    std::printf("excerpt:    %s\n", ByteTokenizer::decode(head).c_str());
  } else if (f.tokenizer() == "gpt2" && std::filesystem::exists(vocab_dir + "/encoder.json")) {
    const Gpt2Tokenizer t = Gpt2Tokenizer::from_dir(vocab_dir);
    std::vector<uint32_t> ids(head.begin(), head.end());
    std::printf("excerpt:    %s\n", t.decode(ids).c_str());
  } else {
    std::printf("first ids: ");
    for (size_t i = 0; i < std::min<size_t>(n, 32); ++i) std::printf(" %d", head[i]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  install_terminate_handler();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "prepare") return prepare(argc - 1, argv + 1);
  if (cmd == "inspect") {
    static const char* const kInspectUsage = "usage:\n" GPT2_DATA_INSPECT_USAGE;
    const bool help = argc == 3 && (std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h");
    if (help || argc < 3) {
      std::fputs(kInspectUsage, help ? stdout : stderr);
      return help ? 0 : 2;
    }
    for (int i = 2; i < argc; ++i)
      if (argv[i][0] == '-' && !std::filesystem::exists(argv[i])) {
        std::fprintf(stderr, "gpt2-data inspect: error: unknown option '%s'\n%s", argv[i], kInspectUsage);
        return 2;
      }
    int shown = 0;
    for (int i = 2; i < argc; ++i) {
      // A glob the shell did not expand (quoted, as gpt2-train takes them) names its shards in order.
      const std::string arg = argv[i];
      const bool glob = arg.find_first_of("*?[") != std::string::npos && !std::filesystem::exists(arg);
      for (const std::string& path : glob ? expand_data_glob(arg) : std::vector<std::string>{arg}) {
        if (shown++ > 0) std::printf("\n");
        inspect(path);
      }
    }
    return 0;
  }
  if (cmd == "export-hf") {
    const bool help = argc == 3 && (std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h");
    if (help || argc != 4) {
      std::fputs("usage: gpt2-data export-hf CKPT DIR\n", help ? stdout : stderr);
      return help ? 0 : 2;
    }
    const std::string ckpt = resolve_checkpoint(argv[2]);  // a file, or a run's --out directory
    export_hf(ckpt, argv[3]);
    std::printf("wrote %s/model.safetensors and %s/config.json from %s\n", argv[3], argv[3], ckpt.c_str());
    return 0;
  }
  std::fprintf(stderr, "gpt2-data: error: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
