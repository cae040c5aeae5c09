// Level 2 of the correctness tests: each family against a PyTorch reference. The fixtures under
// tests/fixtures/<name>/ were written by tools/make_fixtures.py (float64 math, stored as F32):
// initial weights, tokens, logits, loss, every gradient by HF name, per-head max logits, and the
// weights after 3 AdamW steps. keel (fp32) must agree to a relative error of 1e-4, measured per
// tensor as max|keel − ref| / max|ref|; the worst element of each tensor is reported.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "keel/arch/config_file.hpp"
#include "keel/io/hf_checkpoint.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/nn/model.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/grad_clip.hpp"

namespace keel::nn {
namespace {

namespace fs = std::filesystem;
constexpr double kTolerance = 1e-4;
// Weights after three AdamW steps, relative to the tensor's largest weight. AdamW divides each
// gradient by its own RMS, so an element whose gradient is a few percent of its tensor's largest
// carries fp32 summation-order differences into its update magnified tens of times: the
// llama_caps_zloss fixture's worst element (gradient 2.4% of the max) measured 9.2e-5 in the
// release build and 9.4e-5 under ASan with oneDNN's attention blocks, 9.4e-5 and 1.12e-4 with
// keel's block kernel, with every logit and gradient within kTolerance. Twice kTolerance leaves
// that rounding room; a wrong update is off by a sizeable fraction of lr (1e-2), 100x more.
constexpr double kAdamWStepTolerance = 2e-4;

struct Worst {
  double rel = 0;
  size_t index = 0;
  float got = 0, want = 0;
};

Worst compare(const float* got, const std::vector<float>& want) {
  double scale = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  scale = std::max(scale, 1e-12);
  Worst worst;
  for (size_t i = 0; i < want.size(); ++i) {
    double rel = std::fabs(static_cast<double>(got[i]) - want[i]) / scale;
    if (!(rel <= worst.rel)) worst = {rel, i, got[i], want[i]};  // NaN-aware
  }
  return worst;
}

#define EXPECT_CLOSE(what, keel_values, reference)                                                           \
  do {                                                                                                       \
    Worst w_ = compare((keel_values), (reference));                                                          \
    EXPECT_LE(w_.rel, kTolerance) << (what) << ": worst element " << w_.index << " keel " << w_.got << " ref " \
                                  << w_.want << " (relative " << w_.rel << ")";                             \
  } while (0)

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  const fs::path root = fs::path(KEEL_SOURCE_DIR) / "tests" / "fixtures";
  if (!fs::is_directory(root)) return names;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (fs::exists(entry.path() / "reference.safetensors")) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class PytorchReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::path(KEEL_SOURCE_DIR) / "tests" / "fixtures" / GetParam();
    ref_ = std::make_unique<io::SafetensorsFile>(io::SafetensorsFile::open((dir_ / "reference.safetensors").string()));
    spec_ = arch::load_model_spec((dir_ / "config.json").string());
    model_ = std::make_unique<TransformerModel>(spec_);
    load_initial();
    auto tokens = ref_->read_i64("tokens");
    const auto& shape = ref_->find("tokens")->shape;
    batch_ = shape[0];
    seq_ = shape[1];
    for (int64_t i = 0; i < batch_ * seq_; ++i) {
      tokens_.push_back(static_cast<int32_t>(tokens[i]));
      targets_.push_back(i % seq_ == seq_ - 1 ? -1 : static_cast<int32_t>(tokens[i + 1]));
    }
  }
  void load_initial() {
    for (const ParamInfo& p : model_->parameters().entries()) {
      ASSERT_NE(ref_->find("param." + p.name), nullptr) << "fixture lacks param." << p.name;
      auto v = ref_->read_f32("param." + p.name);
      ASSERT_EQ(static_cast<int64_t>(v.size()), p.numel) << p.name;
      std::copy(v.begin(), v.end(), model_->parameters().data(p.name));
    }
  }
  double scalar(const std::string& name) { return ref_->read_f32(name).at(0); }

  fs::path dir_;
  std::unique_ptr<io::SafetensorsFile> ref_;
  arch::ModelSpec spec_;
  std::unique_ptr<TransformerModel> model_;
  int64_t batch_ = 0, seq_ = 0;
  std::vector<int32_t> tokens_, targets_;
};

TEST_P(PytorchReference, LogitsLossGradientsMaxLogits) {
  std::vector<float> logits(static_cast<size_t>(batch_ * seq_ * spec_.vocab_size));
  model_->forward_logits(tokens_.data(), batch_, seq_, logits.data());
  EXPECT_CLOSE("logits", logits.data(), ref_->read_f32("logits"));

  auto& store = model_->parameters();
  store.zero_grad();
  LossSums r = model_->forward_backward(tokens_.data(), targets_.data(), batch_, seq_, 1.0f / static_cast<float>(batch_ * (seq_ - 1)));
  ASSERT_EQ(r.count, batch_ * (seq_ - 1));
  const double ce = r.ce_sum / r.count;
  const double loss = (r.ce_sum + spec_.z_loss * r.z_sum) / r.count;
  EXPECT_NEAR(ce, scalar("ce"), kTolerance * std::fabs(scalar("ce")));
  EXPECT_NEAR(loss, scalar("loss"), kTolerance * std::fabs(scalar("loss")));

  int checked = 0;
  for (const ParamInfo& p : store.entries()) {
    ASSERT_NE(ref_->find("grad." + p.name), nullptr) << p.name;
    EXPECT_CLOSE("grad." + p.name, store.grad(p.name), ref_->read_f32("grad." + p.name));
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(store.entries().size()));

  auto max_logit = ref_->read_f32("max_logit");
  ASSERT_EQ(max_logit.size(), model_->max_logits().size());
  EXPECT_CLOSE("max_logit", model_->max_logits().data(), max_logit);
}

// The import path on the reference's own weights: the fixture's parameters (written by the
// PyTorch reference under HF's names) as a sharded fp32 HF folder, loaded
// through io::load_model_dir, give the reference's logits. A name or layout keel spelled
// differently from HF's modeling code would fail here for that family.
TEST_P(PytorchReference, ImportedAsAnHfFolderGivesTheReferenceLogits) {
  const fs::path folder = fs::path(::testing::TempDir()) / ("keel_import_" + std::to_string(::getpid()) + "_" + GetParam());
  fs::remove_all(folder);
  fs::create_directories(folder);
  fs::copy_file(dir_ / "config.json", folder / "config.json");
  std::vector<std::vector<float>> values;
  std::vector<io::TensorToWrite> tensors;
  for (const auto& t : ref_->tensors()) {
    if (!t.name.starts_with("param.")) continue;
    values.push_back(ref_->read_f32(t.name));
    tensors.push_back({t.name.substr(6), io::DType::F32, t.shape, values.back().data()});
  }
  ASSERT_FALSE(tensors.empty());
  io::write_hf_weights(folder.string(), tensors, 20'000);  // several shards and an index
  ASSERT_TRUE(fs::exists(folder / io::kWeightsIndexFile));
  io::LoadedModel loaded = io::load_model_dir(folder.string());
  std::vector<float> logits(static_cast<size_t>(batch_ * seq_ * spec_.vocab_size));
  loaded.model->forward_logits(tokens_.data(), batch_, seq_, logits.data());
  EXPECT_CLOSE("logits", logits.data(), ref_->read_f32("logits"));
  fs::remove_all(folder);
}

TEST_P(PytorchReference, ThreeAdamWSteps) {
  const auto& meta = ref_->metadata();
  auto num = [&](const char* key, double fallback) {
    return meta.contains(key) ? std::stod(meta[key].get<std::string>()) : fallback;
  };
  const float lr = static_cast<float>(num("lr", 1e-2));
  optim::AdamWConfig cfg{static_cast<float>(num("beta1", 0.9)), static_cast<float>(num("beta2", 0.95)),
                         static_cast<float>(num("eps", 1e-8)), static_cast<float>(num("weight_decay", 0.1))};
  const double clip = num("clip", 1.0);
  auto& store = model_->parameters();
  optim::AdamW adamw(store, cfg);
  auto losses = ref_->read_f32("step_losses");
  ASSERT_EQ(losses.size(), 3u);
  for (int step = 0; step < 3; ++step) {
    store.zero_grad();
    LossSums r = model_->forward_backward(tokens_.data(), targets_.data(), batch_, seq_,
                                          1.0f / static_cast<float>(batch_ * (seq_ - 1)));
    const double loss = (r.ce_sum + spec_.z_loss * r.z_sum) / r.count;
    EXPECT_NEAR(loss, losses[step], kTolerance * std::fabs(losses[step])) << "step " << step;
    optim::clip_grad_norm(store.grads(), clip);
    adamw.step(store, lr);
  }
  // AdamW divides each gradient by its own RMS, so where a gradient is tiny next to the rest of
  // its tensor (or zero by symmetry, like a key bias before softmax) fp32 rounding alone flips
  // the update direction. Those elements are held to the optimizer's own bound (3 steps move a
  // weight by at most ~3·lr); every other element to kAdamWStepTolerance.
  for (const ParamInfo& p : store.entries()) {
    auto want = ref_->read_f32("step3." + p.name);
    auto grad = ref_->read_f32("grad." + p.name);
    double gmax = 0, pmax = 1e-12;
    for (size_t i = 0; i < want.size(); ++i) {
      gmax = std::max(gmax, static_cast<double>(std::fabs(grad[i])));
      pmax = std::max(pmax, static_cast<double>(std::fabs(want[i])));
    }
    const float* got = store.data(p.name);
    double worst = 0;
    size_t worst_i = 0, ill_conditioned = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
      // gmax == 0: no token reached this expert at step 0, so steps 1 and 2 are AdamW's first on
      // it, where every element moves by about ±lr whatever its gradient's size: all of them
      // are held to the optimizer's bound.
      if (std::fabs(grad[i]) < 1e-3 * gmax || gmax == 0) {
        ++ill_conditioned;
        EXPECT_LE(diff, 3.5 * lr) << "step3." << p.name << "[" << i << "]";
        continue;
      }
      if (diff / pmax > worst) {
        worst = diff / pmax;
        worst_i = i;
      }
    }
    EXPECT_LE(worst, kAdamWStepTolerance) << "step3." << p.name << ": worst element " << worst_i << " keel " << got[worst_i]
                                 << " ref " << want[worst_i] << " step-0 gradient " << grad[worst_i] << " of max "
                                 << gmax << " (" << ill_conditioned << " of " << want.size()
                                 << " elements with gradients below 1e-3 of the tensor's max held to 3.5·lr)";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PytorchReference, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Each family's own fixture is required by tests/arch/family_table_test.cpp (it iterates the
// family table); these are the variants of the "keel" object that need their own reference.
TEST(PytorchReferenceFixtures, EveryKeelVariantHasOne) {
  auto names = fixture_names();
  for (const char* variant : {"llama_layernorm_post", "llama_sandwich", "llama_post_embed_scale", "llama_caps_zloss",
                              "llama_qknorm_bias", "llama_geglu", "llama_relu", "deepseek_v3_mla", "mla_no_q_lora"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), variant), names.end()) << "missing fixture " << variant;
  }
}

}  // namespace
}  // namespace keel::nn
