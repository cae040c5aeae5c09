// keel init / eval / grad / train on the tiny MoE configs (Mixtral, Qwen3-MoE, GLM-4.5): HF
// expert names in the files, a gradient for every routed expert tensor and the router, none for
// the correction bias, and a loss that falls.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_test_util.hpp"
#include "keel/io/safetensors.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;
using testing::run_keel;
using testing::source_path;

struct MoeCase {
  const char* config;
  const char* router;        // the router weight's HF name in layer 1
  const char* expert;        // one routed expert matrix of layer 1
  const char* bias;          // correction bias or ""
};

class MoeCli : public ::testing::TestWithParam<MoeCase> {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("keel_moe_cli_" + std::to_string(::getpid()) + "_" +
                                             std::string(GetParam().config));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

double sum_abs(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += std::fabs(x);
  return s;
}

TEST_P(MoeCli, InitEvalGradTrain) {
  const MoeCase& c = GetParam();
  auto i = run_keel("init --config " + source_path(std::string("configs/tiny/") + c.config) + " --seed 1 --out " + path("m"));
  ASSERT_EQ(i.status, 0) << i.err;
  auto weights = io::SafetensorsFile::open(path("m") + "/model.safetensors");
  ASSERT_NE(weights.find(c.router), nullptr);
  ASSERT_NE(weights.find(c.expert), nullptr);
  if (*c.bias) {
    ASSERT_NE(weights.find(c.bias), nullptr);
  }

  std::string text;
  for (int line = 0; line < 8; ++line) {
    for (int k = 0; k < 24; ++k) text += std::to_string((line % 2 ? 7 * k : 3 * k + 1) % 50) + " ";
    text += "\n";
  }
  std::ofstream(path("tokens.txt")) << text;
  auto e = run_keel("eval --model " + path("m") + " --tokens " + path("tokens.txt") + " --json");
  ASSERT_EQ(e.status, 0) << e.err;
  const double initial = nlohmann::json::parse(e.out)["loss"].get<double>();
  EXPECT_NEAR(initial, std::log(256.0), 0.05);

  auto g = run_keel("grad --model " + path("m") + " --tokens " + path("tokens.txt") + " --out " + path("g.safetensors"));
  ASSERT_EQ(g.status, 0) << g.err;
  auto grads = io::SafetensorsFile::open(path("g.safetensors"));
  EXPECT_EQ(grads.tensors().size(), weights.tensors().size());
  EXPECT_GT(sum_abs(grads.read_f32(c.router)), 0.0);
  EXPECT_GT(sum_abs(grads.read_f32(c.expert)), 0.0);
  if (*c.bias) {
    EXPECT_EQ(sum_abs(grads.read_f32(c.bias)), 0.0);
  }

  auto t = run_keel("train --model " + path("m") + " --tokens " + path("tokens.txt") + " --steps 30 --lr 0.01 --out " +
                    path("m2"));
  ASSERT_EQ(t.status, 0) << t.err;
  auto e2 = run_keel("eval --model " + path("m2") + " --tokens " + path("tokens.txt") + " --json");
  ASSERT_EQ(e2.status, 0) << e2.err;
  EXPECT_LT(nlohmann::json::parse(e2.out)["loss"].get<double>(), initial - 2.0);
}

INSTANTIATE_TEST_SUITE_P(
    Families, MoeCli,
    ::testing::Values(MoeCase{"mixtral.json", "model.layers.1.block_sparse_moe.gate.weight",
                              "model.layers.1.block_sparse_moe.experts.3.w2.weight", ""},
                      MoeCase{"qwen3_moe.json", "model.layers.1.mlp.gate.weight",
                              "model.layers.1.mlp.experts.5.up_proj.weight", ""},
                      MoeCase{"glm4_moe.json", "model.layers.1.mlp.gate.weight",
                              "model.layers.1.mlp.experts.6.gate_proj.weight",
                              "model.layers.1.mlp.gate.e_score_correction_bias"}),
    [](const ::testing::TestParamInfo<MoeCase>& info) {
      std::string n = info.param.config;
      return n.substr(0, n.find('.'));
    });

}  // namespace
}  // namespace keel
