// `keel data prepare`: text files -> a prepared dataset directory of token shards.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "keel/cli/commands.hpp"
#include "keel/core/error.hpp"
#include "keel/data/documents.hpp"
#include "keel/data/prepare.hpp"
#include "keel/data/tokenizer.hpp"

namespace keel::cli {

namespace {

namespace fs = std::filesystem;

void register_prepare(CLI::App& data) {
  auto* cmd = data.add_subcommand("prepare", "Tokenize text files into train/val token shards");
  struct Options {
    std::vector<std::string> text;
    std::string tokenizer, out;
    double val_fraction = 0.0;
    int64_t shard_tokens = int64_t{1} << 24;
    bool force = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--text", o->text, "text files or directories (Brown-corpus tagged files are detected)")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--tokenizer", o->tokenizer, "HF tokenizer.json")->required();
  cmd->add_option("--out", o->out, "dataset directory to create")->required();
  cmd->add_option("--val-fraction", o->val_fraction, "fraction of documents held out for validation")
      ->required()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--shard-tokens", o->shard_tokens, "most tokens per shard file")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
  cmd->add_flag("--force", o->force, "replace DIR if it exists");
  cmd->callback([o] {
    // Inputs are checked before anything is written.
    const std::vector<data::Document> docs = data::read_documents(o->text);
    const data::Tokenizer tok = data::Tokenizer::load(o->tokenizer);
    const fs::path out = fs::path(o->out).lexically_normal();
    const std::string out_text = out.string();
    std::error_code ec;
    if (fs::exists(fs::symlink_status(out, ec)) && !o->force) {
      throw Error(out_text, "", "already exists; pass --force to replace it");
    }

    // The dataset is built beside DIR and renamed into place, so DIR is never left partial.
    const std::string pid = std::to_string(::getpid());
    const fs::path tmp = out_text + ".tmp-" + pid;
    fs::remove_all(tmp, ec);
    data::PrepareStats stats;
    try {
      stats = data::prepare_dataset(docs, tok, tmp.string(), o->val_fraction, o->shard_tokens, o->tokenizer);
    } catch (...) {
      fs::remove_all(tmp, ec);
      throw;
    }
    if (fs::exists(fs::symlink_status(out, ec))) {
      const fs::path old = out_text + ".old-" + pid;
      fs::rename(out, old, ec);
      if (ec) {
        fs::remove_all(tmp, ec);
        throw Error(out_text, "", "cannot move the existing directory aside: " + ec.message());
      }
      fs::rename(tmp, out, ec);
      if (ec) {
        const std::string reason = ec.message();
        fs::rename(old, out, ec);
        throw Error(out_text, "", "cannot rename the prepared dataset into place: " + reason);
      }
      fs::remove_all(old, ec);
    } else {
      fs::rename(tmp, out, ec);
      if (ec) {
        const std::string reason = ec.message();
        fs::remove_all(tmp, ec);
        throw Error(out_text, "", "cannot rename the prepared dataset into place: " + reason);
      }
    }

    std::printf("prepared %s from %zu documents (%s tokens, vocab hint %lld)\n", out_text.c_str(), docs.size(),
                stats.token_bytes == 2 ? "uint16" : "uint32", static_cast<long long>(stats.vocab_size_hint));
    std::printf("  train: %lld documents, %lld tokens, %lld shards\n", static_cast<long long>(stats.documents_train),
                static_cast<long long>(stats.tokens_train), static_cast<long long>(stats.shards_train));
    std::printf("  val:   %lld documents, %lld tokens, %lld shards\n", static_cast<long long>(stats.documents_val),
                static_cast<long long>(stats.tokens_val), static_cast<long long>(stats.shards_val));
    if (o->val_fraction > 0 && stats.documents_val == 0) {
      std::fprintf(stderr,
                   "keel: warning: no document went to val; the split is by document, so with few documents "
                   "use more files or separate documents with <|endoftext|> lines\n");
    }
  });
}

}  // namespace

void register_data_commands(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare training data");
  data->require_subcommand(1);
  register_prepare(*data);
}

}  // namespace keel::cli
