#include "keel/data/token_file.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "keel/core/error.hpp"

namespace keel::data {

std::vector<std::vector<int32_t>> read_token_file(const std::string& path, int64_t vocab_size, int64_t max_len) {
  std::ifstream in(path);
  if (!in) throw Error(path, "", "cannot open the token file");
  std::vector<std::vector<int32_t>> lines;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string where = "line " + std::to_string(number);
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      if (i >= line.size()) break;
      size_t j = i;
      while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
      const std::string word = line.substr(i, j - i);
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(word.c_str(), &end, 10);
      if (end != word.c_str() + word.size() || errno == ERANGE) {
        throw Error(path, where, "'" + word + "' is not a token id (expected a non-negative integer)");
      }
      if (v < 0 || v >= vocab_size) {
        throw Error(path, where, "token id " + word + " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
      }
      ids.push_back(static_cast<int32_t>(v));
      i = j;
    }
    if (ids.empty()) continue;  // blank lines carry no sequence
    if (static_cast<int64_t>(ids.size()) > max_len) {
      throw Error(path, where, std::to_string(ids.size()) + " tokens exceed the context length " + std::to_string(max_len));
    }
    lines.push_back(std::move(ids));
  }
  if (in.bad()) throw Error(path, "", "read error");
  if (lines.empty()) throw Error(path, "", "the token file holds no token ids");
  return lines;
}

TokenBatch make_batch(const std::vector<std::vector<int32_t>>& lines, size_t begin, size_t end) {
  TokenBatch b;
  b.batch = static_cast<int64_t>(end - begin);
  for (size_t i = begin; i < end; ++i) b.seq = std::max<int64_t>(b.seq, static_cast<int64_t>(lines[i].size()));
  b.tokens.assign(static_cast<size_t>(b.batch * b.seq), 0);
  b.targets.assign(static_cast<size_t>(b.batch * b.seq), -1);
  for (size_t i = begin; i < end; ++i) {
    const auto& ids = lines[i];
    const size_t row = (i - begin) * static_cast<size_t>(b.seq);
    for (size_t t = 0; t < ids.size(); ++t) {
      b.tokens[row + t] = ids[t];
      if (t + 1 < ids.size()) {
        b.targets[row + t] = ids[t + 1];
        ++b.predicted;
      }
    }
  }
  return b;
}

}  // namespace keel::data
