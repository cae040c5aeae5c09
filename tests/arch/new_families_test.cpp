// gpt_oss, deepseek_v2 and qwen3_next (issue 15): what their configs mean, what they refuse, and
// Qwen3-Next's layer schedule, MTP layer and training refusal.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "keel/arch/accounting.hpp"
#include "keel/arch/config_file.hpp"
#include "keel/arch/hf_tensors.hpp"
#include "keel/core/error.hpp"
#include "spec_error.hpp"
#include "keel/nn/model.hpp"

namespace keel::arch {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(std::string(KEEL_SOURCE_DIR) + "/" + path);
  return nlohmann::json::parse(in);
}

using testing::spec_error;

TEST(GptOssConfig, ReadsTheReleasedConfig) {
  const ModelSpec s = spec_from_config(read_json("configs/hf/gpt-oss-20b.json"), "gpt-oss-20b.json");
  EXPECT_TRUE(s.attention.sinks);
  EXPECT_TRUE(s.attention.qkv_bias && s.attention.o_bias);
  EXPECT_EQ(s.attention.sliding_window, 128);
  for (int64_t l = 0; l < s.num_layers; ++l) EXPECT_EQ(s.is_sliding_layer(l), l % 2 == 0) << l;
  EXPECT_TRUE(s.moe.gpt_oss_experts);
  EXPECT_EQ(s.moe.num_experts, 32);
  EXPECT_EQ(s.moe.experts_per_token, 4);
  EXPECT_EQ(s.moe.swiglu_limit, 7.0);
  EXPECT_EQ(s.moe.swiglu_alpha, 1.702);
  EXPECT_EQ(s.attention.rope.scaling["truncate"], false);
}

TEST(GptOssConfig, LayerTypesOfTheWrongLengthOrKindAreRefused) {
  auto c = read_json("configs/tiny/gpt_oss.json");
  c["layer_types"] = {"sliding_attention"};
  Error e = spec_error(c);
  EXPECT_EQ(e.field(), "layer_types");
  EXPECT_NE(e.reason().find("has 1 entries but num_hidden_layers is 2"), std::string::npos) << e.reason();
  c["layer_types"] = {"sliding_attention", "chunked_attention"};
  EXPECT_EQ(spec_error(c).field(), "layer_types");
  c = read_json("configs/tiny/gpt_oss.json");
  c.erase("num_local_experts");
  EXPECT_EQ(spec_error(c).field(), "num_local_experts");
}

TEST(DeepseekV2Config, ReadsTopkMethodsAndRefusesWhatItCannotCompute) {
  auto c = read_json("configs/tiny/deepseek_v2.json");
  ModelSpec s = spec_from_config(c, "v2.json");
  EXPECT_EQ(s.moe.router, RouterKind::SoftmaxGrouped);
  EXPECT_EQ(s.moe.n_group, 2);
  EXPECT_EQ(s.moe.topk_group, 1);
  EXPECT_FALSE(s.moe.score_correction_bias);
  EXPECT_TRUE(s.attention.rope.interleave);
  c["topk_method"] = "greedy";
  s = spec_from_config(c, "v2.json");
  EXPECT_EQ(s.moe.n_group, 1) << "greedy ignores the groups";
  c["topk_method"] = "noaux_tc";
  Error e = spec_error(c);
  EXPECT_EQ(e.field(), "topk_method");
  EXPECT_NE(e.reason().find("greedy, group_limited_greedy"), std::string::npos) << e.reason();
  c = read_json("configs/tiny/deepseek_v2.json");
  c["scoring_func"] = "sigmoid";
  EXPECT_EQ(spec_error(c).field(), "scoring_func");
  c = read_json("configs/tiny/deepseek_v2.json");
  c["norm_topk_prob"] = true;
  EXPECT_EQ(spec_error(c).field(), "norm_topk_prob");
  c = read_json("configs/tiny/deepseek_v2.json");
  c["n_group"] = 3;  // 8 experts in 3 groups
  EXPECT_EQ(spec_error(c).field(), "n_group");
  c = read_json("configs/tiny/deepseek_v2.json");
  c["moe_layer_freq"] = 2;  // DeepSeek's rule: MoE on layers >= first_k_dense_replace with l % freq == 0
  s = spec_from_config(c, "v2.json");
  EXPECT_FALSE(s.is_moe_layer(0));
  EXPECT_FALSE(s.is_moe_layer(1));
}

TEST(Qwen3NextConfig, FullAttentionEveryFourthLayerAndGatedDeltaNetElsewhere) {
  const ModelSpec s = spec_from_config(read_json("configs/hf/qwen3-next-80b-a3b-instruct.json"), "q3n.json");
  int64_t linear = 0;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    EXPECT_EQ(s.is_linear_attention_layer(l), (l + 1) % 4 != 0) << l;
    linear += s.is_linear_attention_layer(l);
  }
  EXPECT_EQ(linear, 36);
  EXPECT_TRUE(s.attention.output_gate);
  EXPECT_TRUE(s.attention.qk_norm);
  EXPECT_TRUE(s.norm_unit_offset);
  EXPECT_EQ(s.attention.rope.rotary_dim, 64);
  EXPECT_EQ(s.moe.num_shared_experts, 1);
  EXPECT_TRUE(s.moe.shared_expert_gate);
  EXPECT_EQ(s.mtp_layers, 1);
  // Per layer (from the checkpoint's tensor listing): a full-attention mixer of 27,263,488 and
  // a Gated DeltaNet mixer of 33,718,464 parameters.
  const Accounting acc = account(s, 4096);
  EXPECT_EQ(acc.params.by_component.at(Component::Attention), 12 * int64_t{27'263'488});
  EXPECT_EQ(acc.params.by_component.at(Component::LinearAttention), 36 * int64_t{33'718'464});
  EXPECT_EQ(acc.params.mtp, 1'650'471'424);
  // Only the 12 full-attention layers cache keys and values: 2·2 kv heads·256·2 bytes each.
  EXPECT_EQ(acc.kv_cache_bytes_per_token_bf16, 12 * 2 * 2 * 256 * 2);
}

TEST(Qwen3NextConfig, LayerTypesAreCheckedAndOverrideTheInterval) {
  auto c = read_json("configs/tiny/qwen3_next.json");
  c["layer_types"] = {"full_attention", "linear_attention", "linear_attention", "linear_attention"};
  ModelSpec s = spec_from_config(c, "q3n.json");
  EXPECT_FALSE(s.is_linear_attention_layer(0));
  EXPECT_TRUE(s.is_linear_attention_layer(3));
  c["layer_types"] = {"full_attention", "linear_attention"};
  EXPECT_EQ(spec_error(c).field(), "layer_types");
  c["layer_types"] = {"full_attention", "linear_attention", "sliding_attention", "full_attention"};
  Error e = spec_error(c);
  EXPECT_EQ(e.field(), "layer_types");
  EXPECT_NE(e.reason().find("linear_attention, full_attention"), std::string::npos) << e.reason();
  c = read_json("configs/tiny/qwen3_next.json");
  c["linear_num_value_heads"] = 3;
  EXPECT_EQ(spec_error(c).field(), "linear_num_value_heads");
}

TEST(Qwen3NextConfig, MtpLayerIsSpelledAsTheCheckpointStoresIt) {
  const ModelSpec s = spec_from_config(read_json("configs/hf/qwen3-next-80b-a3b-instruct.json"), "q3n.json");
  std::set<std::string> mtp;
  for (const TensorEntry& t : hf_tensor_layout(s, /*include_mtp=*/true)) {
    if (t.component == Component::Mtp) mtp.insert(t.name);
  }
  for (const char* name : {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                           "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.self_attn.q_proj.weight",
                           "mtp.layers.0.mlp.experts.{E}.gate_proj.weight", "mtp.layers.0.mlp.shared_expert_gate.weight",
                           "mtp.norm.weight"}) {
    EXPECT_TRUE(mtp.contains(name)) << name;
  }
  for (const std::string& name : mtp) EXPECT_EQ(name.rfind("mtp.", 0), 0u) << name;
}

TEST(Qwen3NextConfig, TrainingIsRefusedNamingTheLinearAttentionLayers) {
  const ModelSpec s = load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/qwen3_next.json");
  try {
    nn::TransformerModel model(s);
    ADD_FAILURE() << "qwen3_next must not build";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "model_type");
    EXPECT_NE(e.reason().find("3 Gated DeltaNet (linear_attention) layers (0, 1, 2)"), std::string::npos) << e.reason();
    EXPECT_NE(e.reason().find("keel.attn_output_gate"), std::string::npos) << e.reason();
  }
}

}  // namespace
}  // namespace keel::arch
