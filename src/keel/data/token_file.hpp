#pragma once
// Token files for `keel eval`, `keel grad` and the minimal `keel train`: text, one sequence per
// line, whitespace-separated token ids. A line of n ids predicts n − 1 next tokens.
#include <cstdint>
#include <string>
#include <vector>

namespace keel::data {

struct TokenBatch {
  int64_t batch = 0;
  int64_t seq = 0;
  std::vector<int32_t> tokens;   // (batch, seq), right-padded with 0
  std::vector<int32_t> targets;  // (batch, seq): next token, or -1 where nothing is predicted
  int64_t predicted = 0;         // targets != -1
};

// Throws keel::Error(path, "line N", reason) for an empty file, a non-numeric id, an id outside
// [0, vocab_size), or a line longer than max_len.
std::vector<std::vector<int32_t>> read_token_file(const std::string& path, int64_t vocab_size, int64_t max_len);

// Packs lines [begin, end) into one right-padded batch. Causal attention means padding at the end
// of a sequence changes nothing before it, and padded positions predict nothing.
TokenBatch make_batch(const std::vector<std::vector<int32_t>>& lines, size_t begin, size_t end);

}  // namespace keel::data
