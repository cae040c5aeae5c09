#pragma once
// Raw text into documents, the unit a prepared dataset splits into train and val. A text file
// is one document, except that lines holding only "<|endoftext|>" separate documents inside a
// file (the layout of corpora such as TinyStories). Files in the Brown corpus's tagged form
// ("The/at Fulton/np-tl ...") are recognized and reduced to their plain words.
#include <string>
#include <string_view>
#include <vector>

#include "keel/data/brown_corpus.hpp"

namespace keel::data {

struct Document {
  std::string name;  // where it came from: "PATH", or "PATH#K" for the K-th document of a file
  std::string text;
};

// A path may be a file or a directory (all regular files under it, recursively, in name order;
// names starting with '.' are skipped; in a directory holding Brown-tagged files, the files
// that are not tagged, such as the corpus's README, are skipped too). keel::Error(path, "", reason) for a path that does not
// exist or cannot be read, or a directory without files.
std::vector<Document> read_documents(const std::vector<std::string>& paths);

// The documents of one file's text: split at lines holding only "<|endoftext|>", Brown tags
// stripped when the text looks tagged, empty documents dropped.
std::vector<Document> documents_from_text(const std::string& name, std::string_view text);

// strip_brown_tags (the rule for tagged files) lives in brown_corpus.hpp.

// True when nearly all (>= 90%) of the first 1000 whitespace-separated tokens are word/tag with
// a Brown tag (lowercase letters and $'()*+,-.:`), and there are at least 3 of them.
bool looks_brown_tagged(std::string_view text);

}  // namespace keel::data
