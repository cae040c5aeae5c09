// `keel inspect` as a user runs it: tables, JSON, side by side, overrides, and bad input
// answered by one line on stderr and exit status 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_test_util.hpp"

namespace keel {
namespace {

using testing::run_keel;
using testing::source_path;

TEST(InspectCli, JsonForOneConfig) {
  auto r = run_keel("inspect --json " + source_path("configs/hf/kimi-k2-instruct.json"));
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["params"]["total"], 1'026'408'232'448);
  EXPECT_EQ(j["params"]["active"], 32'861'500'928);
  EXPECT_EQ(j["architecture"]["attention"]["kind"], "MLA");
  EXPECT_EQ(j["architecture"]["moe"]["num_experts"], 384);
}

TEST(InspectCli, FolderAndOverrides) {
  auto r = run_keel("inspect --json --set num_hidden_layers=4 --set tie_word_embeddings=true " +
                    source_path("configs/hf/llama-3.1-8b.json"));
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"]["num_hidden_layers"], 4);
  EXPECT_EQ(j["params"]["total"], int64_t{128256} * 4096 + 4096 + 4 * int64_t{218'112'000});
  EXPECT_DOUBLE_EQ(j["architecture"]["embed_scale"].get<double>(), 1.0);

  // keel.embed_scale from --set: √4096 = 64 in the JSON and the table; a bad value names the key.
  auto scaled = run_keel("inspect --json --set keel.embed_scale=sqrt_hidden " + source_path("configs/hf/llama-3.1-8b.json"));
  ASSERT_EQ(scaled.status, 0) << scaled.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(scaled.out)["architecture"]["embed_scale"].get<double>(), 64.0);
  auto table = run_keel("inspect --set keel.embed_scale=2.5 " + source_path("configs/hf/llama-3.1-8b.json"));
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("embedding scale          2.5"), std::string::npos) << table.out;
  auto bad = run_keel("inspect --set keel.embed_scale=-1 " + source_path("configs/hf/llama-3.1-8b.json"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("keel.embed_scale"), std::string::npos) << bad.err;
}

TEST(InspectCli, SideBySideTableAndJsonArray) {
  const std::string a = source_path("configs/hf/qwen3-8b.json");
  const std::string b = source_path("configs/hf/mixtral-8x7b-v0.1.json");
  auto t = run_keel("inspect " + a + " " + b);
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("8,190,735,360"), std::string::npos);
  EXPECT_NE(t.out.find("46,702,792,704"), std::string::npos);
  EXPECT_NE(t.out.find("SwiGLU"), std::string::npos);
  auto j = run_keel("inspect --json --seq 1024 " + a + " " + b);
  ASSERT_EQ(j.status, 0) << j.err;
  auto arr = nlohmann::json::parse(j.out);
  ASSERT_TRUE(arr.is_array());
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_EQ(arr[1]["params"]["active"], 12'879'925'248);
  EXPECT_EQ(arr[0]["flops"]["seq"], 1024);
}

TEST(InspectCli, HelpExplainsOptions) {
  auto r = run_keel("inspect --help");
  EXPECT_EQ(r.status, 0);
  for (const char* opt : {"--json", "--set", "--seq"}) EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
  auto top = run_keel("--help");
  EXPECT_EQ(top.status, 0);
  EXPECT_NE(top.out.find("inspect"), std::string::npos);
}

class InspectBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("keel_bad_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // One line on stderr naming the file and containing `needle`, exit 2, nothing on stdout.
  void expect_clean_error(const std::string& path, const std::string& needle, const std::string& extra = "") {
    auto r = run_keel("inspect " + extra + " " + path);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
    EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  }
  std::filesystem::path dir_;
};

TEST_F(InspectBadInput, EveryClassGivesOneLineAndStatusTwo) {
  const std::string good = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100)";
  expect_clean_error(write("text.json", "this is not json"), "not valid JSON");
  expect_clean_error(write("array.json", "[1, 2, 3]"), "JSON object");
  expect_clean_error(write("missing.json", R"({"model_type": "llama", "hidden_size": 64})"), "is required but missing");
  expect_clean_error(write("type.json", good + R"(, "num_key_value_heads": "two"})"), "'num_key_value_heads'");
  expect_clean_error(write("zero.json", good + R"(, "num_key_value_heads": 0})"), "must be positive");
  expect_clean_error(write("neg.json", R"({"model_type": "llama", "hidden_size": -64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100})"), "'hidden_size'");
  expect_clean_error(write("heads.json", good + R"(, "hidden_size": 66})"), "not divisible");
  expect_clean_error(write("kv.json", good + R"(, "num_key_value_heads": 3})"), "'num_key_value_heads'");
  expect_clean_error(write("type2.json", R"({"model_type": "t5", "d_model": 8})"), "supported: gpt2");
  expect_clean_error(write("act.json", good + R"(, "hidden_act": "mish"})"), "'hidden_act'");
  expect_clean_error((dir_ / "nope.json").string(), "no such file");
  std::filesystem::create_directories(dir_ / "empty_model");
  expect_clean_error((dir_ / "empty_model").string(), "no config.json");
  expect_clean_error(write("ok.json", good + "}"), "key=value", "--set oops");
}

TEST_F(InspectBadInput, UnknownOptionIsAnErrorToo) {
  auto r = run_keel("inspect --no-such-flag " + source_path("configs/hf/gpt2.json"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("no-such-flag"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace keel
