// The Optimizer interface as the trainer and the checkpoint use it: names, step counts, and state
// addressed by (state name, parameter) over the same floats as each optimizer's own buffers.
#include "keel/optim/optimizer.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "keel/arch/config_file.hpp"
#include "keel/core/error.hpp"
#include "keel/nn/model.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/muon.hpp"
#include "keel/train/optimizer_factory.hpp"

namespace keel::optim {
namespace {

arch::ModelSpec tiny() {
  return arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/qwen3.json", {"tie_word_embeddings=false"});
}

TEST(Optimizer, AdamWStateIsItsMomentsByName) {
  nn::TransformerModel model(tiny());
  AdamW adamw(model.parameters(), AdamWConfig{});
  Optimizer& opt = adamw;
  EXPECT_EQ(opt.name(), "adamw");
  EXPECT_EQ(opt.state_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  const nn::ParamInfo& p = model.parameters().entries().at(3);
  auto m = opt.state("exp_avg", p);
  EXPECT_EQ(m.data(), adamw.first_moment().data() + p.offset);
  EXPECT_EQ(static_cast<int64_t>(m.size()), p.numel);
  EXPECT_EQ(opt.state("exp_avg_sq", p).data(), adamw.second_moment().data() + p.offset);
  EXPECT_THROW(opt.state("momentum", p), Error);
  opt.set_steps_taken(7);
  EXPECT_EQ(adamw.steps_taken(), 7);
}

TEST(Optimizer, MuonStateAddsMomentumToItsAdamWGroup) {
  nn::TransformerModel model(tiny());
  Muon muon(model.parameters(), MuonConfig{});
  Optimizer& opt = muon;
  EXPECT_EQ(opt.name(), "muon");
  EXPECT_EQ(opt.state_names(), (std::vector<std::string>{"momentum", "exp_avg", "exp_avg_sq"}));
  const nn::ParamInfo& p = model.parameters().entries().at(2);
  EXPECT_EQ(opt.state("momentum", p).data(), muon.momentum_buffer().data() + p.offset);
  EXPECT_EQ(opt.state("exp_avg", p).data(), muon.adamw().first_moment().data() + p.offset);
  EXPECT_THROW(opt.state("exp_avg_sqq", p), Error);
  opt.set_steps_taken(4);
  EXPECT_EQ(muon.adamw().steps_taken(), 4) << "the AdamW group's bias correction follows";
}

TEST(Optimizer, FactoryBuildsTheConfiguredOne) {
  nn::TransformerModel model(tiny());
  train::RunConfig c;
  c.source = "run.toml";
  EXPECT_EQ(train::make_optimizer(c, model.parameters())->name(), "adamw");
  c.optimizer = "muon";
  c.adamw_patterns = {"o_proj"};
  auto opt = train::make_optimizer(c, model.parameters());
  ASSERT_EQ(opt->name(), "muon");
  auto& muon = dynamic_cast<Muon&>(*opt);
  EXPECT_FALSE(muon.uses_muon("model.layers.0.self_attn.o_proj.weight"));
  EXPECT_TRUE(muon.uses_muon("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FLOAT_EQ(muon.config().momentum, 0.95f);
  c.muon_scaling = "spectral";
  try {
    train::make_optimizer(c, model.parameters());
    FAIL() << "unknown scaling accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), "run.toml");
    EXPECT_EQ(e.field(), "optimizer.muon_scaling");
  }
}

}  // namespace
}  // namespace keel::optim
