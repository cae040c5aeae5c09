// `keel data prepare`: text files -> a prepared dataset directory of token shards.
// `keel data verify`: every shard's header and data checksum, and meta.json's counts.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/cli/commands.hpp"
#include "keel/core/crc32c.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/data/documents.hpp"
#include "keel/data/prepare.hpp"
#include "keel/data/shards.hpp"
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

// Verifies every shard of SPLIT (all of them, so one run names every bad file), then opens the
// split as training does (numbering and meta.json's counts). Returns the bad shards' count.
int verify_split(const std::string& dir, const std::string& split, int64_t shards) {
  const auto start = std::chrono::steady_clock::now();
  int64_t bytes = 0, tokens = 0;
  int bad = 0;
  for (int64_t i = 0; i < shards; ++i) {
    const std::string path = data::shard_path(dir, split, i);
    try {
      const data::TokenShard shard = data::TokenShard::open(path);
      bytes += shard.file_bytes();
      tokens += shard.size();
      shard.verify_data_once();  // the split's open below then reads nothing twice
    } catch (const Error& e) {
      std::fprintf(stderr, "keel: %s\n", e.what());
      ++bad;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (bad == 0) data::TokenDataset::open(dir, split);  // counts and numbering against meta.json
  std::printf("  %-5s %lld shards, %lld tokens, %.1f MB: %s (%.3f s, %.2f GB/s)\n", split.c_str(),
              static_cast<long long>(shards), static_cast<long long>(tokens), static_cast<double>(bytes) / 1e6,
              bad == 0 ? "ok" : (std::to_string(bad) + " bad").c_str(), seconds,
              seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0);
  return bad;
}

void register_verify(CLI::App& data) {
  auto* cmd = data.add_subcommand(
      "verify", "Check a prepared dataset: every shard's header and data checksum (CRC-32C) and meta.json's counts");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("DIR", *dir, "prepared dataset directory (meta.json and <split>_NNNNN.bin)")->required();
  cmd->callback([dir] {
    const std::string meta_path = (fs::path(*dir) / "meta.json").string();
    const nlohmann::json meta = nlohmann::json::parse(
        read_file(meta_path, "the dataset's meta.json (not a prepared dataset directory?)"), nullptr, false);
    if (meta.is_discarded() || !meta.is_object() || !meta.contains("splits") || !meta["splits"].is_object()) {
      throw Error(meta_path, "splits", "missing or not an object");
    }
    std::printf("%s (CRC-32C: %s)\n", dir->c_str(),
                crc32c_hardware_available() ? "CPU instruction" : "table, no CPU instruction");
    int bad = 0;
    for (const auto& [split, info] : meta["splits"].items()) {
      if (!info.is_object() || !info.contains("shards") || !info["shards"].is_number_integer() ||
          info["shards"].get<int64_t>() < 0) {
        throw Error(meta_path, "splits." + split + ".shards", "missing or not a non-negative integer");
      }
      bad += verify_split(*dir, split, info["shards"].get<int64_t>());
    }
    if (bad > 0) throw Error(*dir, "", std::to_string(bad) + " shard(s) failed verification (listed above)");
    std::printf("all shards verified\n");
  });
}

}  // namespace

void register_data_commands(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare and verify training data");
  data->require_subcommand(1);
  register_prepare(*data);
  register_verify(*data);
}

}  // namespace keel::cli
