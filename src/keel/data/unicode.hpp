#pragma once
// The Unicode the tokenizer needs: UTF-8 decoding that keeps invalid bytes, the character
// classes of the pre-tokenizer regex (\p{L}, \p{N}, \s) and NFC normalization (UAX #15).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace keel::data::unicode {

// Bytes that are not valid UTF-8 decode to kRawByteBase + byte: outside Unicode, of no class,
// untouched by NFC, and encoded back to the same single byte, so text round-trips exactly.
inline constexpr char32_t kRawByteBase = 0x110000;

enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 4 };

// \p{L} -> kLetter, \p{N} -> kNumber, White_Space -> kSpace; anything else (and raw bytes) kOther.
uint8_t char_class(char32_t cp);
inline bool is_letter(char32_t cp) { return char_class(cp) == kLetter; }
inline bool is_number(char32_t cp) { return char_class(cp) == kNumber; }
inline bool is_space(char32_t cp) { return char_class(cp) == kSpace; }

// Appends the code points of utf8 to out (invalid bytes as kRawByteBase + byte).
void decode_utf8(std::string_view utf8, std::vector<char32_t>& out);
// Appends the UTF-8 of one code point (a raw byte as itself).
void append_utf8(char32_t cp, std::string& out);
std::string encode_utf8(const std::vector<char32_t>& cps);

// Canonical decomposition, canonical ordering and canonical composition (UAX #15, section 3).
std::vector<char32_t> nfc(const std::vector<char32_t>& cps);
uint8_t combining_class(char32_t cp);

}  // namespace keel::data::unicode
