// `keel inspect` as a user runs it: tables, JSON, side by side, overrides, and bad input
// answered by one line on stderr and exit status 2.
#include <gtest/gtest.h>

#include <cmath>

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

// A KEEL_* setting with a value keel does not take stops every command before it starts, in one
// line naming the setting, the value and the values it takes; a value it takes runs.
TEST(InspectCli, UnknownEnvironmentSettingIsOneLineAndExit2) {
  const std::string config = source_path("configs/hf/qwen3-0.6b.json");
  auto bad = run_keel("inspect --json " + config, "KEEL_GEMM=packd");
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(bad.out.empty()) << bad.out;
  EXPECT_EQ(bad.err,
            "keel: error: environment: KEEL_GEMM: 'packd' is not a value it takes (auto, packed, backend, openblas)\n");
  auto threads = run_keel("inspect --json " + config, "KEEL_THREADS=fixd");
  EXPECT_EQ(threads.status, 2);
  EXPECT_NE(threads.err.find("KEEL_THREADS: 'fixd'"), std::string::npos) << threads.err;
  auto good = run_keel("inspect --json " + config, "KEEL_GEMM=packed KEEL_THREADS=fixed KEEL_DENORMALS=flush");
  EXPECT_EQ(good.status, 0) << good.err;
  EXPECT_TRUE(good.err.empty()) << good.err;
  // Help and the version run no command, so they answer under a bad setting too.
  for (const char* ask : {"--help", "bench --help", "train -h", "--version"}) {
    auto help = run_keel(ask, "KEEL_GEMM=packd");
    EXPECT_EQ(help.status, 0) << ask << ": " << help.err;
    EXPECT_TRUE(help.err.empty()) << ask << ": " << help.err;
    EXPECT_NE(help.out.find(std::string(ask) == "--version" ? "keel 0.1.0" : "Usage:"), std::string::npos)
        << ask << ": " << help.out;
  }
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
  // The Gemma fields: an unknown layer type, a list of the wrong length, a window wider than the
  // context, and a multimodal Gemma 3 config without its text_config.
  const std::string gemma = R"({"model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
      "vocab_size": 100, "max_position_embeddings": 256)";
  expect_clean_error(write("types.json", gemma + R"(, "layer_types": ["sliding_attention", "chunked_attention"]})"),
                     "field 'layer_types': entry 1 is 'chunked_attention'");
  expect_clean_error(write("types_len.json", gemma + R"(, "layer_types": ["sliding_attention"]})"),
                     "field 'layer_types': has 1 entries but num_hidden_layers is 2");
  expect_clean_error(write("window.json", gemma + R"(, "sliding_window": 4096})"),
                     "field 'sliding_window': 4096 exceeds max_position_embeddings (256)");
  expect_clean_error(write("gemma3.json", R"({"model_type": "gemma3", "vision_config": {}})"),
                     "field 'text_config': missing");
  expect_clean_error(write("gemma3_types.json", R"({"model_type": "gemma3", "text_config": {"num_hidden_layers": 2,
      "layer_types": ["full_attention", "sliding"]}})"), "field 'text_config.layer_types'");
}

TEST(InspectCli, GemmaAndOlmoFieldsInTheTableAndJson) {
  auto r = run_keel("inspect --json " + source_path("configs/hf/gemma-2-2b-it.json"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& a = j["architecture"];
  EXPECT_EQ(j["params"]["total"], 2'614'341'888);
  EXPECT_EQ(a["norm"]["form"], "x_hat*(1+w)");
  EXPECT_EQ(a["norm"]["placement"], "sandwich");
  EXPECT_EQ(a["attention"]["query_pre_attn_scalar"], 256.0);
  EXPECT_DOUBLE_EQ(a["attention"]["softmax_scale"].get<double>(), 1.0 / 16);
  EXPECT_EQ(a["attention"]["attn_logit_softcapping"], 50.0);
  EXPECT_EQ(a["final_logit_softcapping"], 30.0);
  EXPECT_EQ(a["attention"]["sliding_window"], 4096);
  ASSERT_EQ(a["attention"]["layer_types"].size(), 26u);
  EXPECT_EQ(a["attention"]["layer_types"][0], "sliding_attention");
  EXPECT_EQ(a["attention"]["layer_types"][1], "full_attention");
  EXPECT_EQ(a["ffn"]["hidden_act"], "gelu_pytorch_tanh");
  EXPECT_DOUBLE_EQ(a["embed_scale"].get<double>(), std::sqrt(2304.0));
  EXPECT_TRUE(a["embed_scale_is_sqrt_hidden"].get<bool>());

  auto g3 = run_keel("inspect --json " + source_path("configs/hf/gemma-3-4b-it.json"));
  ASSERT_EQ(g3.status, 0) << g3.err;
  const auto k = nlohmann::json::parse(g3.out);
  EXPECT_EQ(k["params"]["total"], 3'880'263'168);
  EXPECT_EQ(k["read_from"], "gemma3 text_config");
  EXPECT_EQ(k["architecture"]["attention"]["rope_local_base_freq"], 10000.0);
  EXPECT_EQ(k["architecture"]["attention"]["rope"]["theta"], 1e6);
  EXPECT_EQ(k["architecture"]["attention"]["qk_norm_width"], "per_head");
  EXPECT_TRUE(k["architecture"]["attention"]["attn_logit_softcapping"].is_null());

  auto o = run_keel("inspect " + source_path("configs/hf/olmo-2-1124-7b.json"));
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_NE(o.out.find("post-sublayer (x + norm(f(x))) + final norm"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("yes (full width: over all heads of q and of k)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("7,298,617,344"), std::string::npos) << o.out;
  auto t = run_keel("inspect " + source_path("configs/hf/gemma-2-2b-it.json"));
  EXPECT_NE(t.out.find("RMSNorm (1 + w), eps 1e-06, sandwich + final norm"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("attention 50, final logits 30"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("sliding window 4,096 on 13 of 26 layers"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("(sqrt hidden_size)"), std::string::npos) << t.out;
}

TEST_F(InspectBadInput, UnknownOptionIsAnErrorToo) {
  auto r = run_keel("inspect --no-such-flag " + source_path("configs/hf/gpt2.json"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("no-such-flag"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace keel
