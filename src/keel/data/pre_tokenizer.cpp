#include "keel/data/pre_tokenizer.hpp"

#include "keel/core/error.hpp"
#include "keel/data/unicode.hpp"

namespace keel::data {
namespace {

using unicode::char_class;
using unicode::kLetter;
using unicode::kNumber;
using unicode::kOther;
using unicode::kSpace;

// Splits a pattern at its top-level '|' (outside groups and character classes).
std::vector<std::string> top_level_alternatives(const std::string& p) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      cur += c;
      cur += p[++i];
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
    } else if (c == '[') {
      in_class = true;
    } else if (c == '(') {
      ++depth;
    } else if (c == ')') {
      --depth;
    } else if (c == '|' && depth == 0) {
      out.push_back(cur);
      cur.clear();
      continue;
    }
    cur += c;
  }
  out.push_back(cur);
  return out;
}

bool is_plain_literal(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) return false;
  return true;
}

std::u32string to_u32(const std::string& s) {
  std::vector<char32_t> cps;
  unicode::decode_utf8(s, cps);
  return std::u32string(cps.begin(), cps.end());
}

char32_t ascii_lower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

}  // namespace

RegexSplitter RegexSplitter::from_pattern(const std::string& pattern, const std::string& file,
                                          const std::string& field) {
  using K = Kind;
  using P = Prefix;
  struct Known {
    const char* text;
    Alternative alt;
  };
  const Known known[] = {
      {R"([^\r\n\p{L}\p{N}]?\p{L}+)", {K::kLetters, P::kNotNewlineOrAlnum, 0, false, false, {}}},
      {R"( ?\p{L}+)", {K::kLetters, P::kSpace, 0, false, false, {}}},
      {R"(\p{L}+)", {K::kLetters, P::kNone, 0, false, false, {}}},
      {R"(\p{N})", {K::kNumbers, P::kNone, 1, false, false, {}}},
      {R"(\p{N}{1,3})", {K::kNumbers, P::kNone, 3, false, false, {}}},
      {R"(\p{N}+)", {K::kNumbers, P::kNone, 0, false, false, {}}},
      {R"( ?\p{N}+)", {K::kNumbers, P::kSpace, 0, false, false, {}}},
      {R"( ?[^\s\p{L}\p{N}]+[\r\n]*)", {K::kOther, P::kSpace, 0, true, false, {}}},
      {R"( ?[^\s\p{L}\p{N}]+)", {K::kOther, P::kSpace, 0, false, false, {}}},
      {R"(\s*[\r\n]+)", {K::kNewlines, P::kNone, 0, false, false, {}}},
      {R"(\s+(?!\S))", {K::kSpacesNotLast, P::kNone, 0, false, false, {}}},
      {R"(\s+)", {K::kSpaces, P::kNone, 0, false, false, {}}},
  };
  RegexSplitter out;
  for (const std::string& text : top_level_alternatives(pattern)) {
    bool matched = false;
    for (const Known& k : known) {
      if (text == k.text) {
        out.alternatives_.push_back(k.alt);
        matched = true;
        break;
      }
    }
    if (matched) continue;
    // A group of literals: (?i:a|b|c) or (?:a|b|c).
    bool ci = text.rfind("(?i:", 0) == 0;
    bool nc = text.rfind("(?:", 0) == 0;
    if ((ci || nc) && text.back() == ')') {
      std::string inner = text.substr(ci ? 4 : 3, text.size() - (ci ? 5 : 4));
      Alternative alt;
      alt.kind = K::kLiterals;
      alt.case_insensitive = ci;
      bool ok = true;
      for (const std::string& lit : top_level_alternatives(inner)) {
        if (!is_plain_literal(lit)) ok = false;
        alt.literals.push_back(to_u32(lit));
      }
      if (ok) {
        out.alternatives_.push_back(std::move(alt));
        continue;
      }
    } else if (is_plain_literal(text)) {
      Alternative alt;
      alt.kind = K::kLiterals;
      alt.literals.push_back(to_u32(text));
      out.alternatives_.push_back(std::move(alt));
      continue;
    }
    throw Error(file, field,
                "unsupported regex alternative '" + text +
                    "' (keel matches the GPT-2/GPT-4/Qwen/Llama-3 pre-tokenizer family by hand; see docs/tokenizer.md)");
  }
  return out;
}

uint32_t RegexSplitter::match(const Alternative& a, const std::vector<char32_t>& cps, uint32_t pos,
                              uint32_t end) const {
  auto cls = [&](uint32_t i) { return char_class(cps[i]); };
  auto is_newline = [&](uint32_t i) { return cps[i] == '\r' || cps[i] == '\n'; };
  switch (a.kind) {
    case Kind::kLiterals: {
      // Alternatives of a group are tried in order; the first that matches wins.
      for (const std::u32string& lit : a.literals) {
        if (lit.size() > end - pos) continue;
        bool ok = true;
        for (std::size_t k = 0; k < lit.size() && ok; ++k) {
          char32_t c = cps[pos + k];
          ok = a.case_insensitive ? ascii_lower(c) == ascii_lower(lit[k]) : c == lit[k];
        }
        if (ok) return static_cast<uint32_t>(lit.size());
      }
      return 0;
    }
    case Kind::kLetters: {
      uint32_t i = pos;
      if (cls(i) != kLetter) {
        // The optional prefix character must be followed by a letter, else nothing matches.
        bool prefix_ok = false;
        switch (a.prefix) {
          case Prefix::kNone: break;
          case Prefix::kSpace: prefix_ok = cps[i] == ' '; break;
          case Prefix::kNotNewlineOrAlnum: prefix_ok = !is_newline(i) && cls(i) != kNumber; break;
        }
        if (!prefix_ok || i + 1 >= end || cls(i + 1) != kLetter) return 0;
        ++i;
      }
      while (i < end && cls(i) == kLetter) ++i;
      return i - pos;
    }
    case Kind::kNumbers: {
      uint32_t i = pos;
      if (a.prefix == Prefix::kSpace && cps[i] == ' ' && i + 1 < end && cls(i + 1) == kNumber) ++i;
      uint32_t first = i;
      while (i < end && cls(i) == kNumber && (a.max_count == 0 || i - first < a.max_count)) ++i;
      return i == first ? 0 : i - pos;
    }
    case Kind::kOther: {
      uint32_t i = pos;
      if (a.prefix == Prefix::kSpace && cps[i] == ' ' && i + 1 < end && cls(i + 1) == kOther) ++i;
      uint32_t first = i;
      while (i < end && cls(i) == kOther) ++i;
      if (i == first) return 0;
      if (a.trailing_newlines)
        while (i < end && is_newline(i)) ++i;
      return i - pos;
    }
    case Kind::kNewlines: {
      // \s* is greedy and gives back until [\r\n]+ matches: the match ends after the last
      // newline of the whitespace run.
      uint32_t i = pos, last_newline_end = 0;
      while (i < end && cls(i) == kSpace) {
        if (is_newline(i)) last_newline_end = i + 1;
        ++i;
      }
      return last_newline_end == 0 ? 0 : last_newline_end - pos;
    }
    case Kind::kSpacesNotLast: {
      // \s+ followed by no non-space: the whole run at the end of the text, else the run
      // minus its last space (which then goes with the following word).
      uint32_t i = pos;
      while (i < end && cls(i) == kSpace) ++i;
      if (i == end) return i - pos;
      return i - pos >= 2 ? i - pos - 1 : 0;
    }
    case Kind::kSpaces: {
      uint32_t i = pos;
      while (i < end && cls(i) == kSpace) ++i;
      return i - pos;
    }
  }
  return 0;
}

void RegexSplitter::split(const std::vector<char32_t>& cps, uint32_t begin, uint32_t end,
                          std::vector<std::pair<uint32_t, uint32_t>>& pieces) const {
  uint32_t gap = begin, pos = begin;
  while (pos < end) {
    uint32_t len = 0;
    for (const Alternative& a : alternatives_) {
      len = match(a, cps, pos, end);
      if (len != 0) break;
    }
    if (len == 0) {
      ++pos;
      continue;
    }
    if (gap < pos) pieces.emplace_back(gap, pos);
    pieces.emplace_back(pos, pos + len);
    pos += len;
    gap = pos;
  }
  if (gap < end) pieces.emplace_back(gap, end);
}

}  // namespace keel::data
