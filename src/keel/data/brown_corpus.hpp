#pragma once
// The Brown corpus (Francis & Kucera, 1964/1979), as scripts/fetch-data.sh unpacks it: 500 files
// c[a-r][0-9][0-9] of word/TAG tokens, one sentence per tab-indented line.
#include <string>
#include <string_view>
#include <vector>

namespace keel::data {

// Plain text from one tagged file. Per line: split on runs of spaces and tabs; each token
// becomes the text before its LAST '/' (words such as "1/2/cd" hold slashes); the words are
// joined by one space; lines without tokens are dropped; the lines are joined by "\n" and the
// text ends with "\n" (empty input gives ""). tools/make_tokenizer_fixture.mjs uses the same rule.
std::string strip_brown_tags(std::string_view tagged);

// The corpus files in DIR (names c[a-r][0-9][0-9]), sorted; keel::Error(dir, "", reason) when
// there are none.
std::vector<std::string> brown_corpus_files(const std::string& dir);

}  // namespace keel::data
