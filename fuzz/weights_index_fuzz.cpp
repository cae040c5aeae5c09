// libFuzzer target for model.safetensors.index.json: any bytes must either give a weight map
// whose every shard is a plain file name beside the index, or throw keel::Error; never crash.
#include <cstdint>
#include <string>

#include "keel/core/error.hpp"
#include "keel/io/hf_checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto map = keel::io::HfWeights::parse_index(text, "fuzz");
    for (const auto& [tensor, shard] : map) {
      // The parser's promise: nothing that leaves the folder.
      if (shard.find('/') != std::string::npos || shard.starts_with(".") || !shard.ends_with(".safetensors")) {
        __builtin_trap();
      }
    }
  } catch (const keel::Error&) {
  }
  return 0;
}
