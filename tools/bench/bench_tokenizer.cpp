// GPT-2 BPE tokenizer throughput, one thread, in MB/s of UTF-8 text (1 MB = 1e6 bytes).
//
//   bench_tokenizer [--vocab-dir DIR] [--text FILE] [benchmark flags]
//
// The vocabulary comes from DIR, else $GPT2_VOCAB_DIR, else tools/get-gpt2-vocab.sh's default cache
// (${XDG_CACHE_HOME:-$HOME/.cache}/gpt2-mpi/gpt2-vocab); run that script first. The text is FILE, else
// data/ci/corpus.txt of this checkout (English, the King James Bible's Genesis), else generated English-like
// words. Encode is measured with the per-thread piece cache warm (as in a long run over real text, where
// most pieces repeat) and with the cache disabled (every piece through BPE: the lower bound).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.hpp"

namespace {

std::string g_vocab_dir;
std::string g_text;
std::string g_text_source;

std::string default_vocab_dir() {
  if (const char* d = std::getenv("GPT2_VOCAB_DIR"); d != nullptr && *d != '\0') return d;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string cache =
      xdg != nullptr && *xdg != '\0' ? xdg : std::string(home != nullptr ? home : ".") + "/.cache";
  return cache + "/gpt2-mpi/gpt2-vocab";
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

// English-like text: words drawn with a Zipf-like skew, punctuation, line breaks.
std::string generated_text(size_t bytes) {
  static const char* kWords[] = {
      "the",         "of",          "and",          "to",       "in",    "a",        "is",        "that",     "for",
      "it",          "as",          "was",          "with",     "be",    "by",       "on",        "not",      "he",
      "I",           "this",        "are",          "or",       "his",   "from",     "at",        "which",    "but",
      "have",        "an",          "had",          "they",     "you",   "were",     "their",     "one",      "all",
      "we",          "can",         "her",          "has",      "there", "been",     "if",        "more",     "when",
      "will",        "would",       "who",          "so",       "no",    "training", "tokenizer", "language", "network",
      "distributed", "performance", "throughput",   "gradient", "it's",  "don't",    "1999",      "42",       "Mr.",
      "Europe",      "Genesis",     "understanding"};
  std::mt19937_64 rng(7);
  std::string text;
  const size_t n = sizeof(kWords) / sizeof(kWords[0]);
  while (text.size() < bytes) {
    const size_t r = rng() % (n * n);
    text += kWords[static_cast<size_t>(std::sqrt(static_cast<double>(r))) % n];  // skewed towards late words
    const uint64_t p = rng() % 100;
    text += p < 6 ? ", " : p < 9 ? ".\n" : p < 10 ? "; " : " ";
  }
  return text;
}

const gpt2::Gpt2Tokenizer& tokenizer(bool cached) {
  static const gpt2::Gpt2Tokenizer with_cache = gpt2::Gpt2Tokenizer::from_dir(g_vocab_dir);
  static const gpt2::Gpt2Tokenizer without_cache = gpt2::Gpt2Tokenizer::from_dir(g_vocab_dir, 0);
  return cached ? with_cache : without_cache;
}

void set_rate(benchmark::State& state, size_t bytes_per_iter) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes_per_iter));
  state.counters["MB/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * bytes_per_iter) / 1e6, benchmark::Counter::kIsRate);
}

void BM_Encode(benchmark::State& state) {
  const bool cached = state.range(0) != 0;
  const gpt2::Gpt2Tokenizer& tok = tokenizer(cached);
  std::vector<uint32_t> ids;
  tok.encode_append(g_text, ids);  // warms this thread's cache
  for (auto _ : state) {
    ids.clear();
    tok.encode_append(g_text, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  set_rate(state, g_text.size());
  state.counters["bytes/token"] = static_cast<double>(g_text.size()) / static_cast<double>(ids.size());
  state.SetLabel(g_text_source);
}
BENCHMARK(BM_Encode)->ArgName("cache")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);

void BM_Split(benchmark::State& state) {
  size_t pieces = 0;
  for (auto _ : state) {
    const auto split = gpt2::Gpt2Tokenizer::split(g_text);
    pieces = split.size();
    benchmark::DoNotOptimize(split.data());
  }
  set_rate(state, g_text.size());
  state.counters["bytes/piece"] = static_cast<double>(g_text.size()) / static_cast<double>(pieces);
}
BENCHMARK(BM_Split)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  const gpt2::Gpt2Tokenizer& tok = tokenizer(true);
  const std::vector<uint32_t> ids = tok.encode(g_text);
  for (auto _ : state) {
    std::string text = tok.decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  set_rate(state, g_text.size());
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  std::string text_file;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--vocab-dir") == 0 && i + 1 < argc)
      g_vocab_dir = argv[++i];
    else if (std::strcmp(argv[i], "--text") == 0 && i + 1 < argc)
      text_file = argv[++i];
    else
      rest.push_back(argv[i]);
  }
  if (g_vocab_dir.empty()) g_vocab_dir = default_vocab_dir();
  if (!text_file.empty()) {
    if (!read_file(text_file, g_text)) {
      std::fprintf(stderr, "bench_tokenizer: cannot read %s\n", text_file.c_str());
      return 1;
    }
    g_text_source = text_file;
  } else {
    // This file sits at tools/bench/ of the checkout whose data/ci/corpus.txt we want.
    std::string root = __FILE__;
    for (int k = 0; k < 3 && root.find('/') != std::string::npos; ++k) root.erase(root.rfind('/'));
    if (read_file(root + "/data/ci/corpus.txt", g_text) || read_file("data/ci/corpus.txt", g_text)) {
      g_text_source = "data/ci/corpus.txt";
    } else {
      g_text = generated_text(1 << 20);
      g_text_source = "generated English-like words";
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::AddCustomContext("text", g_text_source + " (" + std::to_string(g_text.size()) + " bytes)");
  benchmark::AddCustomContext("vocab", g_vocab_dir);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
