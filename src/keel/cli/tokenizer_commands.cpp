// `keel tokenize`: a text file -> token ids with a HF tokenizer.json (no special tokens added).
// `keel tokenizer train`: byte-level BPE trained on text files -> tokenizer.json.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "keel/cli/commands.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/data/documents.hpp"
#include "keel/data/tokenizer.hpp"

namespace keel::cli {

namespace {

void register_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Encode a text file to token ids (no special tokens added)");
  struct Options {
    std::string tokenizer, text_file;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--tokenizer", o->tokenizer, "HF tokenizer.json (byte-level BPE)")->required();
  cmd->add_option("--text-file", o->text_file, "file whose exact bytes are encoded")->required();
  cmd->add_flag("--json", o->json, "print {\"ids\": [...]} instead of space-separated ids");
  cmd->callback([o] {
    const data::Tokenizer tok = data::Tokenizer::load(o->tokenizer);
    const std::vector<int32_t> ids = tok.encode(read_file(o->text_file, "the text file"));
    std::string out = o->json ? "{\"ids\": [" : "";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += o->json ? ", " : " ";
      out += std::to_string(ids[i]);
    }
    out += o->json ? "]}\n" : "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
}

void register_train(CLI::App& tokenizer) {
  auto* cmd = tokenizer.add_subcommand("train", "Train a byte-level BPE tokenizer and write its tokenizer.json");
  struct Options {
    std::vector<std::string> text;
    int64_t vocab_size = 0;
    std::string out;
    std::vector<std::string> special = {"<|endoftext|>"};
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--text", o->text, "text files or directories (Brown-corpus tagged files are detected)")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--vocab-size", o->vocab_size, "largest vocabulary: 256 bytes + merges + special tokens")
      ->required();
  cmd->add_option("--out", o->out, "tokenizer.json to write")->required();
  cmd->add_option("--special", o->special, "special tokens (default: <|endoftext|>)")->expected(0, -1);
  cmd->callback([o] {
    const std::vector<data::Document> docs = data::read_documents(o->text);
    std::vector<std::string> texts;
    size_t bytes = 0;
    texts.reserve(docs.size());
    for (const data::Document& d : docs) {
      bytes += d.text.size();
      texts.push_back(d.text);
    }
    const data::Tokenizer tok = data::train_bpe("keel tokenizer train", texts, o->vocab_size, o->special);
    tok.save(o->out);
    std::printf("wrote %s: vocabulary %lld from %zu documents (%zu bytes)\n", o->out.c_str(),
                static_cast<long long>(tok.vocab_size()), docs.size(), bytes);
  });
}

}  // namespace

void register_tokenizer_commands(CLI::App& app) {
  register_tokenize(app);
  auto* tokenizer = app.add_subcommand("tokenizer", "Tokenizer tools");
  tokenizer->require_subcommand(1);
  register_train(*tokenizer);
}

}  // namespace keel::cli
