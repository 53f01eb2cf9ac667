// gpt2-data: prepares token files (DESIGN.md section 5) and inspects them.
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/error.hpp"
#include "data/byte_tokenizer.hpp"
#include "data/token_file.hpp"

namespace po = boost::program_options;
using namespace gpt2;

namespace {

const char* kUsage =
    "gpt2-data: token files for gpt2-train.\n"
    "\n"
    "  gpt2-data prepare --tokenizer byte --text FILE [FILE...] --out DIR [--val-fraction 0.1]\n"
    "      Tokenizes the text files (concatenated in the order given) and writes DIR/train.h5 and\n"
    "      DIR/val.h5; the last val-fraction of the tokens is the validation split.\n"
    "  gpt2-data inspect FILE\n"
    "      Prints token count, vocabulary, dtype, documents and a decoded excerpt.\n";

std::string read_file(const std::string& path) {
  std::ifstream is(path, std::ios::binary);
  GPT2_REQUIRE(is.good(), "cannot read text file " << path);
  std::ostringstream os;
  os << is.rdbuf();
  return os.str();
}

int prepare(int argc, char** argv) {
  std::string tokenizer, out;
  std::vector<std::string> texts;
  double val_fraction = 0.1;
  po::options_description opts("gpt2-data prepare");
  opts.add_options()("help,h", "help")("tokenizer", po::value<std::string>(&tokenizer)->default_value("byte"),
                                       "byte (GPT-2 BPE comes with its own issue)")(
      "text", po::value<std::vector<std::string>>(&texts)->multitoken()->required(), "input text files")(
      "out", po::value<std::string>(&out)->required(), "output directory (created)")(
      "val-fraction", po::value<double>(&val_fraction)->default_value(0.1), "fraction of tokens for validation");
  po::variables_map vm;
  try {
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::store(po::command_line_parser(argc, argv).options(opts).style(style).run(), vm);
    if (vm.count("help")) {
      std::cout << kUsage << "\n" << opts;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "gpt2-data prepare: error: %s\n", e.what());
    return 2;
  }
  if (tokenizer != "byte") {
    std::fprintf(stderr, "gpt2-data prepare: error: unknown --tokenizer '%s' (available: byte)\n", tokenizer.c_str());
    return 2;
  }
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    std::fprintf(stderr, "gpt2-data prepare: error: --val-fraction must be in [0, 1)\n");
    return 2;
  }
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> docs;
  for (const std::string& path : texts) {
    docs.push_back(tokens.size());
    const std::vector<uint32_t> t = ByteTokenizer::encode(read_file(path));
    tokens.insert(tokens.end(), t.begin(), t.end());
  }
  GPT2_REQUIRE(tokens.size() >= 2, "the input text is empty: nothing to train on");
  const size_t n_val = static_cast<size_t>(static_cast<double>(tokens.size()) * val_fraction);
  const size_t n_train = tokens.size() - n_val;
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  GPT2_REQUIRE(!ec, "cannot create output directory " << out << ": " << ec.message());
  TokenFileWriteOptions wo;
  wo.vocab_size = ByteTokenizer::kVocabSize;
  wo.tokenizer = "byte";
  for (uint64_t d : docs)
    if (d < n_train) wo.doc_offsets.push_back(d);
  write_token_file(out + "/train.h5", std::vector<uint32_t>(tokens.begin(), tokens.begin() + n_train), wo);
  wo.doc_offsets = {0};
  write_token_file(out + "/val.h5", std::vector<uint32_t>(tokens.begin() + n_train, tokens.end()), wo);
  std::printf("wrote %s/train.h5 (%zu tokens) and %s/val.h5 (%zu tokens), tokenizer byte, vocab 256\n", out.c_str(),
              n_train, out.c_str(), n_val);
  return 0;
}

int inspect(const std::string& path) {
  TokenFile f(path);
  std::printf("file:       %s\n", path.c_str());
  std::printf("tokens:     %llu\n", static_cast<unsigned long long>(f.size()));
  std::printf("dtype:      uint%d\n", f.dtype_bits());
  std::printf("vocab_size: %d\n", f.vocab_size());
  std::printf("tokenizer:  %s\n", f.tokenizer().c_str());
  if (f.eot_token() >= 0) std::printf("eot_token:  %d\n", f.eot_token());
  const size_t n = static_cast<size_t>(std::min<uint64_t>(f.size(), 200));
  std::vector<int32_t> head(n);
  if (n > 0) f.read(0, n, head.data());
  if (f.tokenizer() == "byte") {
    std::printf("excerpt:    %s\n", ByteTokenizer::decode(head).c_str());
  } else {
    std::printf("first ids: ");
    for (size_t i = 0; i < std::min<size_t>(n, 32); ++i) std::printf(" %d", head[i]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "prepare") return prepare(argc - 1, argv + 1);
  if (cmd == "inspect") {
    if (argc != 3) {
      std::fprintf(stderr, "usage: gpt2-data inspect FILE\n");
      return 2;
    }
    return inspect(argv[2]);
  }
  std::fprintf(stderr, "gpt2-data: error: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
