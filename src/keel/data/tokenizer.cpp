#include "keel/data/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/data/byte_level.hpp"
#include "keel/data/pre_tokenizer.hpp"
#include "keel/data/unicode.hpp"

namespace keel::data {

using json = nlohmann::json;

namespace {

// Ids index dense tables; real vocabularies stay far below this.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

constexpr uint8_t kInVocab = 1, kAdded = 2;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;  // matched in the normalized text rather than the raw text
  bool lstrip = false, rstrip = false;
};

// Finds added tokens in text: at the leftmost position where any matches, the longest one
// (what HF's Aho-Corasick "leftmost longest" and transformers.js's trie both do).
class AddedTokenMatcher {
 public:
  void add(int index, const std::string& content) {
    auto& list = by_first_byte_[static_cast<unsigned char>(content[0])];
    list.push_back({index, content});
    std::stable_sort(list.begin(), list.end(),
                     [](const Entry& a, const Entry& b) { return a.content.size() > b.content.size(); });
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // The index of the token at text[pos], or -1.
  int match_at(std::string_view text, std::size_t pos) const {
    for (const Entry& e : by_first_byte_[static_cast<unsigned char>(text[pos])])
      if (text.compare(pos, e.content.size(), e.content) == 0) return e.index;
    return -1;
  }

 private:
  struct Entry {
    int index;
    std::string content;
  };
  std::array<std::vector<Entry>, 256> by_first_byte_;
  bool empty_ = true;
};

struct Merge {
  int32_t rank;
  int32_t result;
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// (left id, right id) -> merge, open addressing with linear probing: the lookup in BPE's inner
// loop, where a node-based std::unordered_map costs a cache miss per probe.
class MergeTable {
 public:
  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, Merge{0, 0}});
    mask_ = cap - 1;
  }
  // Inserts or overwrites (a repeated pair takes its last rank).
  void set(uint64_t key, Merge m) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    std::size_t i = slot_of(key);
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    if (slots_[i].key == kEmpty) ++size_;
    slots_[i] = Slot{key, m};
  }
  const Merge* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // never a key: ids are below 2^24
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  std::size_t slot_of(uint64_t key) const { return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask_; }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    size_ = 0;
    reserve(std::max<std::size_t>(old.size(), 8));
    for (const Slot& s : old)
      if (s.key != kEmpty) set(s.key, s.merge);
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0, size_ = 0;
};

// Scratch buffers of one encode call.
struct Workspace {
  std::vector<char32_t> cps, prefixed;
  std::vector<std::pair<uint32_t, uint32_t>> pieces, next_pieces, sub_pieces;
  std::string bytes;
  std::vector<int32_t> symbols;
  std::vector<int32_t> ranks;
};

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  bool nfc = false;
  std::vector<RegexSplitter> splitters;          // Split pre-tokenizers, in order
  std::optional<RegexSplitter> byte_level_regex;  // ByteLevel with use_regex: the GPT-2 pattern
  bool add_prefix_space = false;
  bool ignore_merges = false;

  std::unordered_map<std::string, int32_t> vocab;  // token text as in the file (byte-level)
  std::vector<std::string> id_text;                // token text per id ("" where unused)
  std::vector<std::string> id_bytes;               // what each id decodes to
  std::vector<uint8_t> id_used;                    // kInVocab | kAdded, 0 where unused
  std::array<int32_t, 256> byte_ids{};
  std::array<char32_t, 256> byte_chars = byte_to_char_table();
  MergeTable merges;
  std::vector<std::pair<int32_t, int32_t>> merge_list;  // rank order, for to_json

  std::vector<AddedToken> added;
  std::unordered_map<std::string, int> added_by_content;
  AddedTokenMatcher raw_added, normalized_added;

  json normalizer_json, pre_tokenizer_json, post_processor_json, decoder_json;
  std::string unk_token_json = "null";
  std::optional<int32_t> eos;
  int64_t vocab_size = 0;

  void encode_with_added(std::string_view text, bool raw, Workspace& ws, std::vector<int32_t>& out) const;
  void encode_normalized(std::vector<char32_t>& cps, Workspace& ws, std::vector<int32_t>& out) const;
  void encode_word(const std::vector<char32_t>& cps, uint32_t first, uint32_t last, Workspace& ws,
                   std::vector<int32_t>& out) const;
  void bpe(std::vector<int32_t>& symbols, std::vector<int32_t>& ranks) const;
  void bpe_long(std::vector<int32_t>& symbols) const;
  const Merge* find_merge(int32_t a, int32_t b) const { return merges.find(pair_key(a, b)); }
};

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

std::string field_at(const std::string& base, std::size_t i) { return base + "[" + std::to_string(i) + "]"; }

const json& require(const json& j, const char* key, const std::string& origin, const std::string& field) {
  auto it = j.find(key);
  if (it == j.end()) throw Error(origin, field, "missing");
  return *it;
}

std::string get_string(const json& j, const std::string& origin, const std::string& field) {
  if (!j.is_string()) throw Error(origin, field, "must be a string");
  return j.get<std::string>();
}

bool get_bool(const json& obj, const char* key, bool fallback, const std::string& origin, const std::string& field) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw Error(origin, field + "." + key, "must be true or false");
  return it->get<bool>();
}

int32_t get_id(const json& j, const std::string& origin, const std::string& field) {
  if (!j.is_number_integer()) throw Error(origin, field, "must be an integer token id");
  int64_t v = j.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(j.get<uint64_t>(), INT64_MAX))
                                     : j.get<int64_t>();
  if (v < 0 || v > kMaxTokenId)
    throw Error(origin, field, "token id " + std::to_string(v) + " outside [0, " + std::to_string(kMaxTokenId) + "]");
  return static_cast<int32_t>(v);
}

std::string type_of(const json& j, const std::string& origin, const std::string& field) {
  if (!j.is_object()) throw Error(origin, field, "must be an object");
  return get_string(require(j, "type", origin, field + ".type"), origin, field + ".type");
}

void parse_normalizer(const json& j, Tokenizer::Impl& t) {
  const std::string& o = t.origin;
  if (j.is_null()) return;
  std::string type = type_of(j, o, "normalizer");
  if (type == "NFC") {
    t.nfc = true;
  } else if (type == "Sequence") {
    const json& list = require(j, "normalizers", o, "normalizer.normalizers");
    if (!list.is_array()) throw Error(o, "normalizer.normalizers", "must be an array");
    for (std::size_t i = 0; i < list.size(); ++i) {
      std::string f = field_at("normalizer.normalizers", i);
      std::string sub = type_of(list[i], o, f);
      if (sub != "NFC") throw Error(o, f + ".type", "unsupported normalizer '" + sub + "' (keel supports NFC)");
      t.nfc = true;
    }
  } else {
    throw Error(o, "normalizer.type", "unsupported normalizer '" + type + "' (keel supports NFC or none)");
  }
}

RegexSplitter parse_split(const json& j, const std::string& o, const std::string& f) {
  const json& pattern = require(j, "pattern", o, f + ".pattern");
  if (!pattern.is_object() || !pattern.contains("Regex"))
    throw Error(o, f + ".pattern", "only {\"Regex\": ...} patterns are supported");
  std::string regex = get_string(pattern["Regex"], o, f + ".pattern.Regex");
  std::string behavior = get_string(require(j, "behavior", o, f + ".behavior"), o, f + ".behavior");
  if (behavior != "Isolated")
    throw Error(o, f + ".behavior", "unsupported Split behavior '" + behavior + "' (keel supports Isolated)");
  if (get_bool(j, "invert", false, o, f)) throw Error(o, f + ".invert", "inverted Split is not supported");
  return RegexSplitter::from_pattern(regex, o, f + ".pattern.Regex");
}

void parse_byte_level(const json& j, Tokenizer::Impl& t, const std::string& f) {
  t.add_prefix_space = get_bool(j, "add_prefix_space", false, t.origin, f);
  if (get_bool(j, "use_regex", true, t.origin, f))
    t.byte_level_regex = RegexSplitter::from_pattern(kGpt2Pattern, t.origin, f);
}

void parse_pre_tokenizer(const json& j, Tokenizer::Impl& t) {
  const std::string& o = t.origin;
  const char* need = "a byte-level pre-tokenizer is required (ByteLevel, or a Sequence of Split ... ByteLevel)";
  if (j.is_null()) throw Error(o, "pre_tokenizer", need);
  std::string type = type_of(j, o, "pre_tokenizer");
  if (type == "ByteLevel") {
    parse_byte_level(j, t, "pre_tokenizer");
    return;
  }
  if (type != "Sequence") throw Error(o, "pre_tokenizer.type", "unsupported pre-tokenizer '" + type + "': " + need);
  const json& list = require(j, "pretokenizers", o, "pre_tokenizer.pretokenizers");
  if (!list.is_array() || list.empty()) throw Error(o, "pre_tokenizer.pretokenizers", "must be a non-empty array");
  for (std::size_t i = 0; i < list.size(); ++i) {
    std::string f = field_at("pre_tokenizer.pretokenizers", i);
    std::string sub = type_of(list[i], o, f);
    bool last = i + 1 == list.size();
    if (sub == "Split" && !last) {
      t.splitters.push_back(parse_split(list[i], o, f));
    } else if (sub == "ByteLevel" && last) {
      parse_byte_level(list[i], t, f);
    } else {
      throw Error(o, f + ".type",
                  "unsupported pre-tokenizer '" + sub + "' here: " + need + ", with ByteLevel last");
    }
  }
}

void parse_decoder(const json& j, const std::string& o) {
  const char* need = "a ByteLevel decoder is required";
  if (j.is_null()) throw Error(o, "decoder", need);
  std::string type = type_of(j, o, "decoder");
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = require(j, "decoders", o, "decoder.decoders");
    if (list.is_array() && list.size() == 1 && type_of(list[0], o, "decoder.decoders[0]") == "ByteLevel") return;
  }
  throw Error(o, "decoder.type", "unsupported decoder '" + type + "': " + need);
}

void parse_model(const json& m, Tokenizer::Impl& t) {
  const std::string& o = t.origin;
  if (!m.is_object()) throw Error(o, "model", "must be an object");
  auto type_it = m.find("type");
  if (type_it == m.end()) throw Error(o, "model.type", "missing (keel supports \"BPE\")");
  std::string type = get_string(*type_it, o, "model.type");
  if (type != "BPE") throw Error(o, "model.type", "unsupported model '" + type + "' (keel supports byte-level BPE)");
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0)
      throw Error(o, "model.dropout", "BPE dropout is not supported (must be null or 0)");
  }
  if (get_bool(m, "byte_fallback", false, o, "model"))
    throw Error(o, "model.byte_fallback", "byte fallback is not supported (byte-level BPE never needs it)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = m.find(key);
    if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      throw Error(o, std::string("model.") + key, "must be empty for byte-level BPE");
  }
  t.ignore_merges = get_bool(m, "ignore_merges", false, o, "model");
  if (auto it = m.find("unk_token"); it != m.end()) {
    if (!it->is_null() && !it->is_string()) throw Error(o, "model.unk_token", "must be a string or null");
    t.unk_token_json = it->dump();
  }

  const json& vocab = require(m, "vocab", o, "model.vocab");
  if (!vocab.is_object()) throw Error(o, "model.vocab", "must be an object of token -> id");
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    max_id = std::max(max_id, get_id(it.value(), o, "model.vocab[\"" + it.key() + "\"]"));
  t.id_text.assign(static_cast<std::size_t>(max_id) + 1, std::string());
  t.id_bytes.assign(static_cast<std::size_t>(max_id) + 1, std::string());
  t.id_used.assign(static_cast<std::size_t>(max_id) + 1, 0);
  std::unordered_map<char32_t, int> char_to_byte;
  for (int b = 0; b < 256; ++b) char_to_byte[t.byte_chars[b]] = b;
  t.vocab.reserve(vocab.size());
  std::vector<char32_t> cps;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int32_t id = it.value().get<int32_t>();
    std::string f = "model.vocab[\"" + it.key() + "\"]";
    if (it.key().empty()) throw Error(o, f, "empty token");
    if (t.id_used[id]) throw Error(o, f, "id " + std::to_string(id) + " is also used by \"" + t.id_text[id] + "\"");
    t.id_used[id] = kInVocab;
    t.id_text[id] = it.key();
    t.vocab.emplace(it.key(), id);
    // The ByteLevel decoder: a token made only of alphabet characters decodes to their bytes,
    // any other token to its own UTF-8 (what HF's decoder does).
    cps.clear();
    unicode::decode_utf8(it.key(), cps);
    std::string bytes;
    bool all_alphabet = true;
    for (char32_t c : cps) {
      auto b = char_to_byte.find(c);
      if (b == char_to_byte.end()) {
        all_alphabet = false;
        break;
      }
      bytes.push_back(static_cast<char>(b->second));
    }
    t.id_bytes[id] = all_alphabet ? bytes : it.key();
  }
  for (int b = 0; b < 256; ++b) {
    std::string text;
    unicode::append_utf8(t.byte_chars[b], text);
    auto it = t.vocab.find(text);
    if (it == t.vocab.end()) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", b);
      throw Error(o, "model.vocab", std::string("no token for byte ") + hex + " (\"" + text +
                                        "\"): a byte-level vocabulary must hold all 256 bytes");
    }
    t.byte_ids[b] = it->second;
  }

  const json& merges = require(m, "merges", o, "model.merges");
  if (!merges.is_array()) throw Error(o, "model.merges", "must be an array");
  t.merges.reserve(merges.size());
  t.merge_list.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    std::string f = field_at("model.merges", i);
    const json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {
      // The older format: "left right" (byte-level tokens never hold a plain space).
      std::string s = e.get<std::string>();
      auto space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size() ||
          s.find(' ', space + 1) != std::string::npos)
        throw Error(o, f, "a merge must be two tokens separated by one space");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw Error(o, f, "a merge must be \"left right\" or [\"left\", \"right\"]");
    }
    auto ia = t.vocab.find(a), ib = t.vocab.find(b), ic = t.vocab.find(a + b);
    if (ia == t.vocab.end()) throw Error(o, f, "token \"" + a + "\" is not in the vocabulary");
    if (ib == t.vocab.end()) throw Error(o, f, "token \"" + b + "\" is not in the vocabulary");
    if (ic == t.vocab.end()) throw Error(o, f, "merged token \"" + a + b + "\" is not in the vocabulary");
    // A repeated pair takes its last rank, as HF and transformers.js do.
    t.merges.set(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(i), ic->second});
    t.merge_list.emplace_back(ia->second, ib->second);
  }
}

void parse_added_tokens(const json& j, Tokenizer::Impl& t) {
  const std::string& o = t.origin;
  if (j.is_null()) return;
  if (!j.is_array()) throw Error(o, "added_tokens", "must be an array");
  for (std::size_t i = 0; i < j.size(); ++i) {
    std::string f = field_at("added_tokens", i);
    const json& e = j[i];
    if (!e.is_object()) throw Error(o, f, "must be an object");
    AddedToken a;
    a.id = get_id(require(e, "id", o, f + ".id"), o, f + ".id");
    a.content = get_string(require(e, "content", o, f + ".content"), o, f + ".content");
    if (a.content.empty()) throw Error(o, f + ".content", "empty token");
    a.special = get_bool(e, "special", false, o, f);
    a.normalized = get_bool(e, "normalized", !a.special, o, f);
    a.lstrip = get_bool(e, "lstrip", false, o, f);
    a.rstrip = get_bool(e, "rstrip", false, o, f);
    if (get_bool(e, "single_word", false, o, f))
      throw Error(o, f + ".single_word", "single_word added tokens are not supported");
    if (t.added_by_content.count(a.content)) throw Error(o, f + ".content", "\"" + a.content + "\" is added twice");
    if (static_cast<std::size_t>(a.id) >= t.id_used.size()) {
      t.id_used.resize(a.id + 1, 0);
      t.id_text.resize(a.id + 1);
      t.id_bytes.resize(a.id + 1);
    }
    // An added token may repeat a vocab entry (same id); it may not take another token's id.
    if ((t.id_used[a.id] & kAdded) || ((t.id_used[a.id] & kInVocab) && t.id_text[a.id] != a.content))
      throw Error(o, f + ".id", "id " + std::to_string(a.id) + " is already \"" + t.id_text[a.id] + "\"");
    if (!(t.id_used[a.id] & kInVocab)) {
      t.id_text[a.id] = a.content;
      t.id_bytes[a.id] = a.content;
    }
    t.id_used[a.id] |= kAdded;
    int index = static_cast<int>(t.added.size());
    t.added_by_content.emplace(a.content, index);
    (a.normalized && t.nfc ? t.normalized_added : t.raw_added).add(index, a.content);
    t.added.push_back(std::move(a));
  }
}

}  // namespace

Tokenizer Tokenizer::parse(std::string_view text, const std::string& origin) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw Error(origin, "", std::string("not valid JSON: ") + e.what());
  }
  if (!root.is_object()) throw Error(origin, "", "a tokenizer.json must be a JSON object");
  auto t = std::make_shared<Impl>();
  t->origin = origin;
  auto section = [&](const char* key) -> const json& {
    static const json null_json;
    auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  parse_model(require(root, "model", origin, "model"), *t);
  parse_normalizer(section("normalizer"), *t);
  parse_pre_tokenizer(section("pre_tokenizer"), *t);
  parse_decoder(section("decoder"), origin);
  parse_added_tokens(section("added_tokens"), *t);
  t->normalizer_json = section("normalizer");
  t->pre_tokenizer_json = section("pre_tokenizer");
  t->post_processor_json = section("post_processor");
  t->decoder_json = section("decoder");
  t->vocab_size = static_cast<int64_t>(t->id_used.size());
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    auto a = t->added_by_content.find(name);
    if (a != t->added_by_content.end()) {
      t->eos = t->added[a->second].id;
      break;
    }
    auto v = t->vocab.find(name);
    if (v != t->vocab.end()) {
      t->eos = v->second;
      break;
    }
  }
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::load(const std::string& path) {
  return parse(read_file(path, "the tokenizer"), path);
}

// ---------------------------------------------------------------------------------------------
// Encoding

void Tokenizer::Impl::bpe(std::vector<int32_t>& sym, std::vector<int32_t>& ranks) const {
  // Merge the lowest-ranked adjacent pair, the leftmost of equal ranks, until none is left
  // (Sennrich et al. 2016, section 3.2, applied with the learned merge order). Words are short,
  // so a scan over cached pair ranks beats a heap; long ones take bpe_long.
  if (sym.size() < 2) return;
  if (sym.size() > 64) return bpe_long(sym);
  ranks.resize(sym.size() - 1);
  auto rank_of = [&](std::size_t i) {
    const Merge* m = find_merge(sym[i], sym[i + 1]);
    return m ? m->rank : INT32_MAX;
  };
  for (std::size_t i = 0; i + 1 < sym.size(); ++i) ranks[i] = rank_of(i);
  while (!ranks.empty()) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < ranks.size(); ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == INT32_MAX) break;
    sym[best] = find_merge(sym[best], sym[best + 1])->result;
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(best));
    if (best < ranks.size()) ranks[best] = rank_of(best);
    if (best > 0) ranks[best - 1] = rank_of(best - 1);
  }
}

void Tokenizer::Impl::bpe_long(std::vector<int32_t>& sym) const {
  // The same merges in O(n log n): a linked list of symbols and a heap of candidate pairs
  // ordered by (rank, position). Entries go stale when a neighbour merges; they are checked
  // against the current symbols when popped.
  struct Node {
    int32_t symbol, prev, next;
  };
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = static_cast<int32_t>(sym.size());
  std::vector<Node> nodes(n);
  for (int32_t i = 0; i < n; ++i) nodes[i] = {sym[i], i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || nodes[pos].next < 0) return;
    const Merge* m = find_merge(nodes[pos].symbol, nodes[nodes[pos].next].symbol);
    if (m) heap.push({m->rank, pos, nodes[pos].symbol, nodes[nodes[pos].next].symbol});
  };
  std::vector<bool> alive(n, true);
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Node& left = nodes[c.pos];
    if (!alive[c.pos] || left.symbol != c.left || left.next < 0 || nodes[left.next].symbol != c.right) continue;
    int32_t right = left.next;
    left.symbol = find_merge(c.left, c.right)->result;
    alive[right] = false;
    left.next = nodes[right].next;
    if (left.next >= 0) nodes[left.next].prev = c.pos;
    push(left.prev);
    push(c.pos);
  }
  sym.clear();
  for (int32_t i = 0; i >= 0; i = nodes[i].next) sym.push_back(nodes[i].symbol);
}

void Tokenizer::Impl::encode_word(const std::vector<char32_t>& cps, uint32_t first, uint32_t last, Workspace& ws,
                                  std::vector<int32_t>& out) const {
  ws.bytes.clear();
  for (uint32_t i = first; i < last; ++i) unicode::append_utf8(cps[i], ws.bytes);
  if (ignore_merges) {
    // Llama 3 style: a word that is a token is taken whole, before any merge.
    std::string text;
    for (unsigned char b : ws.bytes) unicode::append_utf8(byte_chars[b], text);
    auto it = vocab.find(text);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  ws.symbols.clear();
  for (unsigned char b : ws.bytes) ws.symbols.push_back(byte_ids[b]);
  bpe(ws.symbols, ws.ranks);
  out.insert(out.end(), ws.symbols.begin(), ws.symbols.end());
}

void Tokenizer::Impl::encode_normalized(std::vector<char32_t>& cps, Workspace& ws, std::vector<int32_t>& out) const {
  // Each Split stage splits every piece of the one before (HF PreTokenizedString semantics).
  ws.pieces.clear();
  ws.pieces.emplace_back(0, static_cast<uint32_t>(cps.size()));
  for (const RegexSplitter& s : splitters) {
    ws.next_pieces.clear();
    for (auto [a, b] : ws.pieces) s.split(cps, a, b, ws.next_pieces);
    std::swap(ws.pieces, ws.next_pieces);
  }
  if (!add_prefix_space && !byte_level_regex) {
    for (auto [a, b] : ws.pieces) encode_word(cps, a, b, ws, out);
    return;
  }
  // ByteLevel with add_prefix_space and/or use_regex works on each incoming piece.
  for (auto [a, b] : ws.pieces) {
    ws.prefixed.clear();
    if (add_prefix_space && cps[a] != U' ') ws.prefixed.push_back(U' ');
    ws.prefixed.insert(ws.prefixed.end(), cps.begin() + a, cps.begin() + b);
    ws.sub_pieces.clear();
    if (byte_level_regex) {
      byte_level_regex->split(ws.prefixed, 0, static_cast<uint32_t>(ws.prefixed.size()), ws.sub_pieces);
    } else {
      ws.sub_pieces.emplace_back(0, static_cast<uint32_t>(ws.prefixed.size()));
    }
    for (auto [c, d] : ws.sub_pieces) encode_word(ws.prefixed, c, d, ws, out);
  }
}

void Tokenizer::Impl::encode_with_added(std::string_view text, bool raw, Workspace& ws,
                                        std::vector<int32_t>& out) const {
  const AddedTokenMatcher& matcher = raw ? raw_added : normalized_added;
  // Sections: text runs and added tokens, in order.
  struct Section {
    std::size_t begin, end;
    int added;  // index into `added`, or -1 for text
  };
  std::vector<Section> sections;
  std::size_t start = 0;
  if (!matcher.empty()) {
    for (std::size_t pos = 0; pos < text.size();) {
      int a = matcher.match_at(text, pos);
      if (a < 0) {
        ++pos;
        continue;
      }
      if (start < pos) sections.push_back({start, pos, -1});
      pos += added[a].content.size();
      sections.push_back({pos - added[a].content.size(), pos, a});
      start = pos;
    }
  }
  if (start < text.size()) sections.push_back({start, text.size(), -1});

  for (std::size_t i = 0; i < sections.size(); ++i) {
    const Section& s = sections[i];
    if (s.added >= 0) {
      out.push_back(added[s.added].id);
      continue;
    }
    std::vector<char32_t> cps;
    unicode::decode_utf8(text.substr(s.begin, s.end - s.begin), cps);
    // lstrip/rstrip tokens take the whitespace next to them.
    std::size_t lo = 0, hi = cps.size();
    if (i > 0 && sections[i - 1].added >= 0 && added[sections[i - 1].added].rstrip)
      while (lo < hi && unicode::is_space(cps[lo])) ++lo;
    if (i + 1 < sections.size() && sections[i + 1].added >= 0 && added[sections[i + 1].added].lstrip)
      while (hi > lo && unicode::is_space(cps[hi - 1])) --hi;
    if (lo == hi) continue;
    cps = std::vector<char32_t>(cps.begin() + static_cast<std::ptrdiff_t>(lo), cps.begin() + static_cast<std::ptrdiff_t>(hi));
    if (!raw) {
      encode_normalized(cps, ws, out);
      continue;
    }
    if (nfc) cps = unicode::nfc(cps);
    if (normalized_added.empty()) {
      encode_normalized(cps, ws, out);
    } else {
      encode_with_added(unicode::encode_utf8(cps), false, ws, out);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  Workspace ws;
  impl_->encode_with_added(text, true, ws, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= impl_->vocab_size || !impl_->id_used[id])
      throw Error(impl_->origin, "ids", "token id " + std::to_string(id) + " is not in the vocabulary");
    out += impl_->id_bytes[id];
  }
  return out;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  std::string key(token);
  if (auto a = impl_->added_by_content.find(key); a != impl_->added_by_content.end())
    return impl_->added[a->second].id;
  if (auto v = impl_->vocab.find(key); v != impl_->vocab.end()) return v->second;
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

bool Tokenizer::is_special(int32_t id) const {
  for (const AddedToken& a : impl_->added)
    if (a.id == id) return a.special;
  return false;
}

// ---------------------------------------------------------------------------------------------
// Saving

std::string Tokenizer::to_json() const {
  const Impl& t = *impl_;
  // Written by hand rather than through a JSON object: the vocabulary keeps id order (as HF
  // writes it), and large vocabularies stay fast.
  auto str = [](const std::string& s) { return json(s).dump(); };
  std::string out = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [";
  for (std::size_t i = 0; i < t.added.size(); ++i) {
    const AddedToken& a = t.added[i];
    out += i ? ",\n    " : "\n    ";
    out += "{\"id\": " + std::to_string(a.id) + ", \"content\": " + str(a.content) +
           ", \"single_word\": false, \"lstrip\": " + (a.lstrip ? "true" : "false") +
           ", \"rstrip\": " + (a.rstrip ? "true" : "false") + ", \"normalized\": " + (a.normalized ? "true" : "false") +
           ", \"special\": " + (a.special ? "true" : "false") + "}";
  }
  out += t.added.empty() ? "],\n" : "\n  ],\n";
  out += "  \"normalizer\": " + t.normalizer_json.dump() + ",\n";
  out += "  \"pre_tokenizer\": " + t.pre_tokenizer_json.dump() + ",\n";
  out += "  \"post_processor\": " + t.post_processor_json.dump() + ",\n";
  out += "  \"decoder\": " + t.decoder_json.dump() + ",\n";
  out += "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": " + t.unk_token_json +
         ",\n    \"continuing_subword_prefix\": \"\",\n    \"end_of_word_suffix\": \"\",\n"
         "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": " +
         (t.ignore_merges ? "true" : "false") + ",\n    \"vocab\": {";
  bool first = true;
  for (std::size_t id = 0; id < t.id_used.size(); ++id) {
    if (!(t.id_used[id] & kInVocab)) continue;
    out += first ? "\n      " : ",\n      ";
    first = false;
    out += str(t.id_text[id]) + ": " + std::to_string(id);
  }
  out += "\n    },\n    \"merges\": [";
  for (std::size_t i = 0; i < t.merge_list.size(); ++i) {
    out += i ? ",\n      " : "\n      ";
    out += '[';
    out += str(t.id_text[t.merge_list[i].first]);
    out += ", ";
    out += str(t.id_text[t.merge_list[i].second]);
    out += ']';
  }
  out += t.merge_list.empty() ? "]\n  }\n}\n" : "\n    ]\n  }\n}\n";
  return out;
}

void Tokenizer::save(const std::string& path) const { write_file_atomic(path, to_json()); }

}  // namespace keel::data
