// The trainer end to end on a small synthetic dataset: it learns, writes metrics and checkpoints,
// and a run killed with SIGKILL at any moment and resumed reproduces the uninterrupted run's
// losses bit for bit. Bad checkpoints and configs are refused with one clear line.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "../cli/cli_test_util.hpp"
#include "synthetic_dataset.hpp"
#include "keel/core/rng.hpp"
#include "keel/data/shards.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/train/checkpoint.hpp"
#include "keel/train/run_dir.hpp"

namespace keel::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Flips one byte in the middle of a file (a damaged checkpoint).
void flip_byte(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const auto size = f.tellg();
  char c = 0;
  f.seekg(size / 2);
  f.get(c);
  f.seekp(size / 2);
  f.put(static_cast<char>(c ^ 0x5a));
}

class Trainer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("keel_trainer_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    write_dataset(dir_ / "data");
    std::ofstream(dir_ / "run.toml") << "[run]\nsteps = 40\nout = \"" << (dir_ / "run").string()
                                     << "\"\nseed = 3\nlog_every = 10\n"
                                        "[model]\nconfig = \"" << testing::source_path("configs/tiny/qwen3.json")
                                     << "\"\nset = [\"vocab_size=64\", \"hidden_size=32\", \"intermediate_size=64\", \"head_dim=8\"]\n"
                                        "[data]\ndataset = \"" << (dir_ / "data").string() << "\"\n"
                                        "[batch]\nsequences = 4\nseq_len = 32\n"
                                        "[optimizer]\nlr = 0.01\n"
                                        "[schedule]\nkind = \"cosine\"\nwarmup_steps = 5\n"
                                        "[eval]\nevery = 10\nbatches = 2\n"
                                        "[checkpoint]\nevery = 5\nkeep = 3\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string run_cmd(const std::string& out, const std::string& extra = "") const {
    return "train --config " + (dir_ / "run.toml").string() + " --set run.out=" + out + " " + extra;
  }
  static std::vector<json> metrics(const fs::path& run) {
    std::vector<json> out;
    std::ifstream in(run / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) out.push_back(json::parse(line));
    return out;
  }
  // The run with `extra` for `steps` steps straight, and stopped after `stop` and resumed: the
  // metrics of both.
  std::pair<std::vector<json>, std::vector<json>> straight_and_resumed(const std::string& extra, int stop, int steps) {
    const std::string to = " --set run.steps=" + std::to_string(steps);
    auto full = testing::run_keel(run_cmd((dir_ / "full").string(), extra + to));
    EXPECT_EQ(full.status, 0) << full.err;
    auto part = testing::run_keel(run_cmd((dir_ / "part").string(), extra + " --set run.steps=" + std::to_string(stop)));
    EXPECT_EQ(part.status, 0) << part.err;
    auto rest = testing::run_keel("train --resume " + (dir_ / "part").string() + to);
    EXPECT_EQ(rest.status, 0) << rest.err;
    return {metrics(dir_ / "full"), metrics(dir_ / "part")};
  }
  fs::path dir_;
};

TEST_F(Trainer, LearnsAndWritesMetricsAndCheckpoints) {
  auto r = testing::run_keel(run_cmd((dir_ / "run").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  auto m = metrics(dir_ / "run");
  ASSERT_EQ(m.size(), 40u);
  for (const char* key : {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "max_logit", "max_logit_per_head"}) {
    EXPECT_TRUE(m[0].contains(key)) << key;
  }
  EXPECT_EQ(m[0]["max_logit_per_head"].size(), 2u);     // layers
  EXPECT_EQ(m[0]["max_logit_per_head"][0].size(), 4u);  // heads
  // Update-to-weight ratio: AdamW moves each weight by about lr per step, weights are ~0.02 at
  // init, so the first (warmup) update is a few percent of the weights; it shrinks as lr decays.
  for (const auto& line : m) {
    ASSERT_TRUE(line["update_rms_ratio"].is_number());
    EXPECT_GT(line["update_rms_ratio"].get<double>(), 1e-4);
    EXPECT_LT(line["update_rms_ratio"].get<double>(), 0.5);
    ASSERT_EQ(line["update_rms_ratio_per_layer"].size(), 2u);
    ASSERT_EQ(line["activation_rms"].size(), 2u);
    // The residual stream starts at the embeddings' scale (0.02) and grows through the blocks.
    EXPECT_GT(line["activation_rms"][0].get<double>(), 0.01);
    EXPECT_FALSE(line.contains("skipped"));
    EXPECT_FALSE(line.contains("events"));
  }
  EXPECT_GT(m[39]["activation_rms"][1].get<double>(), m[0]["activation_rms"][1].get<double>());
  EXPECT_GT(m[0]["update_rms_ratio"].get<double>(), m[39]["update_rms_ratio"].get<double>());
  EXPECT_EQ(testing::slurp((dir_ / "run" / "events.jsonl").string()), "") << "a quiet run has no events";
  EXPECT_EQ(m[39]["tokens"], 40 * 4 * 32);
  EXPECT_TRUE(m[9].contains("val_loss"));
  EXPECT_FALSE(m[10].contains("val_loss"));
  EXPECT_LT(m[39]["loss"].get<double>(), m[0]["loss"].get<double>() - 1.5) << "the synthetic words are learnable";
  EXPECT_LT(m[39]["val_loss"].get<double>(), 2.0);
  // Warmup then cosine.
  EXPECT_NEAR(m[0]["lr"].get<double>(), 0.002, 1e-12);
  EXPECT_NEAR(m[4]["lr"].get<double>(), 0.01, 1e-12);
  auto ckpts = complete_checkpoints((dir_ / "run").string());
  ASSERT_EQ(ckpts.size(), 3u);  // keep = 3
  EXPECT_EQ(fs::path(ckpts.back()).filename(), "step_00000040");
  EXPECT_TRUE(fs::exists(dir_ / "run" / "run.toml"));
  EXPECT_TRUE(fs::exists(dir_ / "run" / "config.json"));
  // A second fresh start into the same folder is refused, pointing at --resume.
  // (TensorBoard files on request: checked below.)
  auto again = testing::run_keel(run_cmd((dir_ / "run").string()));
  EXPECT_EQ(again.status, 2);
  EXPECT_NE(again.err.find("--resume"), std::string::npos) << again.err;
}

// Runs keel in the background, kills it with SIGKILL once `after_checkpoints` checkpoints exist
// plus a delay, and returns.
void run_and_kill(const std::string& args, const fs::path& run, size_t after_checkpoints, int delay_ms) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::string cmd = std::string(KEEL_BINARY) + " " + args + " >/dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (complete_checkpoints(run.string()).size() < after_checkpoints && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
}

TEST_F(Trainer, KilledAndResumedRunIsBitIdentical) {
  auto full = testing::run_keel(run_cmd((dir_ / "full").string()));
  ASSERT_EQ(full.status, 0) << full.err;
  const auto reference = metrics(dir_ / "full");
  ASSERT_EQ(reference.size(), 40u);
  for (auto [name, checkpoints, delay] : {std::tuple{"killed_a", size_t{1}, 0}, std::tuple{"killed_b", size_t{2}, 7},
                                          std::tuple{"killed_c", size_t{3}, 23}}) {
    const fs::path run = dir_ / name;
    run_and_kill(run_cmd(run.string()), run, checkpoints, delay);
    // Killed before the end (the run takes far longer than the delay), then resumed, maybe twice.
    auto r = testing::run_keel("train --resume " + run.string());
    ASSERT_EQ(r.status, 0) << name << ": " << r.err;
    const auto resumed = metrics(run);
    ASSERT_EQ(resumed.size(), reference.size()) << name;
    for (size_t i = 0; i < reference.size(); ++i) {
      EXPECT_EQ(resumed[i]["step"], reference[i]["step"]);
      // Bit-identical: the doubles as printed (round-trip precision) are equal strings.
      EXPECT_EQ(resumed[i]["loss"].dump(), reference[i]["loss"].dump()) << name << " step " << i + 1;
      EXPECT_EQ(resumed[i]["grad_norm"].dump(), reference[i]["grad_norm"].dump()) << name << " step " << i + 1;
      if (reference[i].contains("val_loss")) {
        EXPECT_EQ(resumed[i]["val_loss"].dump(), reference[i]["val_loss"].dump());
      }
    }
  }
}

TEST_F(Trainer, MuonRunLearnsAndResumesExactly) {
  // Constant LR: with a cosine, stopping at 8 would change the schedule itself.
  const std::string muon =
      "--set optimizer.name=muon --set optimizer.lr=0.02 --set checkpoint.every=4 --set schedule.kind=constant";
  // Stop at 8, then continue to 12: momentum, AdamW moments and step counts come from the checkpoint.
  const auto [a, b] = straight_and_resumed(muon, 8, 12);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"].dump(), b[i]["loss"].dump()) << "step " << i + 1;
  EXPECT_LT(a[11]["loss"].get<double>(), a[0]["loss"].get<double>() - 0.5);
  auto state = json::parse(testing::slurp(complete_checkpoints((dir_ / "full").string()).back() + "/state.json"));
  EXPECT_EQ(state["optimizer"], "muon");
  // An AdamW resume of a Muon checkpoint is refused.
  auto wrong = testing::run_keel("train --resume " + (dir_ / "full").string() +
                                 " --set run.steps=14 --set optimizer.name=adamw");
  EXPECT_EQ(wrong.status, 2);
  EXPECT_NE(wrong.err.find("muon"), std::string::npos) << wrong.err;
}

// bf16 with the block inputs of a recomputation kept in bf16 (run.bf16_activations = "all", the
// default, under recompute = blocks; the forward reads them rounded), over two micro-batches a
// step: the run learns, and a stop-and-resume reproduces it bit for bit.
TEST_F(Trainer, Bf16RecomputedRunLearnsAndResumesExactly) {
  const std::string bf16 =
      "--set run.precision=bf16 --set run.recompute=blocks --set batch.grad_accum=2 --set checkpoint.every=4 "
      "--set schedule.kind=constant";
  const auto [a, b] = straight_and_resumed(bf16, 8, 12);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].dump(), b[i]["loss"].dump()) << "step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].dump(), b[i]["grad_norm"].dump()) << "step " << i + 1;
  }
  EXPECT_LT(a[11]["loss"].get<double>(), a[0]["loss"].get<double>() - 0.5);
  const std::string saved = testing::slurp((dir_ / "full" / "run.toml").string());
  EXPECT_NE(saved.find("bf16_activations = 'all'"), std::string::npos) << saved;
  EXPECT_NE(saved.find("recompute = 'blocks'"), std::string::npos) << saved;
}

TEST_F(Trainer, MoeRunLearnsLogsRoutingAndResumesExactly) {
  // GLM-4.5's router (sigmoid, 2 groups, correction bias, shared expert) at a high bias speed,
  // with Muon on the experts: the run learns, logs per-layer expert load and router entropy,
  // moves the correction bias, and a stop-and-resume reproduces it bit for bit.
  std::ofstream(dir_ / "moe.toml") << "[run]\nsteps = 24\nout = \"" << (dir_ / "unused").string()
                                   << "\"\nseed = 3\nlog_every = 10\n"
                                      "[model]\nconfig = \"" << testing::source_path("configs/tiny/glm4_moe.json")
                                   << "\"\nset = [\"vocab_size=64\", \"hidden_size=32\", \"intermediate_size=64\", "
                                      "\"moe_intermediate_size=16\", \"head_dim=8\", \"n_group=2\", \"topk_group=1\"]\n"
                                      "[data]\ndataset = \"" << (dir_ / "data").string() << "\"\n"
                                      "[batch]\nsequences = 4\nseq_len = 32\ngrad_accum = 2\n"
                                      "[optimizer]\nname = \"muon\"\nlr = 0.02\nrouter_bias_update_speed = 0.01\n"
                                      "[schedule]\nkind = \"constant\"\n"
                                      "[eval]\nevery = 8\nbatches = 2\n"
                                      "[checkpoint]\nevery = 8\nkeep = 3\n";
  auto cmd = [&](const fs::path& out, const std::string& extra) {
    return "train --config " + (dir_ / "moe.toml").string() + " --set run.out=" + out.string() + " " + extra;
  };
  auto full = testing::run_keel(cmd(dir_ / "full", ""));
  ASSERT_EQ(full.status, 0) << full.err;
  auto part = testing::run_keel(cmd(dir_ / "part", "--set run.steps=16"));
  ASSERT_EQ(part.status, 0) << part.err;
  auto rest = testing::run_keel("train --resume " + (dir_ / "part").string() + " --set run.steps=24");
  ASSERT_EQ(rest.status, 0) << rest.err;
  const auto a = metrics(dir_ / "full"), b = metrics(dir_ / "part");
  ASSERT_EQ(a.size(), 24u);
  ASSERT_EQ(b.size(), 24u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].dump(), b[i]["loss"].dump()) << "step " << i + 1;
    EXPECT_EQ(a[i]["expert_load"].dump(), b[i]["expert_load"].dump()) << "step " << i + 1;
  }
  EXPECT_LT(a[23]["loss"].get<double>(), a[0]["loss"].get<double>() - 1.0);
  // Layer 0 is dense (first_k_dense_replace = 1): null; layer 1 has 8 shares summing to 1.
  for (const auto& line : a) {
    ASSERT_EQ(line["expert_load"].size(), 2u);
    EXPECT_TRUE(line["expert_load"][0].is_null());
    EXPECT_TRUE(line["router_entropy"][0].is_null());
    ASSERT_EQ(line["expert_load"][1].size(), 8u);
    double total = 0;
    for (const auto& share : line["expert_load"][1]) total += share.get<double>();
    EXPECT_NEAR(total, 1.0, 1e-6);
    const double h = line["router_entropy"][1].get<double>();
    EXPECT_GT(h, 0.0);
    EXPECT_LE(h, std::log(8.0) + 1e-9);
  }
  // The bias moved by whole steps of the speed, and is what the checkpoint holds.
  auto f = io::SafetensorsFile::open(complete_checkpoints((dir_ / "full").string()).back() + "/model.safetensors");
  auto bias = f.read_f32("model.layers.1.mlp.gate.e_score_correction_bias");
  double moved = 0;
  for (float v : bias) {
    moved += std::fabs(v);
    const double steps = v / 0.01;
    EXPECT_NEAR(steps, std::round(steps), 1e-3) << v;
  }
  EXPECT_GT(moved, 0.0);
  // Speed 0 turns the update off.
  auto off = testing::run_keel(cmd(dir_ / "off", "--set run.steps=2 --set optimizer.router_bias_update_speed=0"));
  ASSERT_EQ(off.status, 0) << off.err;
  auto g = io::SafetensorsFile::open(complete_checkpoints((dir_ / "off").string()).back() + "/model.safetensors");
  for (float v : g.read_f32("model.layers.1.mlp.gate.e_score_correction_bias")) EXPECT_EQ(v, 0.0f);
}

TEST_F(Trainer, DenseRunsLogNoRouting) {
  auto r = testing::run_keel(run_cmd((dir_ / "run").string(), "--set run.steps=2"));
  ASSERT_EQ(r.status, 0) << r.err;
  auto m = metrics(dir_ / "run");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_FALSE(m[0].contains("expert_load"));
  EXPECT_FALSE(m[0].contains("router_entropy"));
}

TEST_F(Trainer, QkClipCapsTheLogitsItSees) {
  // Reference run without clipping, then the same run with tau at half its final max logit: heads
  // get clipped, the count is logged, and the logits stay well below the unclipped run's.
  auto free = testing::run_keel(run_cmd((dir_ / "free").string(), "--set run.steps=20"));
  ASSERT_EQ(free.status, 0) << free.err;
  const double reached = metrics(dir_ / "free").back()["max_logit"].get<double>();
  const double tau = reached / 2;
  auto r = testing::run_keel(run_cmd((dir_ / "clip").string(), "--set run.steps=20 --set optimizer.qk_clip_tau=" +
                                                                   std::to_string(tau)));
  ASSERT_EQ(r.status, 0) << r.err;
  auto m = metrics(dir_ / "clip");
  ASSERT_EQ(m.size(), 20u);
  int64_t clipped = 0;
  for (const auto& line : m) {
    ASSERT_TRUE(line.contains("qk_clip_heads"));
    clipped += line["qk_clip_heads"].get<int64_t>();
  }
  EXPECT_GT(clipped, 0);
  EXPECT_LT(m.back()["max_logit"].get<double>(), 0.75 * reached) << "tau " << tau << ", unclipped " << reached;
  EXPECT_FALSE(metrics(dir_ / "free").back().contains("qk_clip_heads"));
}

// MLA with dense MLPs (DeepSeek-V3 attention) under `keel train` with Muon: it learns; with
// QK-Clip at half the max logit the unclipped run reaches, the MLA clip fires and holds the
// logits well below that run's.
TEST_F(Trainer, MlaWithMuonAndQkClipTrains) {
  std::ofstream(dir_ / "mla.toml") << "[run]\nsteps = 30\nout = \"" << (dir_ / "mla").string()
                                   << "\"\nseed = 3\nlog_every = 10\n"
                                      "[model]\nconfig = \"" << testing::source_path("configs/tiny/deepseek_v3_dense.json")
                                   << "\"\nset = [\"vocab_size=64\"]\n"
                                      "[data]\ndataset = \"" << (dir_ / "data").string() << "\"\n"
                                      "[batch]\nsequences = 4\nseq_len = 32\n"
                                      "[optimizer]\nname = \"muon\"\nlr = 0.02\n"
                                      "[schedule]\nkind = \"constant\"\n"
                                      "[eval]\nevery = 10\nbatches = 2\n"
                                      "[checkpoint]\nevery = 10\nkeep = 1\n";
  const std::string cmd = "train --config " + (dir_ / "mla.toml").string();
  auto free = testing::run_keel(cmd);
  ASSERT_EQ(free.status, 0) << free.err;
  auto m = metrics(dir_ / "mla");
  ASSERT_EQ(m.size(), 30u);
  EXPECT_EQ(m[0]["max_logit_per_head"].size(), 2u);
  EXPECT_EQ(m[0]["max_logit_per_head"][0].size(), 4u);
  EXPECT_LT(m[29]["loss"].get<double>(), m[0]["loss"].get<double>() - 1.0) << "the synthetic words are learnable";
  const double reached = m.back()["max_logit"].get<double>();
  const double tau = reached / 2;
  auto r = testing::run_keel(cmd + " --set run.out=" + (dir_ / "mla_clip").string() +
                             " --set optimizer.qk_clip_tau=" + std::to_string(tau));
  ASSERT_EQ(r.status, 0) << r.err;
  auto c = metrics(dir_ / "mla_clip");
  ASSERT_EQ(c.size(), 30u);
  int64_t clipped = 0;
  for (const auto& line : c) clipped += line["qk_clip_heads"].get<int64_t>();
  EXPECT_GT(clipped, 0);
  EXPECT_LT(c.back()["max_logit"].get<double>(), 0.75 * reached) << "tau " << tau << ", unclipped " << reached;
  EXPECT_LT(c[29]["loss"].get<double>(), c[0]["loss"].get<double>() - 1.0);
}

TEST_F(Trainer, TensorBoardOnRequest) {
  auto r = testing::run_keel(run_cmd((dir_ / "tb").string(), "--set run.steps=3 --tensorboard"));
  ASSERT_EQ(r.status, 0) << r.err;
  size_t files = 0, bytes = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "tb" / "tensorboard")) {
    EXPECT_EQ(e.path().filename().string().rfind("events.out.tfevents.", 0), 0u);
    ++files;
    bytes += fs::file_size(e.path());
  }
  EXPECT_EQ(files, 1u);
  EXPECT_GT(bytes, 3u * 4 * 20);  // 3 steps x 4 scalars, each a framed record
  EXPECT_FALSE(fs::exists(dir_ / "run" / "tensorboard"));
}

TEST_F(Trainer, CorruptOrForeignCheckpointsAreRefused) {
  auto r = testing::run_keel(run_cmd((dir_ / "run").string(), "--set run.steps=10"));
  ASSERT_EQ(r.status, 0) << r.err;
  // Every checkpoint damaged (one byte each): nothing to resume from, and the error names why.
  for (const auto& ckpt : complete_checkpoints((dir_ / "run").string())) flip_byte(fs::path(ckpt) / "model.safetensors");
  auto bad = testing::run_keel("train --resume " + (dir_ / "run").string() + " --set run.steps=12");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("checksum mismatch"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.substr(bad.err.rfind("keel: error")).find('\n'), bad.err.size() - bad.err.rfind("keel: error") - 1);
  // They are kept aside for inspection, not deleted.
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoints" / "corrupt_step_00000010"));

  // A checkpoint from another model config.
  auto r2 = testing::run_keel(run_cmd((dir_ / "run2").string(), "--set run.steps=5"));
  ASSERT_EQ(r2.status, 0) << r2.err;
  auto cfg = json::parse(testing::slurp((dir_ / "run2" / "config.json").string()));
  cfg["rms_norm_eps"] = 1e-5;
  std::ofstream(dir_ / "run2" / "config.json") << cfg.dump(2);
  auto foreign = testing::run_keel("train --resume " + (dir_ / "run2").string() + " --set run.steps=8");
  EXPECT_EQ(foreign.status, 2);
  EXPECT_NE(foreign.err.find("another model config"), std::string::npos) << foreign.err;

  // A typo in the run config names the key.
  auto typo = testing::run_keel(run_cmd((dir_ / "run3").string(), "--set optimizer.learning_rate=1"));
  EXPECT_EQ(typo.status, 2);
  EXPECT_NE(typo.err.find("optimizer.learning_rate"), std::string::npos) << typo.err;
  EXPECT_FALSE(fs::exists(dir_ / "run3" / "checkpoints"));
}

TEST_F(Trainer, FullDiskWhileCheckpointingKeepsEarlierCheckpoints) {
  auto r = testing::run_keel(run_cmd((dir_ / "run").string(), "--set run.steps=5"));
  ASSERT_EQ(r.status, 0) << r.err;
  // The next checkpoint cannot be written: files are capped at 64 KiB (EFBIG, as on a full disk).
  const std::string cmd = "sh -c 'trap \"\" XFSZ; ulimit -f 128; exec " + std::string(KEEL_BINARY) + " train --resume " +
                          (dir_ / "run").string() + " --set run.steps=10' >" + (dir_ / "out.txt").string() + " 2>" +
                          (dir_ / "err.txt").string();
  int raw = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(raw), 2);
  const std::string err = testing::slurp((dir_ / "err.txt").string());
  EXPECT_NE(err.find("keel: error"), std::string::npos) << err;
  auto ckpts = complete_checkpoints((dir_ / "run").string());
  ASSERT_EQ(ckpts.size(), 1u);
  EXPECT_EQ(fs::path(ckpts[0]).filename(), "step_00000005");
  for (const auto& e : fs::directory_iterator(dir_ / "run" / "checkpoints")) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
  }
  // The intact checkpoint still resumes.
  auto ok = testing::run_keel("train --resume " + (dir_ / "run").string() + " --set run.steps=6");
  EXPECT_EQ(ok.status, 0) << ok.err;
}

// Runs `sh -c SCRIPT` and returns the raw wait status.
int run_shell(const std::string& script) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

TEST_F(Trainer, RealFullDiskWhileCheckpointingKeepsEarlierCheckpointsAndNamesTheFile) {
  // A real file system that fills up: a tmpfs mounted in a private mount namespace (unshare; as
  // root, or as a user where user namespaces are allowed), sized from a run on the normal disk so
  // that the third checkpoint cannot be written.
  const std::string every = "--set checkpoint.every=5 --set checkpoint.keep=10 --set run.steps=20";
  auto reference = testing::run_keel(run_cmd((dir_ / "reference").string(), every));
  ASSERT_EQ(reference.status, 0) << reference.err;
  auto pages = [](const fs::path& dir) {
    uintmax_t bytes = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (e.is_regular_file()) bytes += (e.file_size() + 4095) / 4096 * 4096;
    }
    return bytes;
  };
  const uintmax_t checkpoint = pages(dir_ / "reference" / "checkpoints" / "step_00000005");
  const uintmax_t size = 2 * checkpoint + checkpoint / 2 + 64 * 1024;  // two checkpoints, logs, half a third
  const fs::path mnt = dir_ / "mnt", copy = dir_ / "copy";
  fs::create_directories(mnt);
  const std::string inner = "mount -t tmpfs -o size=" + std::to_string(size) + " keel-full-disk " + quoted(mnt) +
                            " || exit 90; " + std::string(KEEL_BINARY) + " " + run_cmd((mnt / "run").string(), every) +
                            " >" + quoted(dir_ / "out.txt") + " 2>" + quoted(dir_ / "err.txt") + "; echo \\$? >" +
                            quoted(dir_ / "status.txt") + "; df -B1 " + quoted(mnt) + " >>" + quoted(dir_ / "out.txt") +
                            "; cp -a " + quoted(mnt / "run") + " " + quoted(copy);
  const int raw = run_shell("if unshare -m true 2>/dev/null; then U='unshare -m'; else U='unshare -rm'; fi; exec $U sh -c \"" +
                            inner + "\"");
  ASSERT_TRUE(WIFEXITED(raw) && WEXITSTATUS(raw) == 0)
      << "could not run keel on a small tmpfs in a private mount namespace (unshare -m / -rm): status " << raw;
  const std::string err = testing::slurp((dir_ / "err.txt").string());
  EXPECT_EQ(testing::slurp((dir_ / "status.txt").string()), "2\n") << err << testing::slurp((dir_ / "out.txt").string());
  // One error line, naming the file that could not be written and why (beside any "keel: note:"
  // the run's start gives about this machine).
  std::istringstream err_lines(err);
  int errors = 0, others = 0;
  for (std::string line; std::getline(err_lines, line);) {
    if (line.rfind("keel: error: ", 0) == 0) ++errors;
    else if (line.rfind("keel: note: ", 0) != 0) ++others;
  }
  EXPECT_EQ(errors, 1) << err;
  EXPECT_EQ(others, 0) << err;
  EXPECT_NE(err.find((mnt / "run" / "checkpoints").string()), std::string::npos) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  // The two earlier checkpoints are complete; nothing half-written is left.
  const auto kept = complete_checkpoints(copy.string());
  ASSERT_EQ(kept.size(), 2u) << err;
  EXPECT_EQ(fs::path(kept.back()).filename(), "step_00000010");
  for (const auto& e : fs::directory_iterator(copy / "checkpoints")) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
  }
  // With room again, the run resumes from them and ends exactly as the uninterrupted one.
  auto resumed = testing::run_keel("train --resume " + copy.string());
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  const auto a = metrics(dir_ / "reference"), b = metrics(copy);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"].dump(), b[i]["loss"].dump()) << "step " << i + 1;
}

// model.init_from: a published HF folder (here bf16, sharded) replaces the random init at step 0;
// the run keeps fp32 master weights, a folder that does not fit the config is refused before the
// run folder exists, and a resumed run no longer needs the folder.
TEST_F(Trainer, StartsFromAnHfFolderAndResumesWithoutIt) {
  const std::string sets =
      "--set vocab_size=64 --set hidden_size=32 --set intermediate_size=64 --set head_dim=8";
  const fs::path hf = dir_ / "hf";
  auto r = testing::run_keel("init --config " + testing::source_path("configs/tiny/qwen3.json") + " " + sets +
                             " --seed 77 --bf16 --out " + hf.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const io::SafetensorsFile published = io::SafetensorsFile::open((hf / "model.safetensors").string());

  // lr 0: AdamW and its decoupled decay leave every weight where it started.
  const fs::path run = dir_ / "from_hf";
  r = testing::run_keel(run_cmd(run.string(), "--set model.init_from=" + hf.string() +
                                                  " --set model.config= --set optimizer.lr=0 --set run.steps=10"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(testing::slurp((run / "run.toml").string()).find("init_from"), std::string::npos);
  const auto ckpts = complete_checkpoints(run.string());
  ASSERT_FALSE(ckpts.empty());
  const io::SafetensorsFile trained = io::SafetensorsFile::open((fs::path(ckpts.back()) / "model.safetensors").string());
  int64_t compared = 0;
  for (const auto& t : published.tensors()) {
    EXPECT_EQ(trained.find(t.name)->dtype, io::DType::F32) << t.name;  // fp32 master weights
    EXPECT_EQ(trained.read_f32(t.name), published.read_f32(t.name)) << t.name;
    compared += t.numel();
  }
  EXPECT_GT(compared, 10000);
  // The same run without init_from starts elsewhere (the comparison above can fail).
  const fs::path scratch = dir_ / "scratch";
  r = testing::run_keel(run_cmd(scratch.string(), "--set optimizer.lr=0 --set run.steps=10"));
  ASSERT_EQ(r.status, 0) << r.err;
  const io::SafetensorsFile random_init =
      io::SafetensorsFile::open((fs::path(complete_checkpoints(scratch.string()).back()) / "model.safetensors").string());
  EXPECT_NE(random_init.read_f32("model.embed_tokens.weight"), published.read_f32("model.embed_tokens.weight"));

  // A folder of another width: one line naming the tensor, exit 2, no run folder.
  const fs::path wide = dir_ / "hf_wide";
  r = testing::run_keel("init --config " + testing::source_path("configs/tiny/qwen3.json") + " " + sets +
                        " --set hidden_size=48 --seed 1 --out " + wide.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const fs::path refused = dir_ / "refused";
  r = testing::run_keel(run_cmd(refused.string(), "--set model.init_from=" + wide.string()));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("model.embed_tokens.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("does not match the config"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(refused));

  // A tied model whose stored head copy differs from its embedding: refused before the run folder.
  const fs::path tied = dir_ / "hf_tied";
  r = testing::run_keel("init --config " + testing::source_path("configs/tiny/qwen3.json") + " " + sets +
                        " --seed 5 --out " + tied.string());
  ASSERT_EQ(r.status, 0) << r.err;
  {
    const io::SafetensorsFile f = io::SafetensorsFile::open((tied / "model.safetensors").string());
    std::vector<std::vector<float>> values;
    std::vector<io::TensorToWrite> tensors;
    for (const auto& t : f.tensors()) {
      values.push_back(f.read_f32(t.name));
      tensors.push_back({t.name, io::DType::F32, t.shape, values.back().data()});
    }
    std::vector<float> head(values.front().size(), 0.5f);
    tensors.push_back({"lm_head.weight", io::DType::F32, f.tensors().front().shape, head.data()});
    io::write_safetensors((tied / "model.safetensors").string(), tensors);
  }
  const fs::path refused_tied = dir_ / "refused_tied";
  r = testing::run_keel(run_cmd(refused_tied.string(), "--set model.init_from=" + tied.string()));  // tiny qwen3 is tied
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("lm_head.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("differs from model.embed_tokens.weight"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(refused_tied));

  // Resuming reads the run's own checkpoint: the published folder may be gone.
  fs::remove_all(hf);
  r = testing::run_keel("train --resume " + run.string() + " --set run.steps=12");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(metrics(run).size(), 12u);
}

TEST_F(Trainer, CorruptedShardIsRefusedBeforeTheRunFolderIsTouched) {
  // One token changed to another valid id: only the shard's data checksum can see it.
  const fs::path shard = dir_ / "data" / "train_00000.bin";
  auto flip_token = [&] {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(64 + 2 * 5000);
    char c = 0;
    f.get(c);
    f.seekp(64 + 2 * 5000);
    f.put(static_cast<char>(c == 1 ? 2 : 1));
  };
  auto ok = testing::run_keel(run_cmd((dir_ / "run").string(), "--set run.steps=5"));
  ASSERT_EQ(ok.status, 0) << ok.err;
  auto verified = testing::run_keel("data verify " + (dir_ / "data").string());
  EXPECT_EQ(verified.status, 0) << verified.err;
  EXPECT_NE(verified.out.find("all shards verified"), std::string::npos) << verified.out;
  flip_token();

  auto fresh = testing::run_keel(run_cmd((dir_ / "new").string()));
  EXPECT_EQ(fresh.status, 2);
  EXPECT_EQ(fresh.err, "keel: error: " + shard.string() +
                           ": field 'data checksum': CRC-32C of the tokens and document table does not match the header "
                           "(corrupted data)\n");
  EXPECT_FALSE(fs::exists(dir_ / "new")) << "nothing may be written for a run on corrupted data";

  const std::string before = testing::slurp((dir_ / "run" / "metrics.jsonl").string()),
                    toml_before = testing::slurp((dir_ / "run" / "run.toml").string());
  auto resumed = testing::run_keel("train --resume " + (dir_ / "run").string() + " --set run.steps=10");
  EXPECT_EQ(resumed.status, 2);
  EXPECT_NE(resumed.err.find(shard.string() + ": field 'data checksum'"), std::string::npos) << resumed.err;
  EXPECT_EQ(testing::slurp((dir_ / "run" / "metrics.jsonl").string()), before);
  EXPECT_EQ(testing::slurp((dir_ / "run" / "run.toml").string()), toml_before) << "--set was not written back";

  auto check = testing::run_keel("data verify " + (dir_ / "data").string());
  EXPECT_EQ(check.status, 2);
  EXPECT_NE(check.err.find(shard.string() + ": field 'data checksum'"), std::string::npos) << check.err;
  EXPECT_NE(check.out.find("train 1 shards, 20000 tokens"), std::string::npos) << check.out;
  EXPECT_NE(check.out.find("1 bad"), std::string::npos) << check.out;
}

// Starts keel with ARGS in the background (optionally with KEEL_CRASH_AT) and returns its pid.
pid_t start_keel(const std::string& args, const std::string& crash_at = "") {
  const pid_t pid = fork();
  if (pid == 0) {
    if (!crash_at.empty()) setenv("KEEL_CRASH_AT", crash_at.c_str(), 1);
    const std::string cmd = "exec " + std::string(KEEL_BINARY) + " " + args + " >/dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

TEST_F(Trainer, SecondTrainerOnTheSameRunFolderIsRefusedAndAKilledOneLeavesNoLock) {
  const fs::path run = dir_ / "run";
  const std::string args = run_cmd(run.string(), "--set run.steps=100000 --set checkpoint.every=5");
  const pid_t first = start_keel(args);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!latest_complete_checkpoint(run.string()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(latest_complete_checkpoint(run.string()).has_value());
  const std::string holder = "in use by pid " + std::to_string(first);
  // A second fresh start and a resume of the live run are both refused, naming the holder.
  for (const std::string& second : {args, "train --resume " + run.string()}) {
    auto r = testing::run_keel(second);
    EXPECT_EQ(r.status, 2) << second;
    if (second == args) {
      // A fresh start into a folder with checkpoints is refused either way; the lock comes first
      // only when there are none yet, so check the message that applies.
      EXPECT_NE(r.err.find("run.out"), std::string::npos) << r.err;
    } else {
      EXPECT_NE(r.err.find(holder + " (keel train)"), std::string::npos) << r.err;
    }
  }
  kill(first, SIGKILL);
  int status = 0;
  waitpid(first, &status, 0);
  // Killed: no stale lock; the run resumes.
  auto resumed = testing::run_keel("train --resume " + run.string() + " --set run.steps=12");
  EXPECT_EQ(resumed.status, 0) << resumed.err;
}

TEST_F(Trainer, TwoFreshStartsAtOnceOnlyOneTrains) {
  // Both find the folder empty; the lock decides. The loser names the winner and writes nothing.
  const fs::path run = dir_ / "run";
  const std::string args = run_cmd(run.string(), "--set run.steps=100000 --set checkpoint.every=1000");
  const pid_t first = start_keel(args);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(fs::exists(run / "metrics.jsonl") && fs::file_size(run / "metrics.jsonl") > 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto second = testing::run_keel(args);
  EXPECT_EQ(second.status, 2);
  EXPECT_NE(second.err.find(run.string() + ": in use by pid " + std::to_string(first) + " (keel train)"),
            std::string::npos)
      << second.err;
  const auto size = fs::file_size(run / "metrics.jsonl");
  EXPECT_GT(size, 0u) << "the first trainer's metrics survive the second's attempt";
  kill(first, SIGKILL);
  int status = 0;
  waitpid(first, &status, 0);
}

TEST_F(Trainer, SoakKilledAtRandomMomentsLosesNothing) {
  // 420 steps, killed with SIGKILL 12 times: 3 each during a forward pass, during a checkpoint
  // write (after its first tensor file), during an evaluation (KEEL_CRASH_AT), and 3 at random
  // wall-clock moments; resumed after each kill. The end must match the uninterrupted run bit for
  // bit, every step logged once.
  const int64_t steps = 420, every = 20, eval_every = 25;
  const std::string settings = "--set run.steps=420 --set checkpoint.every=20 --set checkpoint.keep=3 "
                               "--set eval.every=25 --set run.log_every=100";
  const auto t0 = std::chrono::steady_clock::now();
  auto full = testing::run_keel(run_cmd((dir_ / "full").string(), settings));
  ASSERT_EQ(full.status, 0) << full.err;
  const double seconds_per_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  const auto reference = metrics(dir_ / "full");
  ASSERT_EQ(reference.size(), static_cast<size_t>(steps));

  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE("soak seed " + std::to_string(seed));
  const fs::path run = dir_ / "soak";
  auto resume_point = [&] {
    auto last = latest_complete_checkpoint(run.string());
    return last ? checkpoint_step(*last) : int64_t{0};
  };
  auto command = [&] {
    return resume_point() > 0 ? "train --resume " + run.string() : run_cmd(run.string(), settings);
  };
  // A multiple of `period` in (from, from + 60], at most `steps`; the first such step past `from`.
  auto pick = [&](int64_t from, int64_t period) {
    std::vector<int64_t> candidates;
    for (int64_t s = (from / period + 1) * period; s <= std::min(from + 60, steps); s += period) candidates.push_back(s);
    if (candidates.empty()) return std::min(steps, (from / period + 1) * period);
    return candidates[rng() % candidates.size()];
  };
  const std::vector<std::string> plan = {"forward", "checkpoint", "eval", "random", "forward", "checkpoint",
                                         "eval", "random", "checkpoint", "forward", "eval", "random"};
  int kills = 0;
  for (const std::string& kind : plan) {
    const int64_t from = resume_point();
    int status = 0;
    if (kind == "random") {
      // Once the run is past its resume point (training, not starting up), 0-30 steps later.
      const pid_t pid = start_keel(command());
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (std::chrono::steady_clock::now() < deadline) {
        std::ifstream in(run / "metrics.jsonl");
        const auto lines = std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
        if (lines > from) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      const double delay = seconds_per_step * static_cast<double>(rng() % 31);
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    } else {
      const int64_t at = kind == "forward"      ? from + 1 + static_cast<int64_t>(rng() % 40)
                         : kind == "checkpoint" ? pick(from, every)
                                                : pick(from, eval_every);
      const pid_t pid = start_keel(command(), kind + ":" + std::to_string(std::min(at, steps)));
      waitpid(pid, &status, 0);
      if (kind == "checkpoint") {
        bool partial = false;
        for (const auto& e : fs::directory_iterator(run / "checkpoints")) {
          partial = partial || e.path().filename().string().find(".tmp-") != std::string::npos;
        }
        EXPECT_TRUE(partial) << "killed during a checkpoint write: its temporary folder stays behind";
      }
    }
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << kind << " kill from step " << from << ": the run ended by itself (status " << status << ")";
    ++kills;
    EXPECT_GE(resume_point(), from) << "a kill never loses a complete checkpoint";
  }
  EXPECT_GE(kills, 10);
  auto last = testing::run_keel(command());
  ASSERT_EQ(last.status, 0) << last.err;
  const auto soak = metrics(run);
  ASSERT_EQ(soak.size(), reference.size()) << "every step logged exactly once";
  for (size_t i = 0; i < reference.size(); ++i) {
    ASSERT_EQ(soak[i]["step"], static_cast<int64_t>(i + 1));
    EXPECT_EQ(soak[i]["loss"].dump(), reference[i]["loss"].dump()) << "step " << i + 1;
    EXPECT_EQ(soak[i]["grad_norm"].dump(), reference[i]["grad_norm"].dump()) << "step " << i + 1;
    EXPECT_EQ(soak[i].value("val_loss", json()).dump(), reference[i].value("val_loss", json()).dump()) << "step " << i + 1;
  }
}

// --- Spike handling under injected faults ([faults], spike_guard.hpp) ---

std::vector<json> events_of(const fs::path& run) {
  std::vector<json> out;
  std::ifstream in(run / "events.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

TEST_F(Trainer, SkipPolicyDropsANanGradientUpdateAndLosesNothingElse) {
  auto clean = testing::run_keel(run_cmd((dir_ / "clean").string()));
  ASSERT_EQ(clean.status, 0) << clean.err;
  auto r = testing::run_keel(run_cmd((dir_ / "run").string(), "--set spikes.policy=skip --set faults.nan_grad_steps=[12]"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("spike at step 12: nonfinite_grad"), std::string::npos) << r.out;
  auto m = metrics(dir_ / "run"), c = metrics(dir_ / "clean");
  ASSERT_EQ(m.size(), 40u);
  // Up to the fault the two runs are the same run.
  for (size_t i = 0; i < 11; ++i) EXPECT_EQ(m[i]["loss"], c[i]["loss"]) << i;
  // Step 12 computed a finite loss but a NaN gradient; its update was dropped.
  EXPECT_TRUE(m[11]["skipped"].get<bool>());
  EXPECT_TRUE(m[11]["update_rms_ratio"].is_null());
  EXPECT_TRUE(m[11]["grad_norm"].is_null());
  ASSERT_EQ(m[11]["events"].size(), 1u);
  EXPECT_EQ(m[11]["events"][0]["signal"], "nonfinite_grad");
  EXPECT_EQ(m[11]["events"][0]["action"], "skip");
  // Every other step trained, every value stayed finite, and the run ends as well as the clean one.
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_EQ(m[i]["step"], i + 1);
    ASSERT_TRUE(m[i]["loss"].is_number()) << i;
    if (i != 11) {
      EXPECT_FALSE(m[i].contains("skipped")) << i;
    }
  }
  EXPECT_EQ(m[39]["tokens"], c[39]["tokens"]);
  EXPECT_NEAR(m[39]["val_loss"].get<double>(), c[39]["val_loss"].get<double>(), 0.1);
  auto ev = events_of(dir_ / "run");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0]["type"], "spike");
  EXPECT_EQ(ev[1]["type"], "skip");
  EXPECT_EQ(ev[1]["step"], 12);

  // The skip budget is bounded: a second NaN with max_skips = 1 aborts, keeping the checkpoints.
  auto b = testing::run_keel(run_cmd((dir_ / "budget").string(),
                                     "--set spikes.policy=skip --set spikes.max_skips=1 --set faults.nan_grad_steps=[7,13]"));
  EXPECT_EQ(b.status, 2);
  EXPECT_NE(b.err.find("diverged at step 13"), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("spikes.max_skips"), std::string::npos) << b.err;
  auto bev = events_of(dir_ / "budget");
  ASSERT_FALSE(bev.empty());
  EXPECT_EQ(bev.back()["type"], "abort");
  EXPECT_EQ(bev.back()["step"], 13);
  EXPECT_EQ(fs::path(complete_checkpoints((dir_ / "budget").string()).back()).filename(), "step_00000010");
}

TEST_F(Trainer, WarnAndAbortPoliciesStopAtANanAndKeepTheCheckpoints) {
  // warn cannot train through a NaN (the old behaviour); abort stops at any spike.
  for (auto [name, extra] : {std::pair{"warn", "--set faults.nan_grad_steps=[12]"},
                             std::pair{"abort", "--set spikes.policy=abort --set faults.nan_grad_steps=[12]"}}) {
    auto r = testing::run_keel(run_cmd((dir_ / name).string(), extra));
    EXPECT_EQ(r.status, 2) << name;
    EXPECT_NE(r.err.find("training diverged at step 12 (nonfinite_grad)"), std::string::npos) << r.err;
    auto m = metrics(dir_ / name);
    EXPECT_EQ(m.size(), 11u) << name;
    auto ev = events_of(dir_ / name);
    ASSERT_EQ(ev.size(), 2u) << name;
    EXPECT_EQ(ev[0]["action"], "abort");
    EXPECT_EQ(ev[1]["type"], "abort");
    auto ckpts = complete_checkpoints((dir_ / name).string());
    ASSERT_EQ(ckpts.size(), 2u);
    EXPECT_EQ(fs::path(ckpts.back()).filename(), "step_00000010");
  }
  // A poisoned batch is a finite loss spike: warn records it and trains on.
  auto w = testing::run_keel(run_cmd((dir_ / "poison_warn").string(), "--set faults.poison_steps=[22]"));
  ASSERT_EQ(w.status, 0) << w.err;
  auto ev = events_of(dir_ / "poison_warn");
  ASSERT_GE(ev.size(), 1u);
  EXPECT_EQ(ev[0]["step"], 22);
  EXPECT_EQ(ev[0]["signal"], "loss");
  EXPECT_EQ(ev[0]["action"], "warn");
  EXPECT_GT(ev[0]["value"].get<double>(), ev[0]["threshold"].get<double>());
}

TEST_F(Trainer, RollbackSkipsThePoisonedWindowPastADamagedCheckpoint) {
  auto clean = testing::run_keel(run_cmd((dir_ / "clean").string()));
  ASSERT_EQ(clean.status, 0) << clean.err;
  // Step 22 draws random tokens; the checkpoint of step 20 is damaged on disk after its save.
  auto r = testing::run_keel(run_cmd((dir_ / "run").string(), "--set spikes.policy=rollback --set faults.poison_steps=[22] "
                                                              "--set faults.corrupt_checkpoint_steps=[20]"));
  ASSERT_EQ(r.status, 0) << r.err;
  auto ev = events_of(dir_ / "run");
  ASSERT_EQ(ev.size(), 3u) << r.out;
  EXPECT_EQ(ev[0]["type"], "spike");
  EXPECT_EQ(ev[0]["signal"], "loss");
  EXPECT_EQ(ev[0]["step"], 22);
  EXPECT_EQ(ev[1]["type"], "checkpoint_corrupt");
  EXPECT_NE(ev[1]["checkpoint"].get<std::string>().find("step_00000020"), std::string::npos);
  EXPECT_EQ(ev[2]["type"], "rollback");
  EXPECT_EQ(ev[2]["to_step"], 15);
  // 4 sequences a step: the checkpoint's cursor is 60, the poisoned step ended at 88.
  EXPECT_EQ(ev[2]["skipped_sequences"], json::array({60, 88}));
  auto m = metrics(dir_ / "run"), c = metrics(dir_ / "clean");
  ASSERT_EQ(m.size(), 40u);
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_EQ(m[i]["step"], i + 1);
    ASSERT_TRUE(m[i]["loss"].is_number());
    if (i < 15) {
      EXPECT_EQ(m[i]["loss"], c[i]["loss"]) << i;
    }
  }
  // The replayed steps trained on fresh data: no second spike, and the run ends as well as the clean one.
  EXPECT_LT(m[21]["loss"].get<double>(), ev[0]["threshold"].get<double>());
  EXPECT_NEAR(m[39]["val_loss"].get<double>(), c[39]["val_loss"].get<double>(), 0.15);
  ASSERT_EQ(m[15]["events"].size(), 2u);  // the first line after the rollback carries it
  EXPECT_EQ(m[15]["events"][1]["type"], "rollback");
  // The damaged checkpoint is kept aside; the run's checkpoints are intact and resume.
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoints" / "corrupt_step_00000020"));
  auto more = testing::run_keel("train --resume " + (dir_ / "run").string() + " --set run.steps=42");
  EXPECT_EQ(more.status, 0) << more.err;
}

TEST_F(Trainer, ResumePastADamagedLatestCheckpointMatchesTheUninterruptedRun) {
  // A constant schedule, so a 20-step run is the first half of the 40-step one.
  auto full = testing::run_keel(run_cmd((dir_ / "full").string(), "--set schedule.kind=constant"));
  ASSERT_EQ(full.status, 0) << full.err;
  auto part = testing::run_keel(run_cmd((dir_ / "run").string(), "--set schedule.kind=constant --set run.steps=20"));
  ASSERT_EQ(part.status, 0) << part.err;
  flip_byte(fs::path(complete_checkpoints((dir_ / "run").string()).back()) / "optimizer.safetensors");
  auto r = testing::run_keel("train --resume " + (dir_ / "run").string() + " --set run.steps=40");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("step_00000020 is damaged"), std::string::npos) << r.out;
  auto m = metrics(dir_ / "run"), f = metrics(dir_ / "full");
  ASSERT_EQ(m.size(), 40u);
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_EQ(m[i]["loss"], f[i]["loss"]) << i;
    EXPECT_EQ(m[i]["grad_norm"], f[i]["grad_norm"]) << i;
  }
  auto ev = events_of(dir_ / "run");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["type"], "checkpoint_corrupt");
}

TEST_F(Trainer, SpikeAndFaultConfigErrorsNameTheKey) {
  for (auto [extra, key] : {std::pair{"--set spikes.policy=retry", "spikes.policy"},
                            std::pair{"--set spikes.threshold=0", "spikes.threshold"},
                            std::pair{"--set spikes.min_history=500", "spikes.min_history"},
                            std::pair{"--set faults.poison_steps=[0]", "faults.poison_steps"},
                            std::pair{"--set spikes.windw=5", "spikes.windw"}}) {
    auto r = testing::run_keel(run_cmd((dir_ / "bad").string(), extra));
    EXPECT_EQ(r.status, 2) << extra;
    EXPECT_NE(r.err.find(key), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "bad" / "checkpoints"));
  }
}

}  // namespace
}  // namespace keel::train
