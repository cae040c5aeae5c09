// The issue-15 families from the command line: keel inspect reads all three real configs, and
// keel train refuses qwen3_next in one line before anything is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_test_util.hpp"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;

TEST(NewFamiliesCli, InspectReadsTheRealConfigs) {
  const auto oss = run_keel("inspect " + source_path("configs/hf/gpt-oss-20b.json"));
  ASSERT_EQ(oss.status, 0) << oss.err;
  EXPECT_NE(oss.out.find("20,914,757,184"), std::string::npos) << oss.out;
  EXPECT_NE(oss.out.find("clamped SwiGLU"), std::string::npos) << oss.out;
  EXPECT_NE(oss.out.find("attention sinks          yes"), std::string::npos) << oss.out;
  const auto v2 = run_keel("inspect " + source_path("configs/hf/deepseek-v2-lite.json"));
  ASSERT_EQ(v2.status, 0) << v2.err;
  EXPECT_NE(v2.out.find("15,706,484,224"), std::string::npos) << v2.out;
  const auto next = run_keel("inspect " + source_path("configs/hf/qwen3-next-80b-a3b-instruct.json"));
  ASSERT_EQ(next.status, 0) << next.err;
  EXPECT_NE(next.out.find("79,674,391,296"), std::string::npos) << next.out;
  EXPECT_NE(next.out.find("1,650,471,424"), std::string::npos) << next.out;  // MTP, apart
  EXPECT_NE(next.out.find("Gated DeltaNet on 36 of 48 layers"), std::string::npos) << next.out;
}

TEST(NewFamiliesCli, TrainingQwen3NextIsRefusedBeforeTheRunFolderExists) {
  const fs::path dir = fs::temp_directory_path() / ("keel_q3n_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path run = dir / "run";
  std::ofstream(dir / "run.toml") << "[run]\nsteps = 2\nout = \"" << run.string() << "\"\n[model]\nconfig = \""
                                  << source_path("configs/tiny/qwen3_next.json")
                                  << "\"\n[data]\ndataset = \"" << (dir / "data").string()
                                  << "\"\n[batch]\nsequences = 2\nseq_len = 16\n";
  const auto r = run_keel("train --config " + (dir / "run.toml").string());
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("qwen3_next.json: field 'model_type': qwen3_next cannot be trained: its 3 Gated DeltaNet "
                       "(linear_attention) layers (0, 1, 2)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(run));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace keel::testing
