#pragma once
// The pre-tokenizer regexes of the GPT-2 / GPT-4 / Qwen / Llama 3 family, matched by hand
// instead of by a regex engine. A pattern is split into its top-level alternatives and each
// alternative must be one this file knows (a literal, a case-insensitive group of literals such
// as (?i:'s|'t|...), or one of the character-class shapes listed in pre_tokenizer.cpp); the
// alternatives are then tried in order at each position, as a backtracking regex engine would.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace keel::data {

// The GPT-2 pattern, which HF's ByteLevel pre-tokenizer applies when use_regex is true.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Qwen2/Qwen3 (and GPT-4-like, with single digits): what train_bpe uses.
inline constexpr const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class RegexSplitter {
 public:
  // Unsupported syntax: keel::Error(file, field, reason naming the alternative).
  static RegexSplitter from_pattern(const std::string& pattern, const std::string& file, const std::string& field);

  // Splits cps[begin, end) into pieces, appended as [first, last) index pairs. With HF's
  // "Isolated" behaviour: every match is a piece, and so is every run of unmatched text.
  void split(const std::vector<char32_t>& cps, uint32_t begin, uint32_t end,
             std::vector<std::pair<uint32_t, uint32_t>>& pieces) const;

  enum class Kind : uint8_t {
    kLiterals,       // 's or (?i:'s|'t|...)
    kLetters,        // \p{L}+ with an optional prefix (see Prefix)
    kNumbers,        // \p{N}, \p{N}{1,3}, \p{N}+, optionally after a space
    kOther,          // ' ?[^\s\p{L}\p{N}]+', optionally followed by [\r\n]*
    kNewlines,       // \s*[\r\n]+
    kSpacesNotLast,  // \s+(?!\S)
    kSpaces,         // \s+
  };
  enum class Prefix : uint8_t { kNone, kSpace, kNotNewlineOrAlnum };
  struct Alternative {
    Kind kind = Kind::kSpaces;
    Prefix prefix = Prefix::kNone;    // kLetters, kNumbers (kSpace only), kOther (kSpace only)
    uint32_t max_count = 0;           // kNumbers: at most this many (0: unbounded)
    bool trailing_newlines = false;   // kOther
    bool case_insensitive = false;    // kLiterals (ASCII folding)
    std::vector<std::u32string> literals;
  };

 private:
  // Length of the match of alternative a at cps[pos] (text ends at end), or 0.
  uint32_t match(const Alternative& a, const std::vector<char32_t>& cps, uint32_t pos, uint32_t end) const;
  std::vector<Alternative> alternatives_;
};

}  // namespace keel::data
