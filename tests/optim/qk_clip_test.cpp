// QK-Clip on tiny llama (GQA 2), qwen2 (MHA with q/k biases), mistral (MQA, group 4), qwen3
// (QK-Norm) and MLA (deepseek_v3 / kimi_k2 with dense MLPs, with and without q_lora): clipped
// heads land on tau, unclipped heads keep their logits (and, outside clipped groups, their bits),
// heads below tau change nothing, unsupported input throws.
#include <gtest/gtest.h>

#include <cstring>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "keel/arch/config_file.hpp"
#include "keel/core/error.hpp"
#include "keel/nn/model.hpp"
#include "keel/optim/qk_clip.hpp"

namespace keel::optim {
namespace {

constexpr int64_t kBatch = 2, kSeq = 16;

arch::ModelSpec tiny_spec(const std::string& config) {
  return arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/" + config, {});
}

void fill_normal(float* p, int64_t n, uint32_t seed, float std) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, std);
  for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
}

bool is_qk_param(const std::string& name) {
  return name.find(".q_proj.") != std::string::npos || name.find(".k_proj.") != std::string::npos;
}

// The MLA projections that feed q or k: drawn large so that logits are far above the usual scale.
bool feeds_mla_logits(const std::string& name) {
  for (const char* p : {".q_a_proj.", ".q_b_proj.", ".kv_a_proj_with_mqa.", ".kv_b_proj."})
    if (name.find(p) != std::string::npos) return true;
  return false;
}

// A model whose q/k weights (and biases, QK-Norm gains) are large enough for logits far above the
// usual scale. o_proj is zeroed so attention adds nothing to the residual stream: every layer then
// sees the same input before and after the clip, and its max logits compare head by head.
struct Fixture {
  explicit Fixture(const std::string& config, const std::vector<std::string>& sets = {})
      : model(arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/" + config, sets)) {
    model.initialize(7);
    auto& store = model.parameters();
    uint32_t seed = 100;
    for (const auto& e : store.entries()) {
      float* p = store.data(e.name);
      if (is_qk_param(e.name) || feeds_mla_logits(e.name)) fill_normal(p, e.numel, ++seed, 0.7f);
      if (e.name.find(".o_proj.") != std::string::npos) std::fill(p, p + e.numel, 0.f);
      if (e.name.find("_norm.weight") != std::string::npos && e.name.find("self_attn") != std::string::npos) {
        std::mt19937 rng(++seed);
        std::uniform_real_distribution<float> u(1.f, 4.f);
        for (int64_t i = 0; i < e.numel; ++i) p[i] = u(rng);
      }
    }
    std::mt19937 rng(3);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model.spec().vocab_size - 1));
    tokens.resize(kBatch * kSeq);
    targets.resize(kBatch * kSeq);
    for (auto& t : tokens) t = tok(rng);
    for (auto& t : targets) t = tok(rng);
  }
  std::vector<float> max_logits() {
    model.forward_loss(tokens.data(), targets.data(), kBatch, kSeq);
    return model.max_logits();
  }
  nn::TransformerModel model;
  std::vector<int32_t> tokens, targets;
};

// A tau strictly between the middle two head maxima: about half the heads clip.
float median_tau(std::vector<float> s) {
  std::sort(s.begin(), s.end());
  const size_t m = s.size() / 2;
  EXPECT_LT(s[m - 1], s[m]);
  return 0.5f * (s[m - 1] + s[m]);
}

int64_t count_above(const std::vector<float>& s, float tau) {
  return std::count_if(s.begin(), s.end(), [tau](float v) { return v > tau; });
}

bool rows_equal(const std::vector<float>& before, const nn::ParameterStore& store, const nn::ParamInfo& e,
                int64_t first, int64_t count) {
  return std::memcmp(before.data() + e.offset + first, store.values().data() + e.offset + first,
                     sizeof(float) * static_cast<size_t>(count)) == 0;
}

// MHA / GQA / MQA: the rule is exact, so clipped heads land on tau and the rest keep their logits.
void check_projection_clip(const std::string& config, int64_t expect_group, bool expect_bias,
                           const std::vector<std::string>& sets = {}) {
  Fixture f(config, sets);
  const auto& spec = f.model.spec();
  auto& store = f.model.parameters();
  const int64_t heads = spec.attention.num_heads, kv = spec.attention.num_kv_heads, hd = spec.attention.head_dim;
  const int64_t hidden = spec.hidden_size, group = heads / kv;
  // With the output gate each head's q_proj rows are its query then its gate (Qwen3-Next).
  const int64_t q_rows = spec.attention.output_gate ? 2 * hd : hd;
  ASSERT_EQ(group, expect_group);
  ASSERT_EQ(store.find("model.layers.0.self_attn.q_proj.bias") != nullptr, expect_bias);

  const std::vector<float> before_logits = f.max_logits();
  const float tau = median_tau(before_logits);
  const std::vector<float> before(store.values().begin(), store.values().end());
  const QkClipReport r = qk_clip(store, spec, before_logits, QkClipConfig{tau});
  EXPECT_EQ(r.clipped_heads, count_above(before_logits, tau));
  EXPECT_GT(r.clipped_heads, 0);
  EXPECT_LT(r.clipped_heads, static_cast<int64_t>(before_logits.size()));
  ASSERT_EQ(r.gamma.size(), before_logits.size());

  const std::vector<float> after_logits = f.max_logits();
  int64_t untouched_groups = 0;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const nn::ParamInfo* wq = store.find(p + "q_proj.weight");
    const nn::ParamInfo* wk = store.find(p + "k_proj.weight");
    const nn::ParamInfo* bq = store.find(p + "q_proj.bias");
    const nn::ParamInfo* bk = store.find(p + "k_proj.bias");
    for (int64_t g = 0; g < kv; ++g) {
      bool group_clipped = false;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const size_t i = static_cast<size_t>(l * heads + h);
        const float s0 = before_logits[i], s1 = after_logits[i];
        if (s0 > tau) {
          group_clipped = true;
          EXPECT_FLOAT_EQ(r.gamma[i], tau / s0);
          EXPECT_LE(s1, tau * (1 + 1e-4f)) << config << " layer " << l << " head " << h;
          EXPECT_GE(s1, tau * (1 - 1e-3f)) << config << " layer " << l << " head " << h;
        } else {
          EXPECT_EQ(r.gamma[i], 1.f);
          EXPECT_NEAR(s1, s0, 1e-5f * std::abs(s0)) << config << " layer " << l << " head " << h;
        }
      }
      if (group_clipped) continue;
      // No clipped head reads this kv head: its k rows and all its query heads' q rows keep their bits.
      ++untouched_groups;
      EXPECT_TRUE(rows_equal(before, store, *wk, g * hd * hidden, hd * hidden)) << config << " layer " << l;
      EXPECT_TRUE(rows_equal(before, store, *wq, g * group * q_rows * hidden, group * q_rows * hidden)) << config;
      if (bk) {
        EXPECT_TRUE(rows_equal(before, store, *bk, g * hd, hd));
      }
      if (bq) {
        EXPECT_TRUE(rows_equal(before, store, *bq, g * group * q_rows, group * q_rows));
      }
    }
  }
  if (group == 1) {
    EXPECT_GT(untouched_groups, 0);  // MHA: every unclipped head is bit-identical
  }
  // Everything but the q/k projections keeps its bits (sinks included); so do the gate rows.
  for (const auto& e : store.entries()) {
    if (!is_qk_param(e.name)) {
      EXPECT_TRUE(rows_equal(before, store, e, 0, e.numel)) << e.name;
    }
  }
  if (spec.attention.output_gate) {
    for (int64_t l = 0; l < spec.num_layers; ++l) {
      const nn::ParamInfo* wq = store.find("model.layers." + std::to_string(l) + ".self_attn.q_proj.weight");
      for (int64_t h = 0; h < heads; ++h) {
        EXPECT_TRUE(rows_equal(before, store, *wq, (h * q_rows + hd) * hidden, hd * hidden)) << "gate rows, head " << h;
      }
    }
  }
}

TEST(QkClip, MhaWithBiasesQwen2) { check_projection_clip("qwen2.json", 1, true); }
TEST(QkClip, GqaGroupTwoLlama) { check_projection_clip("llama.json", 2, false); }
TEST(QkClip, MqaGroupFourMistral) { check_projection_clip("mistral.json", 4, false); }
TEST(QkClip, OutputGateScalesOnlyTheQueryRows) {
  check_projection_clip("llama.json", 2, true, {"keel.attn_output_gate=true", "attention_bias=true"});
}
TEST(QkClip, GptOssWithSinksAndBiases) { check_projection_clip("gpt_oss.json", 2, true); }

// MLA (Kimi K2 §2.1): per clipped head, q^C rows and k^C rows (kv_b_proj) by sqrt(gamma), q^R rows
// by gamma; the shared k^R (kv_a_proj_with_mqa), v rows and everything else keep their bits.
void check_mla_clip(const std::string& config, const std::vector<std::string>& sets, bool q_lora) {
  Fixture f(config, sets);
  const auto& spec = f.model.spec();
  auto& store = f.model.parameters();
  const auto& a = spec.attention;
  ASSERT_EQ(a.kind, arch::AttentionKind::Mla);
  ASSERT_EQ(a.q_lora_rank > 0, q_lora);
  const int64_t heads = a.num_heads, nope = a.qk_nope_head_dim, qk = nope + a.qk_rope_head_dim;
  const int64_t kvb_rows = nope + a.v_head_dim, q_in = q_lora ? a.q_lora_rank : spec.hidden_size;
  const std::string q_name = q_lora ? "q_b_proj.weight" : "q_proj.weight";

  const std::vector<float> before_logits = f.max_logits();
  const float tau = median_tau(before_logits);
  const std::vector<float> before(store.values().begin(), store.values().end());
  const QkClipReport r = qk_clip(store, spec, before_logits, QkClipConfig{tau});
  EXPECT_EQ(r.clipped_heads, count_above(before_logits, tau));
  EXPECT_GT(r.clipped_heads, 0);
  EXPECT_LT(r.clipped_heads, static_cast<int64_t>(before_logits.size()));

  const std::vector<float> after_logits = f.max_logits();
  int64_t unclipped = 0;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const nn::ParamInfo* wq = store.find(p + q_name);
    const nn::ParamInfo* wkv_b = store.find(p + "kv_b_proj.weight");
    ASSERT_NE(wq, nullptr);
    ASSERT_NE(wkv_b, nullptr);
    for (int64_t h = 0; h < heads; ++h) {
      const size_t i = static_cast<size_t>(l * heads + h);
      const float s0 = before_logits[i], s1 = after_logits[i];
      // v rows never change.
      EXPECT_TRUE(rows_equal(before, store, *wkv_b, (h * kvb_rows + nope) * a.kv_lora_rank,
                             a.v_head_dim * a.kv_lora_rank))
          << config << " layer " << l << " head " << h;
      if (s0 > tau) {
        EXPECT_FLOAT_EQ(r.gamma[i], tau / s0);
        EXPECT_LE(s1, tau * (1 + 1e-4f)) << config << " layer " << l << " head " << h;
        EXPECT_GE(s1, tau * (1 - 1e-3f)) << config << " layer " << l << " head " << h;
        // The rows moved by the expected factors (fp32 products of the old values).
        const float g = r.gamma[i], root = std::sqrt(g);
        const float* now = store.values().data();
        const int64_t q0 = wq->offset + h * qk * q_in, k0 = wkv_b->offset + h * kvb_rows * a.kv_lora_rank;
        EXPECT_NEAR(now[q0], before[q0] * root, 1e-6f * std::abs(before[q0]) + 1e-12f);
        const int64_t qr = q0 + nope * q_in;
        EXPECT_NEAR(now[qr], before[qr] * g, 1e-6f * std::abs(before[qr]) + 1e-12f);
        if (nope > 0) {
          EXPECT_NEAR(now[k0], before[k0] * root, 1e-6f * std::abs(before[k0]) + 1e-12f);
        }
      } else {
        ++unclipped;
        EXPECT_EQ(r.gamma[i], 1.f);
        EXPECT_NEAR(s1, s0, 1e-5f * std::abs(s0)) << config << " layer " << l << " head " << h;
        EXPECT_TRUE(rows_equal(before, store, *wq, h * qk * q_in, qk * q_in)) << config << " layer " << l;
        EXPECT_TRUE(rows_equal(before, store, *wkv_b, h * kvb_rows * a.kv_lora_rank, kvb_rows * a.kv_lora_rank))
            << config << " layer " << l;
      }
    }
  }
  EXPECT_GT(unclipped, 0);
  // Everything but q_b_proj / q_proj and kv_b_proj keeps its bits, the shared k^R rows of
  // kv_a_proj_with_mqa included.
  for (const auto& e : store.entries()) {
    if (e.name.find(q_name) == std::string::npos && e.name.find("kv_b_proj.weight") == std::string::npos) {
      EXPECT_TRUE(rows_equal(before, store, e, 0, e.numel)) << e.name;
    }
  }
}

TEST(QkClip, MlaWithQLoraDeepseekV3) { check_mla_clip("deepseek_v3_dense.json", {}, true); }
TEST(QkClip, MlaWithoutQLoraKimiK2) {
  check_mla_clip("kimi_k2_dense.json", {"q_lora_rank=null", "rope_interleave=false"}, false);
}
// YaRN: cos/sin carry the attention factor and the softmax scale mscale²; the clip stays exact.
TEST(QkClip, MlaWithYarnAndBiases) {
  check_mla_clip("deepseek_v3_dense.json",
                 {"attention_bias=true", "rope_scaling.type=yarn", "rope_scaling.factor=4.0", "rope_scaling.mscale=1.0",
                  "rope_scaling.mscale_all_dim=0.7", "rope_scaling.original_max_position_embeddings=32"},
                 true);
}

// QK-Norm: one factor per layer on the shared gains; every head ends at or below tau, the most
// clipped head lands on it, and the other heads of a clipped layer shrink by the same factor.
TEST(QkClip, QkNormGainsQwen3) {
  Fixture f("qwen3.json");
  const auto& spec = f.model.spec();
  auto& store = f.model.parameters();
  ASSERT_TRUE(spec.attention.qk_norm);
  const int64_t heads = spec.attention.num_heads;
  const std::vector<float> before_logits = f.max_logits();
  const float tau = median_tau(before_logits);
  const std::vector<float> before(store.values().begin(), store.values().end());
  const QkClipReport r = qk_clip(store, spec, before_logits, QkClipConfig{tau});
  EXPECT_EQ(r.clipped_heads, count_above(before_logits, tau));
  EXPECT_GT(r.clipped_heads, 0);

  const std::vector<float> after_logits = f.max_logits();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const auto first = before_logits.begin() + l * heads;
    const float smax = *std::max_element(first, first + heads);
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const bool clipped = smax > tau;
    const double gl = clipped ? tau / static_cast<double>(smax) : 1.0;
    for (int64_t h = 0; h < heads; ++h) {
      const size_t i = static_cast<size_t>(l * heads + h);
      EXPECT_LE(after_logits[i], tau * (1 + 1e-4f)) << "layer " << l << " head " << h;
      EXPECT_NEAR(after_logits[i], before_logits[i] * gl, 1e-4 * std::abs(before_logits[i])) << "layer " << l;
    }
    if (clipped) {
      EXPECT_GE(*std::max_element(after_logits.begin() + l * heads, after_logits.begin() + (l + 1) * heads),
                tau * (1 - 1e-3f));
    } else {
      for (const char* n : {"q_norm.weight", "k_norm.weight"})
        EXPECT_TRUE(rows_equal(before, store, *store.find(p + n), 0, spec.attention.head_dim)) << "layer " << l;
    }
  }
  // The projections are left alone: the per-head RMSNorm would cancel any scaling of them.
  for (const auto& e : store.entries()) {
    if (e.name.find("_norm.weight") == std::string::npos || e.name.find("self_attn") == std::string::npos) {
      EXPECT_TRUE(rows_equal(before, store, e, 0, e.numel)) << e.name;
    }
  }
}

TEST(QkClip, BelowTauChangesNothing) {
  for (const char* config : {"qwen2.json", "llama.json", "mistral.json", "qwen3.json", "deepseek_v3_dense.json"}) {
    Fixture f(config);
    auto& store = f.model.parameters();
    const std::vector<float> logits = f.max_logits();
    const float tau = *std::max_element(logits.begin(), logits.end());  // S > tau is strict: tau itself stays
    const std::vector<float> before(store.values().begin(), store.values().end());
    const QkClipReport r = qk_clip(store, f.model.spec(), logits, QkClipConfig{tau});
    EXPECT_EQ(r.clipped_heads, 0) << config;
    EXPECT_TRUE(std::all_of(r.gamma.begin(), r.gamma.end(), [](float g) { return g == 1.f; })) << config;
    EXPECT_EQ(std::memcmp(before.data(), store.values().data(), sizeof(float) * before.size()), 0) << config;
  }
}

TEST(QkClip, RejectsGpt2AndBadInput) {
  nn::ParameterStore empty;
  const arch::ModelSpec gpt2 = tiny_spec("gpt2.json");
  try {
    qk_clip(empty, gpt2, std::vector<float>(static_cast<size_t>(gpt2.num_layers * gpt2.attention.num_heads), 1e4f),
            {});
    FAIL() << "gpt2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gpt2"), std::string::npos) << e.what();
  }
  Fixture f("llama.json");
  auto& store = f.model.parameters();
  EXPECT_THROW(qk_clip(store, f.model.spec(), std::vector<float>(3, 1e4f), {}), Error);
  std::vector<float> logits = f.max_logits();
  EXPECT_THROW(qk_clip(store, f.model.spec(), logits, QkClipConfig{0.f}), Error);
  logits[1] = std::nanf("");
  EXPECT_THROW(qk_clip(store, f.model.spec(), logits, {}), Error);
}

}  // namespace
}  // namespace keel::optim
