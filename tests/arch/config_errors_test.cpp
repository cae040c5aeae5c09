// Every class of bad config yields one keel::Error naming the file, the field and the reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "keel/arch/config_file.hpp"
#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"
#include "spec_error.hpp"

namespace keel::arch {
namespace {

nlohmann::json qwen3() {
  return nlohmann::json::parse(R"({
    "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 192, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 256,
    "rms_norm_eps": 1e-6, "hidden_act": "silu"})");
}

using testing::spec_error;

TEST(ConfigErrors, NotAnObject) {
  Error e = spec_error(nlohmann::json::array({1, 2}));
  EXPECT_EQ(e.file(), "cfg.json");
  EXPECT_NE(std::string(e.what()).find("JSON object"), std::string::npos) << e.what();
}

TEST(ConfigErrors, MissingRequiredField) {
  auto c = qwen3();
  c.erase("hidden_size");
  Error e = spec_error(c);
  EXPECT_EQ(e.field(), "hidden_size");
  EXPECT_NE(e.reason().find("missing"), std::string::npos);
}

TEST(ConfigErrors, WrongType) {
  auto c = qwen3();
  c["num_hidden_layers"] = "two";
  Error e = spec_error(c);
  EXPECT_EQ(e.field(), "num_hidden_layers");
  EXPECT_NE(e.reason().find("expected an integer"), std::string::npos) << e.reason();
  c = qwen3();
  c["rms_norm_eps"] = "tiny";
  EXPECT_EQ(spec_error(c).field(), "rms_norm_eps");
  c = qwen3();
  c["tie_word_embeddings"] = 1;
  EXPECT_EQ(spec_error(c).field(), "tie_word_embeddings");
  c = qwen3();
  c["num_attention_heads"] = 4.5;
  EXPECT_EQ(spec_error(c).field(), "num_attention_heads");
}

TEST(ConfigErrors, ZeroOrNegativeSizes) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                            "vocab_size", "head_dim", "num_key_value_heads"}) {
    for (int value : {0, -3}) {
      auto c = qwen3();
      c[field] = value;
      Error e = spec_error(c);
      EXPECT_EQ(e.field(), field);
      EXPECT_NE(e.reason().find("must be positive"), std::string::npos) << e.reason();
    }
  }
  auto c = qwen3();
  c["rms_norm_eps"] = 0.0;
  EXPECT_EQ(spec_error(c).field(), "rms_norm_eps");
}

TEST(ConfigErrors, HiddenNotDivisibleByHeadsWithoutHeadDim) {
  auto c = qwen3();
  c["model_type"] = "llama";
  c.erase("head_dim");
  c["hidden_size"] = 66;
  Error e = spec_error(c);
  EXPECT_EQ(e.field(), "num_attention_heads");
  EXPECT_NE(e.reason().find("not divisible"), std::string::npos);
  // With head_dim given, the same hidden size is fine.
  c["head_dim"] = 16;
  EXPECT_NO_THROW(spec_from_config(c, "cfg.json"));
}

TEST(ConfigErrors, HeadsNotDivisibleByKvHeads) {
  auto c = qwen3();
  c["num_key_value_heads"] = 3;
  Error e = spec_error(c);
  EXPECT_EQ(e.field(), "num_key_value_heads");
  EXPECT_NE(e.reason().find("not divisible"), std::string::npos);
}

nlohmann::json gemma2() {
  return nlohmann::json::parse(R"({
    "model_type": "gemma2", "hidden_size": 64, "intermediate_size": 192, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 512, "sliding_window": 32})");
}

TEST(ConfigErrors, GemmaLayerTypesAndWindowAreChecked) {
  auto c = gemma2();
  c["layer_types"] = {"sliding_attention", "chunked_attention"};
  Error e = spec_error(c);
  EXPECT_EQ(e.field(), "layer_types");
  EXPECT_NE(std::string(e.what()).find("entry 1 is 'chunked_attention'"), std::string::npos) << e.what();
  c["layer_types"] = {"sliding_attention"};
  EXPECT_EQ(spec_error(c).field(), "layer_types");  // one entry for two layers
  c["layer_types"] = "sliding_attention";
  EXPECT_EQ(spec_error(c).field(), "layer_types");
  c = gemma2();
  c["sliding_window"] = 1024;  // the context is 512
  e = spec_error(c);
  EXPECT_EQ(e.file(), "cfg.json");
  EXPECT_EQ(e.field(), "sliding_window");
  c["sliding_window"] = 0;
  EXPECT_EQ(spec_error(c).field(), "sliding_window");
  c = gemma2();
  c["attn_logit_softcapping"] = -1;
  EXPECT_EQ(spec_error(c).field(), "attn_logit_softcapping");
  c = gemma2();
  c["query_pre_attn_scalar"] = 0;
  EXPECT_EQ(spec_error(c).field(), "query_pre_attn_scalar");
  c = gemma2();
  c["hidden_activation"] = "swiglu";
  EXPECT_EQ(spec_error(c).field(), "hidden_activation");
}

TEST(ConfigErrors, GemmaKeepsItsOnePlusWRmsNorm) {
  auto c = gemma2();
  c["keel"] = {{"norm", "layernorm"}};
  EXPECT_EQ(spec_error(c).field(), "keel.norm");
}

TEST(ConfigErrors, GemmaDefaultsAndNullsFollowGemma2Config) {
  ModelSpec s = spec_from_config(gemma2(), "cfg.json");
  EXPECT_TRUE(s.norm_unit_offset);
  EXPECT_EQ(s.placement, NormPlacement::Sandwich);
  EXPECT_DOUBLE_EQ(s.attention.softcap, 50.0);
  EXPECT_DOUBLE_EQ(s.final_softcap, 30.0);
  EXPECT_DOUBLE_EQ(s.attention.query_pre_attn_scalar, 256.0);
  EXPECT_DOUBLE_EQ(s.embed_scale, 8.0);
  EXPECT_TRUE(s.tie_word_embeddings);
  EXPECT_EQ(s.mlp.activation, Activation::GeluTanh);
  EXPECT_TRUE(s.is_sliding_layer(0));
  EXPECT_FALSE(s.is_sliding_layer(1));
  auto c = gemma2();
  c["attn_logit_softcapping"] = nullptr;
  c["final_logit_softcapping"] = nullptr;
  c["sliding_window"] = nullptr;
  c["keel"] = {{"z_loss", 1e-4}};  // a keel object keeps the family's own settings
  s = spec_from_config(c, "cfg.json");
  EXPECT_EQ(s.attention.softcap, 0.0);
  EXPECT_EQ(s.final_softcap, 0.0);
  EXPECT_FALSE(s.is_sliding_layer(0));
  c = gemma2();
  c["keel"] = {{"z_loss", 1e-4}};
  EXPECT_DOUBLE_EQ(spec_from_config(c, "cfg.json").attention.softcap, 50.0);
}

TEST(ConfigErrors, Gemma3ReadsItsTextConfigWithGemma3TextConfigDefaults) {
  auto mm = nlohmann::json::parse(R"({"model_type": "gemma3", "vision_config": {"hidden_size": 8}})");
  Error e = spec_error(mm);
  EXPECT_EQ(e.file(), "cfg.json");
  EXPECT_EQ(e.field(), "text_config");
  mm["text_config"] = "gemma3_text";
  EXPECT_EQ(spec_error(mm).field(), "text_config");
  mm["text_config"] = {{"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 7}, {"sliding_window", 16}};
  ModelSpec s = spec_from_config(mm, "cfg.json");
  EXPECT_EQ(s.family, Family::Gemma3Text);
  EXPECT_EQ(s.wrapper_model_type, "gemma3");
  EXPECT_EQ(s.vocab_size, 262208);  // Gemma3TextConfig defaults
  EXPECT_EQ(s.attention.num_heads, 8);
  EXPECT_EQ(s.attention.num_kv_heads, 4);
  EXPECT_EQ(s.attention.head_dim, 256);
  EXPECT_DOUBLE_EQ(s.attention.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(s.attention.rope.local_theta, 1e4);
  EXPECT_TRUE(s.attention.qk_norm);
  EXPECT_EQ(s.attention.softcap, 0.0);
  EXPECT_EQ(s.final_softcap, 0.0);
  for (int64_t l = 0; l < 7; ++l) EXPECT_EQ(s.is_sliding_layer(l), l != 5) << l;  // 5 local : 1 global
  // Errors inside text_config name it.
  mm["text_config"]["layer_types"] = {"full_attention"};
  e = spec_error(mm);
  EXPECT_EQ(e.field(), "text_config.layer_types");
}

// transformers 5 saves RoPE as rope_parameters (one object, or one per layer type); it reads as
// the 4.x top-level fields would, and the two spellings disagreeing is one error.
TEST(ConfigErrors, RopeParametersOfTransformers5ReadLikeTheTopLevelFields) {
  auto v4 = qwen3();
  v4["rope_theta"] = 1e6;
  v4["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  auto v5 = qwen3();
  v5["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 1e6}};
  const ModelSpec a = spec_from_config(v4, "v4.json"), b = spec_from_config(v5, "v5.json");
  EXPECT_EQ(b.attention.rope.theta, 1e6);
  EXPECT_EQ(b.attention.rope.scaling, a.attention.rope.scaling);
  // The default type carries only the base.
  auto plain = qwen3();
  plain["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  const ModelSpec p = spec_from_config(plain, "plain.json");
  EXPECT_EQ(p.attention.rope.theta, 5e5);
  EXPECT_TRUE(p.attention.rope.scaling.is_null());
  // GLM's partial rotary factor sits inside too.
  auto glm = qwen3();
  glm["model_type"] = "glm4_moe";
  glm["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}};
  EXPECT_EQ(spec_from_config(glm, "glm.json").attention.rope.rotary_dim, 4);
  // Gemma 3: one object per layer type; the sliding layers' base is rope_local_base_freq.
  nlohmann::json g3 = nlohmann::json::parse(R"({
    "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 6, "vocab_size": 256,
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})");
  const ModelSpec g = spec_from_config(g3, "g3.json");
  EXPECT_EQ(g.attention.rope.theta, 1e6);
  EXPECT_EQ(g.attention.rope.local_theta, 1e4);
  EXPECT_EQ(g.attention.rope.scaling["factor"], 8.0);
  // Two spellings that disagree.
  auto both = v5;
  both["rope_theta"] = 1e4;
  Error e = spec_error(both);
  EXPECT_EQ(e.field(), "rope_parameters.rope_theta");
  auto both_scalings = v5;
  both_scalings["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(spec_error(both_scalings).field(), "rope_parameters");
  both_scalings["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};  // the same: fine
  EXPECT_NO_THROW(spec_from_config(both_scalings, "same.json"));
  auto legacy = qwen3();
  legacy["rope_parameters"] = {{"type", "linear"}, {"factor", 4.0}, {"rope_theta", 1e6}};
  EXPECT_EQ(spec_from_config(legacy, "legacy.json").attention.rope.scaling["factor"], 4.0);
  auto local = qwen3();  // a sliding-layer base only Gemma 3 has
  local["rope_parameters"] = {{"full_attention", {{"rope_theta", 1e6}}}, {"sliding_attention", {{"rope_theta", 1e4}}}};
  EXPECT_EQ(spec_error(local).field(), "rope_parameters.sliding_attention.rope_theta");
  auto bad = qwen3();
  bad["rope_parameters"] = "yarn";
  EXPECT_EQ(spec_error(bad).field(), "rope_parameters");
}

// GPT-2's attention switches keel does not implement are refused rather than ignored.
TEST(ConfigErrors, Gpt2AttentionSwitchesKeelLacksAreRefused) {
  const nlohmann::json gpt2 = {{"model_type", "gpt2"}, {"n_embd", 64}, {"n_layer", 2}, {"n_head", 4}, {"vocab_size", 256}};
  for (const char* field : {"scale_attn_by_inverse_layer_idx", "add_cross_attention"}) {
    auto c = gpt2;
    c[field] = true;
    EXPECT_EQ(spec_error(c).field(), field);
    c[field] = false;
    EXPECT_NO_THROW(spec_from_config(c, "ok.json"));
  }
  auto c = gpt2;
  c["scale_attn_weights"] = false;
  EXPECT_EQ(spec_error(c).field(), "scale_attn_weights");
}

TEST(ConfigErrors, UnknownModelTypeListsSupported) {
  auto c = qwen3();
  c["model_type"] = "bert";
  Error e = spec_error(c);
  EXPECT_EQ(e.field(), "model_type");
  for (const FamilyRow& row : family_table()) {
    EXPECT_NE(e.reason().find(row.model_type), std::string::npos) << row.model_type;
  }
  c.erase("model_type");
  EXPECT_EQ(spec_error(c).field(), "model_type");
}

TEST(ConfigErrors, UnknownActivation) {
  auto c = qwen3();
  c["hidden_act"] = "swishglu";
  Error e = spec_error(c);
  EXPECT_EQ(e.field(), "hidden_act");
  EXPECT_NE(e.reason().find("swishglu"), std::string::npos);
  EXPECT_NE(e.reason().find("silu"), std::string::npos);
}

TEST(ConfigErrors, KeelExtensionIsChecked) {
  auto c = qwen3();
  c["keel"] = {{"norm", "batchnorm"}};
  EXPECT_EQ(spec_error(c).field(), "keel.norm");
  c["keel"] = {{"normplacement", "post"}};
  EXPECT_EQ(spec_error(c).field(), "keel.normplacement");
  c["keel"] = {{"z_loss", -1}};
  EXPECT_EQ(spec_error(c).field(), "keel.z_loss");
  c["keel"] = {{"norm", "layernorm"}, {"norm_placement", "sandwich"}, {"qkv_bias", true}, {"z_loss", 1e-4}};
  ModelSpec s = spec_from_config(c, "cfg.json");
  EXPECT_EQ(s.norm, NormKind::LayerNorm);
  EXPECT_EQ(s.placement, NormPlacement::Sandwich);
  EXPECT_TRUE(s.attention.qkv_bias);
  EXPECT_DOUBLE_EQ(s.z_loss, 1e-4);
  // keel.mlp: plain for the decoder families, never gated for gpt2 or plain for MoE.
  c["keel"] = {{"mlp", "plain"}};
  EXPECT_EQ(spec_from_config(c, "cfg.json").mlp.kind, FfnKind::Plain);
  c["keel"] = {{"mlp", "swiglu"}};
  EXPECT_EQ(spec_error(c).field(), "keel.mlp");
  auto moe = nlohmann::json::parse(R"({"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 64,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
      "num_local_experts": 4, "num_experts_per_tok": 2, "keel": {"mlp": "plain"}})");
  EXPECT_EQ(spec_error(moe).field(), "keel.mlp");
  auto gpt2 = nlohmann::json::parse(R"({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
      "vocab_size": 256, "keel": {"mlp": "gated"}})");
  EXPECT_EQ(spec_error(gpt2).field(), "keel.mlp");
  // keel.embed_scale: a positive number or "sqrt_hidden" (qwen3() has hidden_size 64).
  c["keel"] = {{"embed_scale", "sqrt_hidden"}};
  EXPECT_DOUBLE_EQ(spec_from_config(c, "cfg.json").embed_scale, 8.0);
  c["keel"] = {{"embed_scale", 2.5}};
  EXPECT_DOUBLE_EQ(spec_from_config(c, "cfg.json").embed_scale, 2.5);
  for (const nlohmann::json& bad : {nlohmann::json("sqrt_d"), nlohmann::json(0), nlohmann::json(-1), nlohmann::json(true)}) {
    c["keel"] = {{"embed_scale", bad}};
    const Error e = spec_error(c);
    EXPECT_EQ(e.field(), "keel.embed_scale") << bad.dump();
    EXPECT_EQ(e.file(), "cfg.json") << bad.dump();
  }
}

TEST(ConfigErrors, MoeShapesAreChecked) {
  auto c = nlohmann::json::parse(R"({"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 64,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
      "num_local_experts": 4, "num_experts_per_tok": 5})");
  EXPECT_EQ(spec_error(c).field(), "num_experts_per_tok");
  c = nlohmann::json::parse(R"({"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 64,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256, "kv_lora_rank": 16,
      "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 6,
      "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_group": 4, "topk_group": 2})");
  EXPECT_EQ(spec_error(c).field(), "n_group");
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("keel_cfg_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  std::filesystem::path dir_;
};

TEST_F(TempDir, FileErrorsNameThePath) {
  try {
    read_config_file((dir_ / "missing.json").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.json"), std::string::npos);
    EXPECT_NE(e.reason().find("no such file"), std::string::npos);
  }
  try {
    read_config_file(dir_.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.reason().find("no config.json"), std::string::npos);
  }
  auto bad = write("bad.json", "{\"model_type\": \"qwen3\",");
  try {
    read_config_file(bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), bad);
    EXPECT_NE(e.reason().find("not valid JSON"), std::string::npos);
    EXPECT_EQ(e.reason().find("json.exception"), std::string::npos) << "library tag leaked: " << e.reason();
  }
}

TEST_F(TempDir, FolderWithConfigIsRead) {
  write("config.json", qwen3().dump());
  ModelSpec s = load_model_spec(dir_.string());
  EXPECT_EQ(s.family, Family::Qwen3);
  EXPECT_EQ(s.source, (dir_ / "config.json").string());
}

TEST(ConfigOverrides, SetReplacesAndNests) {
  auto c = qwen3();
  apply_overrides(c, {"num_hidden_layers=7", "keel.norm=layernorm", "hidden_act=gelu", "rope_scaling=null"}, "cfg.json");
  EXPECT_EQ(c["num_hidden_layers"], 7);
  EXPECT_EQ(c["keel"]["norm"], "layernorm");
  EXPECT_EQ(c["hidden_act"], "gelu");
  EXPECT_TRUE(c["rope_scaling"].is_null());
  EXPECT_THROW(apply_overrides(c, {"no_equals_sign"}, "cfg.json"), Error);
  EXPECT_THROW(apply_overrides(c, {"hidden_act.x=1"}, "cfg.json"), Error);
}

}  // namespace
}  // namespace keel::arch
