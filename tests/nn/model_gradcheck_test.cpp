// Whole-model gradient checks by finite differences: for every family and every "keel" variant,
// the directional derivative of the loss along random directions must match the backward pass.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "keel/arch/config_file.hpp"
#include "keel/arch/families.hpp"
#include "keel/arch/hf_tensors.hpp"
#include "keel/core/error.hpp"
#include "keel/nn/model.hpp"

namespace keel::nn {
namespace {

struct Case {
  const char* name;
  const char* config;
  std::vector<std::string> sets;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

class ModelGradCheck : public ::testing::TestWithParam<Case> {};

double objective(TransformerModel& m, const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt, int64_t b,
                 int64_t t) {
  LossSums r = m.forward_loss(tok.data(), tgt.data(), b, t);
  return (r.ce_sum + m.spec().z_loss * r.z_sum) / static_cast<double>(r.count);
}

TEST_P(ModelGradCheck, DirectionalDerivativeMatchesBackward) {
  const Case& c = GetParam();
  arch::ModelSpec spec = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/" + c.config, c.sets);
  TransformerModel model(spec);
  model.initialize(3);
  auto& store = model.parameters();
  // Larger weights than the 0.02 init so attention is not uniform and every path matters.
  std::mt19937 gen(11);
  std::normal_distribution<float> noise(0.f, 1.f);
  for (const ParamInfo& p : store.entries()) {
    float* v = store.values().data() + p.offset;
    for (int64_t i = 0; i < p.numel; ++i) {
      v[i] = p.init == Init::Normal ? 0.2f * noise(gen) : (p.init == Init::Ones ? 1.f + 0.1f * noise(gen) : 0.1f * noise(gen));
    }
  }
  const int64_t b = 2, t = 7;  // T not a multiple of any block size
  std::vector<int32_t> tok(b * t), tgt(b * t);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(spec.vocab_size - 1));
  for (auto& x : tok) x = id(gen);
  for (int64_t i = 0; i < b * t; ++i) tgt[i] = (i % t == t - 1) ? -1 : tok[i + 1];
  tgt[3] = -1;  // an ignored position in the middle

  store.zero_grad();
  LossSums r = model.forward_backward(tok.data(), tgt.data(), b, t, 1.0f);
  const double scale = 1.0 / static_cast<double>(r.count);
  std::vector<float> grad(store.grads().begin(), store.grads().end());
  std::vector<float> base(store.values().begin(), store.values().end());

  // MoE: the experts every token chose, per layer; a probe that changes any crosses a kink.
  auto routing = [&] {
    std::vector<int32_t> all;
    for (int64_t l = 0; l < spec.num_layers; ++l) {
      if (const Moe* m = model.moe_layer(l)) all.insert(all.end(), m->selected().begin(), m->selected().end());
    }
    return all;
  };
  const std::vector<int32_t> base_routing = routing();
  int flips = 0;
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<float> dir(base.size());
    double gd = 0;
    for (size_t i = 0; i < dir.size(); ++i) {
      dir[i] = noise(gen);
      gd += static_cast<double>(grad[i]) * scale * dir[i];
    }
    // ReLU's kink: a smaller step crosses fewer kinks (the kernel-level ReGLU check is exact).
    // MLA chains more matrices (x -> q_a -> norm -> q_b, x -> kv_a -> norm -> kv_b), so at this
    // init the central difference's O(eps²) term is larger: a smaller step (the error falls as eps²).
    // MoE: a smaller step also crosses fewer top-k boundaries (each direction moves every router logit).
    const float eps = spec.mlp.activation == arch::Activation::Relu ? 1e-4f
                      : spec.moe.enabled                             ? 2e-4f
                      : spec.attention.kind == arch::AttentionKind::Mla ? 2.5e-4f
                                                                        : 1e-3f;
    auto at = [&](float s) {
      for (size_t i = 0; i < base.size(); ++i) store.values()[i] = base[i] + s * dir[i];
      return objective(model, tok, tgt, b, t);
    };
    const double plus = at(eps);
    const bool plus_same = routing() == base_routing;
    const double minus = at(-eps);
    // MoE: a direction that flips a top-k choice crosses a kink of the loss; draw another.
    if ((!plus_same || routing() != base_routing) && flips < 20) {
      ++flips;
      --trial;
      continue;
    }
    const double fd = (plus - minus) / (2.0 * eps);
    EXPECT_NEAR(fd, gd, 2e-2 * std::max(1.0, std::fabs(gd))) << c.name << " trial " << trial << " (" << flips
                                                              << " directions redrawn for routing changes)";
  }
  for (size_t i = 0; i < base.size(); ++i) store.values()[i] = base[i];
}

INSTANTIATE_TEST_SUITE_P(
    Families, ModelGradCheck,
    ::testing::Values(Case{"gpt2", "gpt2.json", {}}, Case{"llama", "llama.json", {}},
                      Case{"mistral_mqa_hd24", "mistral.json", {}}, Case{"qwen2_bias_tied", "qwen2.json", {}},
                      Case{"qwen3_qknorm", "qwen3.json", {}},
                      // OLMo 2: post-sublayer norms, QK-Norm over the full q and k widths (GQA 4/2).
                      Case{"olmo2", "olmo2.json", {}},
                      // Gemma 2: (1 + w) sandwich norms, soft-caps, query_pre_attn_scalar, GeGLU,
                      // √hidden embeddings; layer 0 local with a window of 4 (the cache drops rows).
                      Case{"gemma2_window4", "gemma2.json", {"sliding_window=4", "attn_logit_softcapping=3"}},
                      // Gemma 3: (1 + w) QK-Norm, local layers with their own RoPE base and a window
                      // of 5, the global layer with linear RoPE scaling.
                      Case{"gemma3_local_global", "gemma3_text.json",
                           {"sliding_window=5", "rope_scaling={\"rope_type\": \"linear\", \"factor\": 2.0}"}},
                      Case{"gemma2_layer_types", "gemma2.json",
                           {"sliding_window=6", "layer_types=[\"full_attention\", \"sliding_attention\"]"}},
                      Case{"full_width_qknorm_sandwich", "llama.json", {"keel.qk_norm=full_width", "keel.norm_placement=sandwich"}},
                      Case{"gqa4", "llama.json", {"num_attention_heads=8", "num_key_value_heads=2", "head_dim=8"}},
                      Case{"layernorm_post", "llama.json", {"keel.norm=layernorm", "keel.norm_placement=post"}},
                      Case{"sandwich", "llama.json", {"keel.norm_placement=sandwich"}},
                      Case{"post_embed_scale", "llama.json", {"keel.norm_placement=post", "keel.embed_scale=sqrt_hidden"}},
                      Case{"gpt2_embed_scale", "gpt2.json", {"keel.embed_scale=3"}},
                      Case{"qknorm_qkvbias", "llama.json", {"keel.qk_norm=true", "keel.qkv_bias=true"}},
                      Case{"caps_zloss", "llama.json", {"keel.attn_softcap=5", "keel.final_softcap=3", "keel.z_loss=0.01"}},
                      Case{"geglu", "llama.json", {"hidden_act=gelu"}},
                      Case{"plain_gelu_mlp", "llama.json", {"keel.mlp=plain", "hidden_act=gelu", "mlp_bias=true"}},
                      Case{"reglu_tied", "llama.json", {"hidden_act=relu", "tie_word_embeddings=true"}},
                      Case{"llama_bias", "llama.json", {"attention_bias=true", "mlp_bias=true"}},
                      Case{"partial_rotary", "qwen3.json", {"partial_rotary_factor=0.5"}},
                      // MLA with dense MLPs: q_lora + interleaved RoPE (DeepSeek-V3 defaults);
                      // q_proj + rotate-half; biases, YaRN (cos/sin factor and mscale² in the
                      // softmax scale), v_head_dim != qk head dim, soft-cap; qk_nope_head_dim 0.
                      Case{"mla_qlora_interleave", "deepseek_v3_dense.json", {}},
                      Case{"mla_qproj_halves", "kimi_k2_dense.json", {"q_lora_rank=null", "rope_interleave=false"}},
                      Case{"mla_bias_yarn_vdim_cap", "deepseek_v3_dense.json",
                           {"attention_bias=true", "v_head_dim=12", "rope_scaling.type=yarn", "rope_scaling.factor=4.0",
                            "rope_scaling.original_max_position_embeddings=32", "rope_scaling.mscale=1.0",
                            "rope_scaling.mscale_all_dim=0.7", "keel.attn_softcap=5"}},
                      Case{"mla_rope_only", "deepseek_v3_dense.json", {"qk_nope_head_dim=0", "q_lora_rank=null"}},
                      // The study's ablation: no q_a_layernorm / kv_a_layernorm.
                      Case{"mla_no_latent_norms", "deepseek_v3_dense.json", {"keel.mla_latent_norms=false"}},
                      Case{"mixtral_moe", "mixtral.json", {}},
                      Case{"qwen3_moe", "qwen3_moe.json", {}},
                      Case{"qwen3_moe_raw_topk", "qwen3_moe.json", {"norm_topk_prob=false", "mlp_only_layers=[]"}},
                      Case{"glm4_moe", "glm4_moe.json", {}},
                      Case{"glm4_moe_grouped", "glm4_moe.json", {"n_group=4", "topk_group=2", "first_k_dense_replace=0"}},
                      Case{"deepseek_router_mha", "glm4_moe.json",
                           {"n_group=2", "topk_group=1", "num_key_value_heads=4", "use_qk_norm=false",
                            "attention_bias=false", "partial_rotary_factor=1.0", "routed_scaling_factor=2.5"}},
                      Case{"deepseek_v3_mla_moe", "deepseek_v3.json", {}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(ModelBuild, RegistersExactlyTheHfTensors) {
  // The parameter store and arch's HF layout (used for counting) must agree name for name.
  for (const char* cfg : {"gpt2.json", "llama.json", "mistral.json", "qwen2.json", "qwen3.json",
                          "deepseek_v3_dense.json", "kimi_k2_dense.json"}) {
    for (std::vector<std::string> sets : {std::vector<std::string>{}, {"keel.norm=layernorm", "keel.norm_placement=sandwich"}}) {
      if (std::string(cfg) == "gpt2.json" && !sets.empty()) continue;
      // MLA: the second variant drops q compression and adds the attention biases instead.
      if (std::string(cfg).starts_with("deepseek") || std::string(cfg).starts_with("kimi"))
        if (!sets.empty()) sets = {"q_lora_rank=null", "attention_bias=true"};
      arch::ModelSpec spec = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/" + cfg, sets);
      TransformerModel model(spec);
      auto layout = arch::hf_tensor_layout(spec, false);
      ASSERT_EQ(layout.size(), model.parameters().entries().size()) << cfg;
      for (const auto& t : layout) {
        const ParamInfo* p = model.parameters().find(t.name);
        ASSERT_NE(p, nullptr) << cfg << " " << t.name;
        EXPECT_EQ(p->shape, t.shape) << t.name;
      }
    }
  }
}

TEST(ModelBuild, MlaWithoutLatentNormsDropsExactlyThoseTensors) {
  const std::string cfg = std::string(KEEL_SOURCE_DIR) + "/configs/tiny/deepseek_v3_dense.json";
  TransformerModel with(arch::load_model_spec(cfg));
  arch::ModelSpec spec = arch::load_model_spec(cfg, {"keel.mla_latent_norms=false"});
  TransformerModel without(spec);
  auto layout = arch::hf_tensor_layout(spec, false);
  ASSERT_EQ(layout.size(), without.parameters().entries().size());
  for (const auto& t : layout) ASSERT_NE(without.parameters().find(t.name), nullptr) << t.name;
  // Two gains per layer fewer: q_a_layernorm (q_lora_rank) and kv_a_layernorm (kv_lora_rank).
  EXPECT_EQ(with.parameters().entries().size() - without.parameters().entries().size(), 2 * spec.num_layers);
  EXPECT_EQ(with.parameters().size() - without.parameters().size(),
            spec.num_layers * (spec.attention.q_lora_rank + spec.attention.kv_lora_rank));
  EXPECT_EQ(without.parameters().find("model.layers.0.self_attn.kv_a_layernorm.weight"), nullptr);
  // Only MLA families have latent norms to drop.
  EXPECT_THROW(arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/llama.json",
                                     {"keel.mla_latent_norms=false"}),
               Error);
}

TEST(ModelBuild, MoeRegistersExactlyTheHfTensorsExpertByExpert) {
  for (const arch::FamilyRow& row : arch::family_table()) {
    if (row.moe == arch::MoeLayout::Dense || !row.supports.train) continue;
    const std::string cfg = std::string(row.model_type) + ".json";
    arch::ModelSpec spec = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/" + cfg);
    TransformerModel model(spec);
    size_t expected = 0;
    for (const auto& t : arch::hf_tensor_layout(spec, false)) {
      for (int64_t e = 0; e < t.copies; ++e) {
        const std::string name = t.copies > 1 ? t.name_for_expert(e) : t.name;
        const ParamInfo* p = model.parameters().find(name);
        ASSERT_NE(p, nullptr) << cfg << " " << name;
        EXPECT_EQ(p->shape, t.shape) << name;
        // The layout's optimizer routing and the store's agree: Muon on experts, AdamW on the router.
        EXPECT_EQ(p->matrix, t.optimizer == arch::OptimizerGroup::Muon) << name;
        ++expected;
      }
    }
    EXPECT_EQ(model.parameters().entries().size(), expected) << cfg;
  }
}

TEST(ModelBuild, DeepseekMlaWithMoeBuilds) {
  const std::string dir = std::string(KEEL_SOURCE_DIR) + "/configs/tiny/";
  TransformerModel m(arch::load_model_spec(dir + "deepseek_v3.json"));  // layer 1 has routed experts
  EXPECT_NE(m.parameters().find("model.layers.1.self_attn.kv_b_proj.weight"), nullptr);
  EXPECT_NE(m.parameters().find("model.layers.1.mlp.experts.7.down_proj.weight"), nullptr);
  EXPECT_NE(m.moe_layer(1), nullptr);
  EXPECT_EQ(m.moe_layer(0), nullptr);
  EXPECT_EQ(m.max_logits().size(), 2u * 4u);
}

TEST(ModelBuild, InitializationIsDeterministicAndScaled) {
  arch::ModelSpec spec = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/llama.json");
  TransformerModel a(spec), b(spec);
  a.initialize(5);
  b.initialize(5);
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  for (int64_t i = 0; i < a.parameters().size(); ++i) ASSERT_EQ(a.parameters().values()[i], b.parameters().values()[i]);
  const float* w = a.parameters().data("model.layers.0.mlp.up_proj.weight");
  const ParamInfo* p = a.parameters().find("model.layers.0.mlp.up_proj.weight");
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < p->numel; ++i) { sum += w[i]; sq += static_cast<double>(w[i]) * w[i]; }
  const double mean = sum / p->numel, stdev = std::sqrt(sq / p->numel - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(stdev, 0.02, 0.001);
  EXPECT_EQ(a.parameters().data("model.norm.weight")[0], 1.0f);
  TransformerModel c(spec);
  c.initialize(6);
  EXPECT_NE(c.parameters().data("model.layers.0.mlp.up_proj.weight")[0], w[0]);
}

}  // namespace
}  // namespace keel::nn
