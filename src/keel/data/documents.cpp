#include "keel/data/documents.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel::data {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

bool is_brown_tag_char(char c) { return (c >= 'a' && c <= 'z') || std::strchr("$'()*+,-.:`", c) != nullptr; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (is_space(s.front()) || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (is_space(s.back()) || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool looks_brown_tagged(std::string_view text) {
  int tokens = 0, tagged = 0;
  size_t i = 0;
  while (i < text.size() && tokens < 1000) {
    while (i < text.size() && (is_space(text[i]) || text[i] == '\n')) ++i;
    size_t j = i;
    while (j < text.size() && !is_space(text[j]) && text[j] != '\n') ++j;
    if (j == i) break;
    const std::string_view token = text.substr(i, j - i);
    ++tokens;
    const size_t slash = token.rfind('/');
    if (slash != std::string_view::npos && slash > 0 && slash + 1 < token.size()) {
      const std::string_view tag = token.substr(slash + 1);
      if (std::all_of(tag.begin(), tag.end(), is_brown_tag_char)) ++tagged;
    }
    i = j;
  }
  return tagged >= 3 && tagged * 10 >= tokens * 9;
}

std::vector<Document> documents_from_text(const std::string& name, std::string_view text) {
  // Pieces between lines that hold only the end-of-text marker.
  std::vector<std::string_view> pieces;
  size_t piece_start = 0, line_start = 0;
  while (line_start < text.size()) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = text.size();
    if (trim(text.substr(line_start, line_end - line_start)) == kEndOfText) {
      pieces.push_back(text.substr(piece_start, line_start - piece_start));
      piece_start = std::min(line_end + 1, text.size());
    }
    line_start = line_end + 1;
  }
  pieces.push_back(text.substr(piece_start));

  const bool brown = looks_brown_tagged(text);
  std::vector<Document> docs;
  for (size_t k = 0; k < pieces.size(); ++k) {
    std::string body = brown ? strip_brown_tags(pieces[k]) : std::string(pieces[k]);
    if (trim(body).empty()) continue;
    std::string doc_name = pieces.size() == 1 ? name : name + "#" + std::to_string(k);
    docs.push_back({std::move(doc_name), std::move(body)});
  }
  return docs;
}

std::vector<Document> read_documents(const std::vector<std::string>& paths) {
  std::vector<Document> docs;
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st)) throw Error(path, "", "no such file or directory");
    std::vector<std::string> files;
    if (fs::is_directory(st)) {
      fs::recursive_directory_iterator it(path, fs::directory_options::skip_permission_denied, ec), end;
      for (; !ec && it != end; it.increment(ec)) {
        const std::string base = it->path().filename().string();
        if (!base.empty() && base[0] == '.') {
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file()) files.push_back(it->path().string());
      }
      if (ec) throw Error(path, "", "cannot list the directory: " + ec.message());
      if (files.empty()) throw Error(path, "", "directory holds no text files");
      std::sort(files.begin(), files.end());
    } else if (fs::is_regular_file(st)) {
      files.push_back(path);
    } else {
      throw Error(path, "", "neither a regular file nor a directory");
    }
    std::vector<std::string> texts;
    bool any_brown = false;
    for (const std::string& file : files) {
      texts.push_back(read_file(file, "the text file"));
      any_brown = any_brown || looks_brown_tagged(texts.back());
    }
    for (size_t i = 0; i < files.size(); ++i) {
      // In a directory of Brown corpus files the untagged ones are its README, CONTENTS and
      // packaging, not corpus text.
      if (any_brown && fs::is_directory(st) && !looks_brown_tagged(texts[i])) continue;
      for (Document& d : documents_from_text(files[i], texts[i])) docs.push_back(std::move(d));
    }
  }
  return docs;
}

}  // namespace keel::data
