// libFuzzer target for the tokenizer loader: any bytes, taken as tokenizer.json text, must
// either load or throw keel::Error. A tokenizer that loads must then encode and decode text
// (including a slice of the input's own bytes) without any error: every id it produces decodes.
#include <cstdint>
#include <string>

#include "keel/core/error.hpp"
#include "keel/data/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::optional<keel::data::Tokenizer> tok;
  try {
    tok = keel::data::Tokenizer::parse(text, "fuzz");
  } catch (const keel::Error&) {
    return 0;  // rejected file: the expected outcome for most mutations
  }
  // Outside the try: an exception from here on is a finding.
  std::string sample = "Hello, world! It's 12345 <|endoftext|> cafe\u0301 \xed\x95\x9c\xea\xb5\xad  \n\n\tx";
  sample.append(text, 0, std::min<size_t>(text.size(), 48));
  const std::vector<int32_t> ids = tok->encode(sample);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
  }
  (void)tok->decode(ids);
  (void)tok->eos_id();
  return 0;
}
