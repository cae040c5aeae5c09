// train_bpe: byte-level BPE training (Sennrich et al. 2016, section 3.1, over bytes as in GPT-2,
// Radford et al. 2019, section 2.2). Pair counts are kept up to date incrementally: merging a
// pair only touches the words that contain it, and a max-heap with lazy invalidation picks the
// next pair, so a merge costs what it changes rather than a pass over the corpus.
#include <algorithm>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"
#include "keel/data/byte_level.hpp"
#include "keel/data/pre_tokenizer.hpp"
#include "keel/data/tokenizer.hpp"
#include "keel/data/unicode.hpp"

namespace keel::data {
namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t left_of(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t right_of(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

struct Word {
  std::vector<int32_t> ids;
  int64_t count = 0;
};

struct Candidate {
  int64_t count;
  uint64_t pair;
  // The heap's top is the most frequent pair; among equals the smallest (left id, right id).
  bool operator<(const Candidate& o) const { return count != o.count ? count < o.count : pair > o.pair; }
};

// Counts the pre-tokenized words of all texts (special tokens cut out, NFC applied).
std::unordered_map<std::string, int64_t> count_words(const std::vector<std::string>& texts,
                                                     const std::vector<std::string>& special_tokens) {
  RegexSplitter splitter = RegexSplitter::from_pattern(kQwenPattern, "", "");
  std::unordered_map<std::string, int64_t> counts;
  std::vector<char32_t> cps;
  std::vector<std::pair<uint32_t, uint32_t>> pieces;
  std::string bytes;
  auto add_section = [&](std::string_view section) {
    cps.clear();
    unicode::decode_utf8(section, cps);
    cps = unicode::nfc(cps);
    pieces.clear();
    splitter.split(cps, 0, static_cast<uint32_t>(cps.size()), pieces);
    for (auto [a, b] : pieces) {
      bytes.clear();
      for (uint32_t i = a; i < b; ++i) unicode::append_utf8(cps[i], bytes);
      ++counts[bytes];
    }
  };
  for (const std::string& text : texts) {
    std::string_view rest(text);
    while (!rest.empty()) {
      // The leftmost special token (the longest among those starting there).
      std::size_t at = std::string_view::npos, len = 0;
      for (const std::string& s : special_tokens) {
        std::size_t p = rest.find(s);
        if (p != std::string_view::npos && (p < at || (p == at && s.size() > len))) at = p, len = s.size();
      }
      if (at == std::string_view::npos) {
        add_section(rest);
        break;
      }
      if (at > 0) add_section(rest.substr(0, at));
      rest.remove_prefix(at + len);
    }
  }
  return counts;
}

}  // namespace

Tokenizer train_bpe(const std::string& source, const std::vector<std::string>& texts, int64_t vocab_size,
                    const std::vector<std::string>& special_tokens) {
  for (std::size_t i = 0; i < special_tokens.size(); ++i) {
    if (special_tokens[i].empty()) throw Error(source, "special_tokens", "a special token is empty");
    for (std::size_t k = 0; k < i; ++k)
      if (special_tokens[k] == special_tokens[i])
        throw Error(source, "special_tokens", "\"" + special_tokens[i] + "\" is listed twice");
  }
  const int64_t minimum = 256 + static_cast<int64_t>(special_tokens.size());
  if (vocab_size < minimum || vocab_size > (int64_t{1} << 24))
    throw Error(source, "vocab_size",
                std::to_string(vocab_size) + " is outside [" + std::to_string(minimum) +
                    ", 16777216] (256 byte tokens + the special tokens at least)");

  // Words in sorted order, so ids and ties do not depend on hash-table order.
  auto counts = count_words(texts, special_tokens);
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (auto& [bytes, count] : sorted) {
    Word w;
    w.count = count;
    for (unsigned char b : bytes) w.ids.push_back(b);
    words.push_back(std::move(w));
  }

  std::vector<std::string> token_bytes(256);
  for (int b = 0; b < 256; ++b) token_bytes[b] = std::string(1, static_cast<char>(b));
  std::unordered_map<std::string, int32_t> token_by_bytes;
  for (int b = 0; b < 256; ++b) token_by_bytes.emplace(token_bytes[b], b);

  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // words holding a pair (may repeat)
  for (int32_t w = 0; w < static_cast<int32_t>(words.size()); ++w) {
    const auto& ids = words[w].ids;
    for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
      uint64_t p = pair_key(ids[i], ids[i + 1]);
      pair_counts[p] += words[w].count;
      auto& list = where[p];
      if (list.empty() || list.back() != w) list.push_back(w);
    }
  }
  std::priority_queue<Candidate> heap;
  for (auto [p, c] : pair_counts) heap.push({c, p});

  const int64_t target_tokens = vocab_size - static_cast<int64_t>(special_tokens.size());
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::unordered_map<uint64_t, int64_t> delta;
  std::vector<int32_t> merged_ids;
  while (static_cast<int64_t>(token_bytes.size()) < target_tokens && !heap.empty()) {
    Candidate top = heap.top();
    heap.pop();
    auto it = pair_counts.find(top.pair);
    int64_t current = it == pair_counts.end() ? 0 : it->second;
    if (current != top.count) {
      if (current >= 2) heap.push({current, top.pair});  // stale entry: requeue at its true count
      continue;
    }
    if (current < 2) break;  // a pair seen once teaches nothing
    const int32_t a = left_of(top.pair), b = right_of(top.pair);
    std::string bytes = token_bytes[a] + token_bytes[b];
    int32_t id;
    if (auto known = token_by_bytes.find(bytes); known != token_by_bytes.end()) {
      id = known->second;  // another merge order already made this token
    } else {
      id = static_cast<int32_t>(token_bytes.size());
      token_bytes.push_back(bytes);
      token_by_bytes.emplace(bytes, id);
    }
    merges.emplace_back(a, b);

    std::vector<int32_t> affected = std::move(where[top.pair]);
    where.erase(top.pair);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    delta.clear();
    for (int32_t w : affected) {
      Word& word = words[w];
      merged_ids.clear();
      bool changed = false;
      for (std::size_t i = 0; i < word.ids.size(); ++i) {
        if (i + 1 < word.ids.size() && word.ids[i] == a && word.ids[i + 1] == b) {
          merged_ids.push_back(id);
          ++i;
          changed = true;
        } else {
          merged_ids.push_back(word.ids[i]);
        }
      }
      if (!changed) continue;
      for (std::size_t i = 0; i + 1 < word.ids.size(); ++i) delta[pair_key(word.ids[i], word.ids[i + 1])] -= word.count;
      for (std::size_t i = 0; i + 1 < merged_ids.size(); ++i) {
        uint64_t p = pair_key(merged_ids[i], merged_ids[i + 1]);
        delta[p] += word.count;
        auto& list = where[p];
        if (list.empty() || list.back() != w) list.push_back(w);
      }
      word.ids.swap(merged_ids);
    }
    for (auto [p, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_counts[p];
      c += d;
      if (d > 0) heap.push({c, p});
      if (c <= 0) pair_counts.erase(p);
    }
    pair_counts.erase(top.pair);
  }

  // The tokenizer.json of the result, read back by the one loader.
  const auto byte_chars = byte_to_char_table();
  auto text_of = [&](int32_t id) {
    std::string s;
    for (unsigned char c : token_bytes[id]) unicode::append_utf8(byte_chars[c], s);
    return s;
  };
  nlohmann::json vocab = nlohmann::json::object();
  for (int32_t id = 0; id < static_cast<int32_t>(token_bytes.size()); ++id) vocab[text_of(id)] = id;
  nlohmann::json merge_list = nlohmann::json::array();
  for (auto [a, b] : merges) merge_list.push_back({text_of(a), text_of(b)});
  nlohmann::json added = nlohmann::json::array();
  for (std::size_t i = 0; i < special_tokens.size(); ++i) {
    added.push_back({{"id", token_bytes.size() + i},
                     {"content", special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                               {"use_regex", false}};
  nlohmann::json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kQwenPattern}}}, {"behavior", "Isolated"}, {"invert", false}},
          byte_level}}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}},
  };
  return Tokenizer::parse(root.dump(), "<train_bpe>");
}

}  // namespace keel::data
