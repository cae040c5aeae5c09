#include "keel/data/brown_corpus.hpp"

#include <algorithm>
#include <filesystem>

#include "keel/core/error.hpp"

namespace keel::data {

std::string strip_brown_tags(std::string_view tagged) {
  std::string out;
  std::size_t pos = 0;
  while (pos < tagged.size()) {
    std::size_t eol = tagged.find('\n', pos);
    if (eol == std::string_view::npos) eol = tagged.size();
    std::string_view line = tagged.substr(pos, eol - pos);
    pos = eol + 1;
    bool first = true;
    std::size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      std::size_t start = i;
      while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
      if (start == i) break;
      std::string_view token = line.substr(start, i - start);
      std::size_t slash = token.rfind('/');
      if (!first) out += ' ';
      out += token.substr(0, slash == std::string_view::npos ? token.size() : slash);
      first = false;
    }
    if (!first) out += '\n';
  }
  return out;
}

std::vector<std::string> brown_corpus_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' && std::isdigit(static_cast<unsigned char>(name[2])) &&
        std::isdigit(static_cast<unsigned char>(name[3])))
      files.push_back(it->path().string());
  }
  if (ec) throw Error(dir, "", "cannot list: " + ec.message());
  if (files.empty()) throw Error(dir, "", "no Brown corpus files (c[a-r][0-9][0-9]); run scripts/fetch-data.sh");
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace keel::data
