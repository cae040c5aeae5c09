// `keel spikes` on metrics written by hand: the spikes the guard would call with the run's
// settings and with --set, --json, and the loss-jump detection rate.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_test_util.hpp"
#include "keel/core/rng.hpp"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class SpikesCli : public ::testing::Test {
 protected:
  void SetUp() override {
    run_ = fs::path(::testing::TempDir()) / ("keel_spikes_cli_" + std::to_string(::getpid()));
    fs::remove_all(run_);
    fs::create_directories(run_);
    // 300 steps of a falling, noisy loss; step 200's grad norm 40x its level with the loss as
    // usual; step 250's loss doubled.
    std::ofstream out(run_ / "metrics.jsonl");
    for (int i = 0; i < 300; ++i) {
      double loss = 5.0 + 3.0 * std::exp(-i / 50.0) + 0.03 * normal_at(4, 1, static_cast<uint64_t>(i));
      double grad = 0.8 * std::exp(0.15 * normal_at(4, 2, static_cast<uint64_t>(i)));
      if (i == 199) grad *= 40;
      if (i == 249) loss *= 2;
      out << json{{"step", i + 1}, {"loss", loss}, {"grad_norm", grad}}.dump() << "\n";
    }
    std::ofstream(run_ / "run.toml") << "[spikes]\npolicy = \"warn\"\n";
  }
  void TearDown() override { fs::remove_all(run_); }
  fs::path run_;
};

TEST_F(SpikesCli, ReplaysTheGuardWithTheRunsSettingsOrOthers) {
  auto r = run_keel("spikes " + run_.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(": 300 steps, 1 spike(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 250: loss = "), std::string::npos) << r.out;

  auto alone = run_keel("spikes " + run_.string() + " --set spikes.grad_norm=alone --json");
  ASSERT_EQ(alone.status, 0) << alone.err;
  const json j = json::parse(alone.out);
  EXPECT_EQ(j["grad_norm"], "alone");
  ASSERT_EQ(j["spikes"].size(), 2u) << alone.out;
  EXPECT_EQ(j["spikes"][0]["step"], 200);
  EXPECT_EQ(j["spikes"][0]["signal"], "grad_norm");
  EXPECT_EQ(j["spikes"][1]["step"], 250);

  // A doubled loss is caught wherever it is injected; a 0.1% bump only at the step already doubled.
  auto jump = run_keel("spikes " + (run_ / "metrics.jsonl").string() + " --loss-jump 2 --json");
  ASSERT_EQ(jump.status, 0) << jump.err;
  const json caught = json::parse(jump.out)["loss_jump"];
  EXPECT_EQ(caught["trials"], 280);  // every step past min_history (20)
  EXPECT_DOUBLE_EQ(caught["caught"].get<double>(), 1.0);
  auto bump = run_keel("spikes " + run_.string() + " --loss-jump 1.001 --json");
  EXPECT_DOUBLE_EQ(json::parse(bump.out)["loss_jump"]["caught"].get<double>(), 1.0 / 280) << bump.out;
}

TEST_F(SpikesCli, BadInputIsOneLineAndExitTwo) {
  auto r = run_keel("spikes " + run_.string() + " --set run.steps=3");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("'run.steps=3' is not a spikes.KEY=VALUE"), std::string::npos) << r.err;
  r = run_keel("spikes " + run_.string() + " --set spikes.grad_norm=sometimes");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("spikes.grad_norm"), std::string::npos) << r.err;
  r = run_keel("spikes " + (run_ / "missing").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
}  // namespace keel::testing
