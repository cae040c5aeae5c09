#pragma once
// A small learnable dataset for trainer tests: a few fixed "words" over 64 ids repeated in a
// random order, written as a prepared dataset (train and val shards, meta.json).
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/core/rng.hpp"
#include "keel/data/shards.hpp"

namespace keel::train {
namespace {

// A learnable stream over 64 ids: a few fixed "words" repeated in a random order.
inline std::vector<int32_t> synthetic_tokens(int64_t n, uint64_t seed) {
  const std::vector<std::vector<int32_t>> words = {{1, 2, 3, 4}, {5, 6, 7}, {8, 9, 10, 11, 12}, {13, 14}, {20, 21, 22}, {30, 31, 32, 33}};
  std::vector<int32_t> out;
  for (uint64_t i = 0; static_cast<int64_t>(out.size()) < n; ++i) {
    const auto& w = words[uniform_int_at(seed, 3, i, words.size())];
    out.insert(out.end(), w.begin(), w.end());
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

inline void write_dataset(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  nlohmann::json splits;
  for (auto [split, n, seed] : {std::tuple{"train", int64_t{20000}, 1}, std::tuple{"val", int64_t{3000}, 2}}) {
    auto tokens = synthetic_tokens(n, seed);
    std::vector<int64_t> starts = {0};
    data::write_shard(data::shard_path(dir.string(), split, 0), tokens, starts, 2);
    splits[split] = {{"shards", 1}, {"tokens", n}, {"documents", 1}};
  }
  nlohmann::json meta = {{"format_version", data::kShardFormatVersion}, {"vocab_size_hint", 64}, {"splits", splits}};
  std::ofstream(dir / "meta.json") << meta.dump(2);
}

}  // namespace
}  // namespace keel::train
