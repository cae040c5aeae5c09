// Data parallelism end to end through `keel train --nproc N` (mpirun on localhost, shared memory):
// N ranks agree with one process at N× accumulation, the same world size is bit-identical, a
// SIGKILLed rank ends the job and leaves no complete checkpoint, resume is bit-identical and
// reshards to another world size, ZeRO-1 state falls as 1/N, and every rank takes the same
// spike decision and router-bias step. Built only with MPI (KEEL_WITH_MPI).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "../cli/cli_test_util.hpp"
#include "../train/synthetic_dataset.hpp"
#include "keel/io/safetensors.hpp"

namespace keel::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The ranks of a test take one OpenMP thread each, so two ranks fit two cores. Under ASan,
// OpenMPI's own allocations that it never frees at MPI_Finalize are not keel's leaks: leak
// checking stays on for every other test.
constexpr const char* kEnv = "OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=0";

class DataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("keel_dp_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    write_dataset(dir_ / "data");
    std::ofstream(dir_ / "run.toml") << "[run]\nsteps = 50\nseed = 3\nlog_every = 10\n"
                                        "[model]\nconfig = \"" << testing::source_path("configs/tiny/qwen3.json")
                                     << "\"\nset = [\"vocab_size=64\", \"hidden_size=32\", \"intermediate_size=64\", \"head_dim=8\"]\n"
                                        "[data]\ndataset = \"" << (dir_ / "data").string() << "\"\n"
                                        "[batch]\nsequences = 2\nseq_len = 32\ngrad_accum = 2\n"
                                        "[optimizer]\nlr = 0.01\n"
                                        "[schedule]\nkind = \"cosine\"\nwarmup_steps = 5\n"
                                        "[eval]\nevery = 25\nbatches = 3\n"
                                        "[checkpoint]\nevery = 10\nkeep = 10\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Trains run `name` on nproc ranks (0: one process, no mpirun) with extra --set overrides.
  testing::CommandResult train(const std::string& name, int nproc, const std::string& sets,
                               const std::string& env = kEnv) const {
    std::string cmd = "train --config " + (dir_ / "run.toml").string() + " --set run.out=" + (dir_ / name).string() + " " + sets;
    if (nproc > 0) cmd += " --nproc " + std::to_string(nproc);
    return testing::run_keel(cmd, env);
  }
  std::vector<json> metrics(const std::string& name) const {
    std::vector<json> out;
    std::ifstream in(dir_ / name / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  std::vector<json> events(const std::string& name) const {
    std::vector<json> out;
    std::ifstream in(dir_ / name / "events.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // The largest relative difference of `key` between two runs' metrics, step by step.
  double max_rel_diff(const std::string& a, const std::string& b, const std::string& key) const {
    const auto ma = metrics(a), mb = metrics(b);
    EXPECT_EQ(ma.size(), mb.size());
    double worst = 0;
    for (size_t i = 0; i < std::min(ma.size(), mb.size()); ++i) {
      if (!ma[i].contains(key) || ma[i][key].is_null()) continue;  // val_loss: evaluated steps only
      const double x = ma[i][key].get<double>(), y = mb[i][key].get<double>();
      worst = std::max(worst, std::abs(x - y) / std::max(std::abs(x), 1e-12));
    }
    return worst;
  }
  bool same_bits(const std::string& a, const std::string& b) const {
    const auto ma = metrics(a), mb = metrics(b);
    if (ma.size() != mb.size() || ma.empty()) return false;
    for (size_t i = 0; i < ma.size(); ++i) {
      for (const char* k : {"loss", "grad_norm", "update_rms_ratio", "max_logit"}) {
        if (ma[i][k] != mb[i][k]) {
          ADD_FAILURE() << a << " and " << b << " differ at line " << i << " in " << k << ": " << ma[i][k] << " vs " << mb[i][k];
          return false;
        }
      }
    }
    return true;
  }
  std::string checkpoint_file(const std::string& run, int step, const std::string& file) const {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d", step);
    return testing::slurp((dir_ / run / "checkpoints" / name / file).string());
  }
  fs::path dir_;
};

// Measured over 50 steps (AMD EPYC Zen 4, OpenMPI 4.1.4; docs/distributed.md): at most 8e-7
// relative in the loss and 5e-5 in the gradient norm (AdamW amplifies the fp32 rounding of the
// gradient sums where the second moment is small). The bounds leave an order of magnitude for
// other CPUs and would still catch one dropped or doubled micro-batch (≈1e-2 in the loss).
TEST_F(DataParallel, TwoAndFourRanksMatchOneProcessAtTheSameGlobalBatch) {
  ASSERT_EQ(train("one", 0, "--set batch.grad_accum=4").status, 0);
  auto two = train("two", 2, "");
  ASSERT_EQ(two.status, 0) << two.err;
  ASSERT_EQ(train("four", 4, "--set batch.grad_accum=1").status, 0);
  ASSERT_EQ(metrics("two").size(), 50u);
  EXPECT_EQ(metrics("two").back()["tokens"], metrics("one").back()["tokens"]);
  EXPECT_LT(max_rel_diff("one", "two", "loss"), 1e-5);
  EXPECT_LT(max_rel_diff("one", "two", "grad_norm"), 5e-4);
  EXPECT_LT(max_rel_diff("one", "four", "loss"), 1e-5);
  EXPECT_LT(max_rel_diff("one", "four", "grad_norm"), 5e-4);
  EXPECT_LT(max_rel_diff("one", "two", "val_loss"), 1e-5);
  // Rank 0 alone writes metrics and prints; the other ranks print nothing.
  EXPECT_NE(two.out.find("data parallel over 2 ranks"), std::string::npos);
  EXPECT_EQ(two.out.find("done:"), two.out.rfind("done:"));
}

TEST_F(DataParallel, SameWorldSizeIsBitIdenticalWithOrWithoutOverlap) {
  ASSERT_EQ(train("a", 2, "--set run.steps=20").status, 0);
  ASSERT_EQ(train("b", 2, "--set run.steps=20").status, 0);
  ASSERT_EQ(train("c", 2, "--set run.steps=20 --set dist.overlap=false").status, 0);
  EXPECT_TRUE(same_bits("a", "b"));
  EXPECT_TRUE(same_bits("a", "c"));  // the reduction order is fixed, not the arrival order
  EXPECT_EQ(checkpoint_file("a", 20, "model.safetensors"), checkpoint_file("b", 20, "model.safetensors"));
  EXPECT_EQ(checkpoint_file("a", 20, "optimizer.rank-00001.safetensors"),
            checkpoint_file("c", 20, "optimizer.rank-00001.safetensors"));
  const auto m = metrics("a");
  ASSERT_TRUE(m[5].contains("comm_exposed_s"));
  EXPECT_GT(m[5]["comm_exposed_s"].get<double>(), 0.0);
  EXPECT_GT(m[5]["comm_overlapped_s"].get<double>(), 0.0);
  EXPECT_EQ(metrics("c")[5]["comm_overlapped_s"].get<double>(), 0.0);
}

// Muon with QK-Clip: Newton–Schulz on whole matrices at their owners, clipping from the max
// logits of every rank's tokens. A matrix split between ranks (DeepSpeed's bug) changes the loss
// by far more than the bound.
TEST_F(DataParallel, DistributedMuonWithQkClipMatchesOneProcess) {
  const std::string muon = "--set optimizer.name=muon --set optimizer.qk_clip_tau=2.5 --set run.steps=25";
  ASSERT_EQ(train("one", 0, muon + " --set batch.grad_accum=4").status, 0);
  ASSERT_EQ(train("two", 2, muon).status, 0);
  ASSERT_EQ(train("four", 4, muon + " --set batch.grad_accum=1").status, 0);
  EXPECT_LT(max_rel_diff("one", "two", "loss"), 1e-5);
  EXPECT_LT(max_rel_diff("one", "four", "loss"), 1e-5);
  // QK-Clip acted, and on the same heads in both runs.
  int clipped = 0;
  const auto m1 = metrics("one"), m2 = metrics("two");
  for (size_t i = 0; i < m1.size(); ++i) {
    if (m1[i].contains("qk_clip_heads")) {
      ++clipped;
      EXPECT_EQ(m1[i]["qk_clip_heads"], m2[i]["qk_clip_heads"]) << i;
    }
  }
  EXPECT_GT(clipped, 0);
  // Whole matrices, balanced: each of four ranks runs Newton–Schulz for some of the 14.
  const auto ev = events("four");
  ASSERT_FALSE(ev.empty());
  int64_t total = 0;
  for (const auto& n : ev[0]["muon_matrices_per_rank"]) {
    EXPECT_GE(n.get<int64_t>(), 3);
    total += n.get<int64_t>();
  }
  EXPECT_EQ(total, 14);  // 2 layers × (q, k, v, o, gate, up, down)
}

TEST_F(DataParallel, ZeroOneOptimizerStateFallsAsOneOverN) {
  ASSERT_EQ(train("two", 2, "--set run.steps=1").status, 0);
  ASSERT_EQ(train("four", 4, "--set run.steps=1 --set batch.grad_accum=1").status, 0);
  const auto two = events("two")[0]["optimizer_state_bytes"], four = events("four")[0]["optimizer_state_bytes"];
  ASSERT_EQ(two.size(), 2u);
  ASSERT_EQ(four.size(), 4u);
  int64_t total2 = 0, total4 = 0;
  for (const auto& b : two) total2 += b.get<int64_t>();
  for (const auto& b : four) total4 += b.get<int64_t>();
  EXPECT_EQ(total2, total4);  // every moment held exactly once
  for (const auto& b : two) EXPECT_NEAR(b.get<double>(), total2 / 2.0, total2 * 0.001);
  for (const auto& b : four) EXPECT_NEAR(b.get<double>(), total4 / 4.0, total4 * 0.001);
}

// SIGKILL of rank 1 while it writes its shard of the step-20 checkpoint: mpirun ends the job (no
// rank waits forever), step 20 never becomes complete, and --resume on two ranks reproduces the
// uninterrupted run bit for bit.
TEST_F(DataParallel, KilledRankEndsTheJobAndResumeIsBitIdentical) {
  ASSERT_EQ(train("whole", 2, "--set run.steps=30").status, 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto killed = train("killed", 2, "--set run.steps=30",
                      std::string(kEnv) + " KEEL_CRASH_AT=checkpoint:20 KEEL_CRASH_RANK=1");
  EXPECT_NE(killed.status, 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
  EXPECT_TRUE(fs::exists(dir_ / "killed/checkpoints/step_00000010/COMMIT"));
  EXPECT_FALSE(fs::exists(dir_ / "killed/checkpoints/step_00000020/COMMIT"));
  auto resumed = testing::run_keel("train --resume " + (dir_ / "killed").string() + " --nproc 2", kEnv);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_TRUE(same_bits("whole", "killed"));
  EXPECT_EQ(checkpoint_file("whole", 30, "model.safetensors"), checkpoint_file("killed", 30, "model.safetensors"));
}

// A checkpoint written by two ranks resumes on one and on four: the old shard plan is recomputed
// and each rank takes the overlap of its slices (Muon momentum and AdamW moments alike).
TEST_F(DataParallel, ResumeAtAnotherWorldSizeReshards) {
  const std::string muon = "--set optimizer.name=muon --set run.steps=20";
  ASSERT_EQ(train("whole", 2, muon).status, 0);
  for (int n : {1, 4}) {
    const fs::path run = dir_ / ("at" + std::to_string(n));
    fs::create_directories(run);
    fs::copy(dir_ / "whole", run, fs::copy_options::recursive);
    fs::remove_all(run / "checkpoints/step_00000020");
    const std::string accum = n == 1 ? " --set batch.grad_accum=4" : " --set batch.grad_accum=1";
    auto r = testing::run_keel("train --resume " + run.string() + accum + (n > 1 ? " --nproc 4" : ""), kEnv);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_LT(max_rel_diff("whole", "at" + std::to_string(n), "loss"), 1e-5) << n;
  }
  // And a one-process checkpoint onto two ranks.
  ASSERT_EQ(train("single", 0, muon + " --set batch.grad_accum=4").status, 0);
  fs::remove_all(dir_ / "single/checkpoints/step_00000020");
  auto r = testing::run_keel("train --resume " + (dir_ / "single").string() + " --set batch.grad_accum=2 --nproc 2", kEnv);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_LT(max_rel_diff("whole", "single", "loss"), 1e-5);
}

// The checkpoint records the matrices its plan kept whole: a resume that routes other matrices
// to Muon still finds every shard of the old plan, instead of calling good checkpoints damaged.
TEST_F(DataParallel, ResumeWithOtherMuonRoutingReadsTheSavedPlan) {
  ASSERT_EQ(train("run", 2, "--set optimizer.name=muon --set run.steps=20").status, 0);
  fs::remove_all(dir_ / "run/checkpoints/step_00000020");
  auto r = testing::run_keel("train --resume " + (dir_ / "run").string() +
                                 " --set 'optimizer.adamw_patterns=[\"mlp\"]' --nproc 2", kEnv);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step_00000010/COMMIT"));
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints/corrupt_step_00000010"));
  EXPECT_EQ(metrics("run").size(), 20u);
}

// The spike guard decides from the global loss and gradient norm: a NaN gradient on step 7
// (every rank) is skipped by both ranks together, as in one process.
TEST_F(DataParallel, EveryRankSkipsTheSameSpike) {
  const std::string faults = "--set run.steps=12 --set spikes.policy=skip --set faults.nan_grad_steps=[7]";
  ASSERT_EQ(train("one", 0, faults + " --set batch.grad_accum=4").status, 0);
  auto two = train("two", 2, faults);
  ASSERT_EQ(two.status, 0) << two.err;
  const auto m1 = metrics("one"), m2 = metrics("two");
  ASSERT_EQ(m2.size(), 12u);
  EXPECT_EQ(m1[6]["skipped"], true);
  EXPECT_EQ(m2[6]["skipped"], true);
  EXPECT_LT(max_rel_diff("one", "two", "loss"), 1e-5);
}

// MoE with the auxiliary-loss-free bias update (DeepSeek-V3): the biases move by the global
// expert loads, summed over the ranks as integers, so two ranks end with exactly the biases of
// one process; local loads would move them by other signs.
TEST_F(DataParallel, RouterBiasMovesByTheGlobalExpertLoad) {
  const std::string moe = "--set model.config=" + testing::source_path("configs/tiny/deepseek_v3.json") +
                          " --set 'model.set=[\"vocab_size=64\"]' --set run.steps=15"
                          " --set optimizer.router_bias_update_speed=0.01";
  auto one = train("one", 0, moe + " --set batch.grad_accum=4");
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(train("two", 2, moe).status, 0);
  EXPECT_LT(max_rel_diff("one", "two", "loss"), 1e-5);
  auto a = io::SafetensorsFile::open((dir_ / "one/checkpoints/step_00000015/model.safetensors").string());
  auto b = io::SafetensorsFile::open((dir_ / "two/checkpoints/step_00000015/model.safetensors").string());
  int biases = 0;
  for (const auto& t : a.tensors()) {
    if (t.name.find("e_score_correction_bias") == std::string::npos) continue;
    ++biases;
    const std::vector<float> x = a.read_f32(t.name), y = b.read_f32(t.name);
    float moved = 0;
    for (float v : x) moved = std::max(moved, std::abs(v));
    EXPECT_GT(moved, 0.0f) << t.name;
    EXPECT_EQ(x, y) << t.name;
  }
  EXPECT_EQ(biases, 1);  // one MoE layer (first_k_dense_replace = 1)
}

// Two machines simulated honestly: one rank in each of two network namespaces joined by a veth
// pair, MPI restricted to TCP over it (tests/dist/two_namespaces.sh). The fixed reduction order
// makes the losses those of the shared-memory run exactly, whatever the transport.
TEST_F(DataParallel, TwoNetworkNamespacesOverTcpMatchSharedMemory) {
  ASSERT_EQ(train("shm", 2, "--set run.steps=12").status, 0);
  const std::string cmd = "env " + std::string(kEnv) + " /bin/sh " + testing::source_path("tests/dist/two_namespaces.sh") + " " + KEEL_BINARY +
                          " train --config " + (dir_ / "run.toml").string() + " --set run.out=" + (dir_ / "tcp").string() +
                          " --set run.steps=12 > " + (dir_ / "tcp.log").string() + " 2>&1";
  const int raw = std::system(cmd.c_str());
  const std::string log = testing::slurp((dir_ / "tcp.log").string());
  ASSERT_EQ(raw, 0) << log;
  EXPECT_TRUE(same_bits("shm", "tcp"));
  EXPECT_EQ(checkpoint_file("shm", 12, "model.safetensors"), checkpoint_file("tcp", 12, "model.safetensors"));
  // The gradients and parameters crossed the link: at least the 12 steps' all-gathers of half the
  // model (≈ 28 K floats a step).
  const size_t at = log.find("veth bytes sent ");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_GT(std::stoll(log.substr(at + 16)), 12 * 28000 * 4 / 2);
}

TEST_F(DataParallel, NprocNeedsARunConfig) {
  auto r = testing::run_keel("train --model x --tokens y --steps 1 --lr 1 --out z --nproc 2");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--nproc"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace keel::train
