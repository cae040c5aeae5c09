#include "keel/data/unicode.hpp"

#include <algorithm>
#include <array>
#include <memory>
#include <unordered_map>

#include "keel/data/unicode_tables.hpp"

namespace keel::data::unicode {
namespace {

namespace tables = keel::data::unicode_tables;

// White_Space (PropList.txt): stable since Unicode 6.3, so kept by hand. Like oniguruma (HF
// tokenizers' regex engine) and unlike JavaScript's \s, U+0085 is a space and U+FEFF is not.
constexpr char32_t kWhiteSpace[] = {0x09,   0x0A,   0x0B,   0x0C,   0x0D,   0x20,   0x85,
                                    0xA0,   0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
                                    0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028,
                                    0x2029, 0x202F, 0x205F, 0x3000};

// Two-stage lookup (256 code points per block, identical blocks shared), built once from the
// generated ranges: a class lookup is two loads instead of a binary search.
class ClassTable {
 public:
  ClassTable() {
    std::vector<uint8_t> flat(0x110000, kOther);
    auto fill = [&](const tables::CodePointRange* rs, std::size_t n, uint8_t cls) {
      for (std::size_t i = 0; i < n; ++i)
        for (char32_t cp = rs[i].first; cp <= rs[i].last; ++cp) flat[cp] = cls;
    };
    fill(tables::kLetterRanges, tables::kLetterRangesCount, kLetter);
    fill(tables::kNumberRanges, tables::kNumberRangesCount, kNumber);
    for (char32_t cp : kWhiteSpace) flat[cp] = kSpace;
    stage1_.resize(0x110000 / 256);
    std::unordered_map<std::string, uint16_t> seen;
    for (std::size_t b = 0; b < stage1_.size(); ++b) {
      const uint8_t* block = flat.data() + b * 256;
      std::string key(reinterpret_cast<const char*>(block), 256);
      auto [it, inserted] = seen.emplace(key, static_cast<uint16_t>(seen.size()));
      if (inserted) blocks_.insert(blocks_.end(), block, block + 256);
      stage1_[b] = it->second;
    }
  }
  uint8_t get(char32_t cp) const {
    if (cp >= 0x110000) return kOther;
    return blocks_[static_cast<std::size_t>(stage1_[cp >> 8]) * 256 + (cp & 0xFF)];
  }

 private:
  std::vector<uint16_t> stage1_;
  std::vector<uint8_t> blocks_;
};

const ClassTable& class_table() {
  static const ClassTable table;
  return table;
}

// Hangul syllables compose and decompose by arithmetic (Unicode Standard, section 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* begin = tables::kDecompositions;
  const auto* end = begin + tables::kDecompositionsCount;
  const auto* it = std::lower_bound(begin, end, cp, [](const auto& d, char32_t c) { return d.cp < c; });
  if (it != end && it->cp == cp) {
    out.insert(out.end(), tables::kDecompositionData + it->offset,
               tables::kDecompositionData + it->offset + it->length);
  } else {
    out.push_back(cp);
  }
}

// The primary composite of (a, b), or 0 when there is none.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* begin = tables::kCompositions;
  const auto* end = begin + tables::kCompositionsCount;
  const auto* it = std::lower_bound(begin, end, std::make_pair(a, b), [](const auto& c, const auto& key) {
    return c.first != key.first ? c.first < key.first : c.second < key.second;
  });
  if (it != end && it->first == a && it->second == b) return it->composite;
  return 0;
}

}  // namespace

uint8_t char_class(char32_t cp) { return class_table().get(cp); }

uint8_t combining_class(char32_t cp) {
  if (cp < tables::kNfcQuickLimit) return 0;
  const auto* begin = tables::kCombiningClasses;
  const auto* end = begin + tables::kCombiningClassesCount;
  const auto* it = std::lower_bound(begin, end, cp, [](const auto& c, char32_t x) { return c.cp < x; });
  return (it != end && it->cp == cp) ? it->ccc : 0;
}

void decode_utf8(std::string_view s, std::vector<char32_t>& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    // Lengths and the tighter second-byte ranges of RFC 3629 (no overlongs, no surrogates,
    // nothing above U+10FFFF).
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    char32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0F;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    bool ok = len != 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) {
      unsigned char b = p[i + k];
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) ok = false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (ok) {
      out.push_back(cp);
      i += len;
    } else {
      out.push_back(kRawByteBase + c);
      ++i;
    }
  }
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < kRawByteBase) {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(cp - kRawByteBase));
  }
}

std::string encode_utf8(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) append_utf8(cp, out);
  return out;
}

std::vector<char32_t> nfc(const std::vector<char32_t>& cps) {
  bool quick = std::all_of(cps.begin(), cps.end(), [](char32_t c) { return c < tables::kNfcQuickLimit; });
  if (quick) return cps;

  std::vector<char32_t> d;
  d.reserve(cps.size() + 8);
  for (char32_t cp : cps) {
    if (cp < tables::kNfcQuickLimit || cp >= kRawByteBase) {
      d.push_back(cp);
    } else {
      decompose(cp, d);
    }
  }
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (std::size_t i = 1; i < d.size(); ++i) {
    uint8_t cc = combining_class(d[i]);
    if (cc == 0) continue;
    std::size_t j = i;
    while (j > 0 && combining_class(d[j - 1]) > cc) {
      std::swap(d[j], d[j - 1]);
      --j;
    }
  }
  // Canonical composition: each character joins the last starter unless a character between
  // them is blocking (class 0, or a class not below its own).
  std::vector<char32_t> out;
  out.reserve(d.size());
  std::ptrdiff_t starter = -1;
  for (char32_t c : d) {
    uint8_t cc = combining_class(c);
    if (starter >= 0) {
      bool adjacent = static_cast<std::size_t>(starter) + 1 == out.size();
      uint8_t last_cc = adjacent ? 0 : combining_class(out.back());
      bool blocked = !adjacent && (last_cc == 0 || last_cc >= cc);
      if (!blocked) {
        char32_t composite = compose_pair(out[starter], c);
        if (composite != 0) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = static_cast<std::ptrdiff_t>(out.size());
    out.push_back(c);
  }
  return out;
}

}  // namespace keel::data::unicode
