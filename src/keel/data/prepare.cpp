#include "keel/data/prepare.hpp"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/core/sha256.hpp"

namespace keel::data {

namespace fs = std::filesystem;

namespace {

// FNV-1a over the name, then the splitmix64 finalizer (Steele et al., "Fast splittable
// pseudorandom number generators", 2014) so that names differing in one character land far apart.
uint64_t name_hash(const std::string& name, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

constexpr uint64_t kSplitSeed = 0;

// Accumulates one split's tokens and writes a shard each time shard_tokens are buffered.
class SplitWriter {
 public:
  SplitWriter(std::string dir, std::string split, int64_t shard_tokens, int token_bytes)
      : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens), token_bytes_(token_bytes) {}

  void add_document(const std::vector<int32_t>& tokens) {
    if (tokens.empty()) return;
    ++documents_;
    starts_.push_back(static_cast<int64_t>(buffer_.size()));
    size_t at = 0;
    while (at < tokens.size()) {
      const size_t room = static_cast<size_t>(shard_tokens_) - buffer_.size();
      const size_t take = std::min(room, tokens.size() - at);
      buffer_.insert(buffer_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(at),
                     tokens.begin() + static_cast<std::ptrdiff_t>(at + take));
      at += take;
      if (buffer_.size() == static_cast<size_t>(shard_tokens_)) write_shard_now();
    }
  }

  void finish() {
    if (!buffer_.empty()) write_shard_now();
  }

  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }
  int64_t shards() const { return shards_; }

 private:
  void write_shard_now() {
    write_shard(shard_path(dir_, split_, shards_), buffer_, starts_, token_bytes_);
    ++shards_;
    tokens_ += static_cast<int64_t>(buffer_.size());
    buffer_.clear();
    starts_.clear();
  }

  std::string dir_, split_;
  int64_t shard_tokens_;
  int token_bytes_;
  std::vector<int32_t> buffer_;
  std::vector<int64_t> starts_;
  int64_t documents_ = 0, tokens_ = 0, shards_ = 0;
};

void require_fresh_dir(const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir, "", "cannot create the output directory: " + ec.message());
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool shard = (name.rfind("train_", 0) == 0 || name.rfind("val_", 0) == 0) && name.ends_with(".bin");
    if (shard || name == "meta.json") {
      throw Error(out_dir, "", "already holds a dataset (" + name + "); choose an empty directory");
    }
  }
  if (ec) throw Error(out_dir, "", "cannot list the output directory: " + ec.message());
}

}  // namespace

bool goes_to_val(const std::string& name, double val_fraction) {
  const double u = static_cast<double>(name_hash(name, kSplitSeed) >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  return u < val_fraction;
}

PrepareStats prepare_dataset(const std::vector<Document>& docs, const Tokenizer& tok, const std::string& out_dir,
                             double val_fraction, int64_t shard_tokens, const std::string& tokenizer_path) {
  if (!(val_fraction >= 0.0 && val_fraction <= 1.0)) {
    throw Error(out_dir, "val_fraction", std::to_string(val_fraction) + " is outside [0, 1]");
  }
  if (shard_tokens < 1 || shard_tokens > (int64_t{1} << 32)) {
    throw Error(out_dir, "shard_tokens", std::to_string(shard_tokens) + " is outside [1, 2^32]");
  }
  if (docs.empty()) throw Error(out_dir, "documents", "no documents to prepare");
  const std::string tokenizer_sha = tokenizer_path.empty() ? sha256_hex(tok.to_json()) : sha256_file_hex(tokenizer_path);
  require_fresh_dir(out_dir);

  const int64_t vocab = tok.vocab_size();
  const int token_bytes = token_bytes_for_vocab(vocab);
  const std::optional<int32_t> eos = tok.eos_id();
  SplitWriter train(out_dir, "train", shard_tokens, token_bytes);
  SplitWriter val(out_dir, "val", shard_tokens, token_bytes);
  int64_t max_id = -1;

  // Documents are encoded a batch at a time on all threads (encode is thread-safe) and written
  // in order, so the output does not depend on the thread count and memory stays bounded.
  constexpr size_t kBatch = 256;
  std::vector<std::vector<int32_t>> encoded(kBatch);
  for (size_t first = 0; first < docs.size(); first += kBatch) {
    const size_t n = std::min(kBatch, docs.size() - first);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < n; ++i) {
      encoded[i] = tok.encode(docs[first + i].text);
      if (eos && !encoded[i].empty()) encoded[i].push_back(*eos);
    }
    for (size_t i = 0; i < n; ++i) {
      const Document& doc = docs[first + i];
      for (int32_t id : encoded[i]) {
        if (id < 0 || id >= vocab) {
          throw Error(doc.name, "token", "tokenizer produced id " + std::to_string(id) + " outside its vocabulary of " +
                                             std::to_string(vocab));
        }
        max_id = std::max<int64_t>(max_id, id);
      }
      std::string key = doc.name;
      if (key.empty()) key = std::string("#").append(std::to_string(first + i));
      (goes_to_val(key, val_fraction) ? val : train).add_document(encoded[i]);
    }
  }
  train.finish();
  val.finish();
  if (train.tokens() + val.tokens() == 0) throw Error(out_dir, "documents", "the documents hold no text to tokenize");

  PrepareStats stats;
  stats.documents_train = train.documents();
  stats.documents_val = val.documents();
  stats.tokens_train = train.tokens();
  stats.tokens_val = val.tokens();
  stats.shards_train = train.shards();
  stats.shards_val = val.shards();
  stats.token_bytes = token_bytes;
  stats.vocab_size_hint = max_id + 1;

  nlohmann::json split_info = nlohmann::json::object();
  for (const SplitWriter* w : {&train, &val}) {
    split_info[w == &train ? "train" : "val"] = {
        {"documents", w->documents()}, {"tokens", w->tokens()}, {"shards", w->shards()}};
  }
  nlohmann::json tokenizer = {{"path", tokenizer_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(tokenizer_path)},
                              {"sha256", tokenizer_sha},
                              {"vocab_size", vocab},
                              {"eos_id", eos ? nlohmann::json(*eos) : nlohmann::json(nullptr)}};
  const nlohmann::json meta = {{"format", "keel token shards"},
                               {"format_version", kShardFormatVersion},
                               {"dtype", token_bytes == 2 ? "uint16" : "uint32"},
                               {"vocab_size_hint", stats.vocab_size_hint},
                               {"tokenizer", tokenizer},
                               {"val_fraction", val_fraction},
                               {"split_seed", kSplitSeed},
                               {"shard_tokens", shard_tokens},
                               {"splits", split_info}};
  // Written last: a directory with meta.json is a complete dataset.
  write_file_atomic((fs::path(out_dir) / "meta.json").string(), meta.dump(2) + "\n");
  return stats;
}

}  // namespace keel::data
