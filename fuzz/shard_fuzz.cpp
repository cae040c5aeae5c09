// libFuzzer target for the token-shard reader: any bytes must either open cleanly or throw
// keel::Error, never crash or read outside the buffer (ASan watches). A shard that opens is read
// in full, its document table walked and its data checksum checked; one whose data checksum
// holds must survive a round trip through the writer byte for byte.
#include <cstdint>
#include <string>
#include <vector>

#include "keel/core/error.hpp"
#include "keel/data/shards.hpp"

namespace {

[[noreturn]] void fail() { __builtin_trap(); }

void check(const keel::data::TokenShard& shard, const std::string& bytes) {
  std::vector<int32_t> tokens(static_cast<size_t>(shard.size()));
  bool all_readable = true;
  try {
    shard.read(0, shard.size(), tokens.data());
  } catch (const keel::Error&) {
    all_readable = false;  // an id at or above the recorded limit
  }
  std::vector<int64_t> starts;
  if (shard.has_document_table()) {
    for (int64_t d = 0; d < shard.documents(); ++d) starts.push_back(shard.document_start(d));
  }
  try {
    shard.verify_data();
  } catch (const keel::Error&) {
    return;
  }
  if (!all_readable || !shard.has_document_table()) return;
  for (int32_t t : tokens) {
    if (t < 0 || t >= shard.token_limit()) fail();
  }
  // The writer records the true limit (max id + 1); a valid file may record a larger one.
  const std::string again = keel::data::encode_shard(tokens, starts, shard.token_bytes(), "fuzz-roundtrip");
  const auto reread = keel::data::TokenShard::from_bytes(again, "fuzz-roundtrip");
  if (reread.size() != shard.size() || reread.documents() != shard.documents()) fail();
  if (reread.token_limit() == shard.token_limit() && again != bytes) fail();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const auto shard = keel::data::TokenShard::from_bytes(bytes, "fuzz");
    check(shard, bytes);
  } catch (const keel::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
