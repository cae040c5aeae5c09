// A checkpoint as a map of named parts: the model, optimizer and train state write today's files
// (the same tensor names, order and state.json keys as every run folder written so far), load
// back bit for bit, and refuse what is not theirs.
#include "keel/train/checkpoint.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "keel/arch/config_file.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/nn/model.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/muon.hpp"
#include "keel/train/run_state.hpp"

namespace keel::train {
namespace {

namespace fs = std::filesystem;

class CheckpointParts : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("keel_checkpoint_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static arch::ModelSpec spec() {
    return arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/qwen3.json", {"tie_word_embeddings=false"});
  }
  // Two Muon steps on made-up gradients, so every state buffer holds something.
  static void train_a_little(nn::TransformerModel& model, optim::Optimizer& opt) {
    auto& store = model.parameters();
    for (int s = 0; s < 2; ++s) {
      for (size_t i = 0; i < store.grads().size(); ++i) store.grads()[i] = 0.01f * std::sin(0.37f * static_cast<float>(i + s));
      opt.step(store, 1e-3f);
    }
  }

  fs::path dir_;
};

TEST_F(CheckpointParts, WriteTodaysFormat) {
  nn::TransformerModel model(spec());
  model.initialize(3);
  optim::Muon muon(model.parameters(), optim::MuonConfig{});
  train_a_little(model, muon);
  TrainState state{7, 700, 28};
  ModelState ms(model, "0123456789abcdef");
  OptimizerState os(muon, model.parameters());
  TrainStateRecord tr(state);
  Checkpoint checkpoint;
  checkpoint.add("model", ms);
  checkpoint.add("optimizer", os);
  checkpoint.add("train", tr);
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"model", "optimizer", "train"}));
  const fs::path dir = checkpoint.save(dir_.string(), 7, 3);
  EXPECT_EQ(dir.filename(), "step_00000007");
  EXPECT_TRUE(fs::exists(dir / "COMMIT"));

  std::ifstream in(dir / "state.json");
  std::stringstream text;
  text << in.rdbuf();
  const auto st = nlohmann::json::parse(text.str());
  std::vector<std::string> keys;
  for (const auto& [k, v] : st.items()) keys.push_back(k);
  // optimizer_world (1 here) came with data parallelism: the world size that wrote the state.
  EXPECT_EQ(keys, (std::vector<std::string>{"checksums", "model_config_hash", "optimizer", "optimizer_steps",
                                            "optimizer_world", "sequences", "step", "tokens"}));
  EXPECT_EQ(st["optimizer_world"], 1);
  EXPECT_EQ(text.str(), st.dump(1) + "\n");
  EXPECT_EQ(st["optimizer"], "muon");
  EXPECT_EQ(st["optimizer_steps"], 2);
  EXPECT_EQ(st["step"], 7);
  EXPECT_EQ(st["tokens"], 700);
  EXPECT_EQ(st["sequences"], 28);

  const auto& entries = model.parameters().entries();
  auto weights = io::SafetensorsFile::open((dir / "model.safetensors").string());
  EXPECT_EQ(weights.metadata()["format"], "pt");
  ASSERT_EQ(weights.tensors().size(), entries.size());
  auto moments = io::SafetensorsFile::open((dir / "optimizer.safetensors").string());
  ASSERT_EQ(moments.tensors().size(), 3 * entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(weights.tensors()[i].name, entries[i].name);
    // Per parameter, every state in turn.
    EXPECT_EQ(moments.tensors()[3 * i].name, "momentum." + entries[i].name);
    EXPECT_EQ(moments.tensors()[3 * i + 1].name, "exp_avg." + entries[i].name);
    EXPECT_EQ(moments.tensors()[3 * i + 2].name, "exp_avg_sq." + entries[i].name);
    EXPECT_EQ(st["checksums"]["model.safetensors"].count(entries[i].name), 1u);
    EXPECT_EQ(st["checksums"]["optimizer.safetensors"].count("exp_avg_sq." + entries[i].name), 1u);
  }
}

TEST_F(CheckpointParts, LoadBackBitForBitAndRefuseOthers) {
  nn::TransformerModel model(spec());
  model.initialize(3);
  optim::Muon muon(model.parameters(), optim::MuonConfig{});
  train_a_little(model, muon);
  TrainState state{7, 700, 28};
  ModelState ms(model, "hash-a");
  OptimizerState os(muon, model.parameters());
  TrainStateRecord tr(state);
  Checkpoint checkpoint;
  checkpoint.add("model", ms);
  checkpoint.add("optimizer", os);
  checkpoint.add("train", tr);
  const std::string dir = checkpoint.save(dir_.string(), 7, 3);

  nn::TransformerModel model2(spec());
  optim::Muon muon2(model2.parameters(), optim::MuonConfig{});
  TrainState state2;
  ModelState ms2(model2, "hash-a");
  OptimizerState os2(muon2, model2.parameters());
  TrainStateRecord tr2(state2);
  Checkpoint again;
  again.add("model", ms2);
  again.add("optimizer", os2);
  again.add("train", tr2);
  again.load(dir);
  EXPECT_EQ(state2.step, 7);
  EXPECT_EQ(state2.tokens, 700);
  EXPECT_EQ(state2.sequences, 28);
  EXPECT_EQ(muon2.steps_taken(), 2);
  const auto& a = model.parameters();
  const auto& b = model2.parameters();
  EXPECT_EQ(std::memcmp(a.values().data(), b.values().data(), a.values().size() * sizeof(float)), 0);
  for (const nn::ParamInfo& p : a.entries()) {
    for (const std::string& s : muon.state_names()) {
      auto x = muon.state(s, p), y = muon2.state(s, p);
      ASSERT_EQ(x.size(), y.size());
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << s << "." << p.name;
    }
  }

  // Another model config, another optimizer: refused before anything loads, as plain errors.
  ModelState foreign(model2, "hash-b");
  Checkpoint c1;
  c1.add("model", foreign);
  EXPECT_THROW(
      {
        try {
          c1.load(dir);
        } catch (const CheckpointCorrupt&) {
          ADD_FAILURE() << "not damage";
          throw;
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("another model config"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  optim::AdamW adamw(model2.parameters(), optim::AdamWConfig{});
  OptimizerState other(adamw, model2.parameters());
  Checkpoint c2;
  c2.add("optimizer", other);
  try {
    c2.load(dir);
    FAIL() << "AdamW loaded Muon state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds muon state but the run uses adamw"), std::string::npos) << e.what();
  }
}

// The data-parallel fields of state.json are outside input too: a world size that is not one, or
// one whose shard files are missing, is damage (CheckpointCorrupt naming the file), not a crash or
// a plan over a million ranks.
TEST_F(CheckpointParts, RefusesABadOptimizerWorld) {
  nn::TransformerModel model(spec());
  model.initialize(3);
  optim::AdamW adamw(model.parameters(), optim::AdamWConfig{});
  train_a_little(model, adamw);
  ModelState ms(model, "0123456789abcdef");
  OptimizerState os(adamw, model.parameters());
  Checkpoint checkpoint;
  checkpoint.add("model", ms);
  checkpoint.add("optimizer", os);
  const fs::path dir = checkpoint.save(dir_.string(), 3, 3);
  const fs::path state = dir / "state.json";
  std::stringstream text;
  text << std::ifstream(state).rdbuf();
  const nlohmann::json good = nlohmann::json::parse(text.str());
  for (const nlohmann::json& world : {nlohmann::json(0), nlohmann::json(1 << 30), nlohmann::json("two"), nlohmann::json(2)}) {
    nlohmann::json bad = good;
    bad["optimizer_world"] = world;
    std::ofstream(state) << bad.dump(1);
    try {
      checkpoint.load(dir.string());
      ADD_FAILURE() << "loaded with optimizer_world " << world;
    } catch (const CheckpointCorrupt& e) {
      const std::string what = e.what();
      // 2: the plan of two ranks names slices ("exp_avg.<name>@0") this one-process file lacks.
      EXPECT_NE(what.find(world == 2 ? "missing tensor" : "optimizer_world"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace keel::train
