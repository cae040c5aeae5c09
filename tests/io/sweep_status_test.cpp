// RUN_DIR/sweep_status.json: what keel compare recorded, else what the run folder shows.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "keel/io/sweep_status.hpp"

namespace keel::io {
namespace {

namespace fs = std::filesystem;

class SweepStatus : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("keel_sweep_status_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(SweepStatus, StatusComesFromTheMarkerOrTheFolder) {
  const fs::path run = dir_ / "runs" / "a";
  EXPECT_EQ(read_variant_status(run.string()).state, VariantState::NotStarted);
  fs::create_directories(run);
  std::ofstream(run / "metrics.jsonl") << "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2.5}\n";
  VariantStatus s = read_variant_status(run.string());
  EXPECT_EQ(s.state, VariantState::Partial);
  EXPECT_EQ(s.steps_done, 2);
  std::ofstream(run / kSweepStatusFile) << R"({"state":"diverged","exit_code":2,"steps_done":2,"diverged_step":3,"message":"loss non-finite"})";
  s = read_variant_status(run.string());
  EXPECT_EQ(s.state, VariantState::Diverged);
  EXPECT_EQ(s.exit_code, 2);
  ASSERT_TRUE(s.diverged_step.has_value());
  EXPECT_EQ(*s.diverged_step, 3);
  EXPECT_EQ(s.message, "loss non-finite");
}

TEST_F(SweepStatus, WrittenStatusReadsBack) {
  const fs::path run = dir_ / "b";
  fs::create_directories(run);
  VariantStatus w;
  w.state = VariantState::Failed;
  w.exit_code = 3;
  w.steps_done = 7;
  w.message = "keel: error: disk full";
  write_variant_status(run.string(), w);
  const VariantStatus r = read_variant_status(run.string());
  EXPECT_EQ(r.state, VariantState::Failed);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.steps_done, 7);
  EXPECT_FALSE(r.diverged_step.has_value());
  EXPECT_EQ(r.message, w.message);
  // A marker this keel cannot read is judged by the folder.
  std::ofstream(run / kSweepStatusFile) << "{not json";
  EXPECT_EQ(read_variant_status(run.string()).state, VariantState::NotStarted);
}

TEST_F(SweepStatus, GlanceFindsTheFirstNonFiniteLoss) {
  std::ofstream(dir_ / "metrics.jsonl") << "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2,\"val_loss\":2.5}\n"
                                           "{\"step\":3,\"loss\":null}\n{\"step\":4,\"loss\":\"NaN\"}\n";
  const MetricsGlance g = glance_metrics(dir_.string());
  EXPECT_EQ(g.steps, 4);
  EXPECT_EQ(g.last_val, 2.5);
  ASSERT_TRUE(g.first_nonfinite.has_value());
  EXPECT_EQ(*g.first_nonfinite, 3);
}

}  // namespace
}  // namespace keel::io
