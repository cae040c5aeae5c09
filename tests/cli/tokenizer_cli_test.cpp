// `keel tokenize` and `keel tokenizer train` as a user runs them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_test_util.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;
using testing::run_keel;
using testing::source_path;

class TokenizerCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("keel_tokenizer_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream((dir_ / name).string(), std::ios::binary) << text;
    return (dir_ / name).string();
  }
  fs::path dir_;
};

TEST_F(TokenizerCli, TokenizeQwen3Json) {
  const std::string tok = source_path("cache/tokenizer-qwen3/models/tokenizer.json");
  if (!fs::exists(tok)) FAIL() << tok << " is missing: run scripts/fetch-data.sh before the tests";
  const std::string text = write("t.txt", "Hello world<|endoftext|> 안녕");
  auto r = run_keel("tokenize --tokenizer " + tok + " --text-file " + text + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], nlohmann::json::parse("[9707, 1879, 151643, 95170, 144370]"));
  r = run_keel("tokenize --tokenizer " + tok + " --text-file " + text);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "9707 1879 151643 95170 144370\n");
}

TEST_F(TokenizerCli, TrainThenTokenize) {
  std::string corpus;
  for (int i = 0; i < 20; ++i) corpus += "the cat sat on the mat and the dog sat on the log " + std::to_string(i) + "\n";
  const std::string text = write("corpus.txt", corpus);
  const std::string out = (dir_ / "tok.json").string();
  auto r = run_keel("tokenizer train --text " + text + " --vocab-size 300 --out " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("vocabulary 2"), std::string::npos) << r.out;  // at most 300: pairs seen once are not merged
  r = run_keel("tokenize --tokenizer " + out + " --text-file " + text + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_LT(nlohmann::json::parse(r.out)["ids"].size(), corpus.size() / 3);
}

TEST_F(TokenizerCli, BadInputIsOneLineAndExitTwo) {
  const std::string text = write("t.txt", "hello");
  auto r = run_keel("tokenize --tokenizer " + text + " --text-file " + text);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = run_keel("tokenizer train --text " + text + " --vocab-size 100 --out " + (dir_ / "x.json").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("vocab_size"), std::string::npos) << r.err;
  r = run_keel("tokenize --tokenizer /nonexistent.json --text-file " + text);
  EXPECT_EQ(r.status, 2);
}

}  // namespace
}  // namespace keel
