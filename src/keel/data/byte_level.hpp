#pragma once
// GPT-2's byte-level alphabet: every byte is shown as one printable code point, so BPE can work
// on text without ever meeting whitespace or control characters (Radford et al. 2019, section
// 2.2; `bytes_to_unicode` in OpenAI's encoder.py). Printable Latin-1 bytes stand for themselves;
// the other 68 take the code points 256, 257, ... in byte order.
#include <array>
#include <cstdint>

namespace keel::data {

inline std::array<char32_t, 256> byte_to_char_table() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

}  // namespace keel::data
