// Memory, KV cache and FLOP formulas on a case small enough to compute by hand.
#include <gtest/gtest.h>

#include "keel/arch/accounting.hpp"
#include "keel/arch/describe.hpp"

namespace keel::arch {
namespace {

// Llama-style: V=10, H=4, 1 layer, 2 heads of 2, 1 kv head, FFN 6, untied.
ModelSpec hand_model() {
  return spec_from_config(nlohmann::json::parse(R"({
    "model_type": "llama", "hidden_size": 4, "intermediate_size": 6, "num_attention_heads": 2,
    "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 10, "max_position_embeddings": 16})"),
                          "hand.json");
}

TEST(Accounting, HandComputedMemory) {
  // Tensors: embed 10x4=40; q 4x4=16, k 2x4=8, v 8, o 16; norms 4+4; gate/up/down 3x24=72;
  // final norm 4; lm_head 40.  Total 212. Muon: q,k,v,o,gate,up,down = 48+72 = 120.
  Accounting a = account(hand_model(), 8);
  EXPECT_EQ(a.params.total, 212);
  EXPECT_EQ(a.params.muon, 120);
  EXPECT_EQ(a.params.adamw, 92);
  EXPECT_EQ(a.fp32.weights, 4 * 212);
  EXPECT_EQ(a.fp32.gradients, 4 * 212);
  EXPECT_EQ(a.fp32.adamw_state, 8 * 212);
  EXPECT_EQ(a.fp32.muon_state, 4 * 120 + 8 * 92);
  EXPECT_EQ(a.fp32.total_adamw(), 16 * 212);
  EXPECT_EQ(a.bf16_mixed.weights, 2 * 212);
  EXPECT_EQ(a.bf16_mixed.master_weights, 4 * 212);
  EXPECT_EQ(a.bf16_mixed.total_muon(), 2 * 212 + 4 * 212 + 4 * 212 + 4 * 120 + 8 * 92);
  // KV cache: 1 layer x (K and V) x 1 kv head x head_dim 2 x 2 bytes.
  EXPECT_EQ(a.kv_cache_bytes_per_token_bf16, 8);
}

TEST(Accounting, HandComputedFlops) {
  Accounting a = account(hand_model(), 8);
  // Matmul weights per token: q,k,v,o 48 + MLP 72 + lm_head 40 = 160.
  EXPECT_EQ(a.params.matmul_active, 160);
  EXPECT_DOUBLE_EQ(a.flops.matmul, 6.0 * 160);
  // 6 x layers 1 x seq 8 x heads 2 x (2 + 2).
  EXPECT_DOUBLE_EQ(a.flops.attention, 6.0 * 8 * 2 * 4);
  EXPECT_DOUBLE_EQ(a.flops.attention_causal, 6.0 * 4.5 * 2 * 4);
  EXPECT_DOUBLE_EQ(a.flops.training(), 960 + 384);
}

TEST(Accounting, MlaCachesLatentAndRotaryKey) {
  ModelSpec s = spec_from_config(nlohmann::json::parse(R"({
    "model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4,
    "num_hidden_layers": 3, "vocab_size": 100, "kv_lora_rank": 16, "q_lora_rank": null,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": null})"),
                                 "mla.json");
  Accounting a = account(s, 8);
  EXPECT_EQ(a.kv_cache_bytes_per_token_bf16, 3 * (16 + 4) * 2);
  EXPECT_FALSE(s.moe.enabled);
  // Attention FLOPs use qk head dim 12 and v head dim 8.
  EXPECT_DOUBLE_EQ(a.flops.attention, 6.0 * 3 * 8 * 4 * (12 + 8));
}

TEST(Accounting, TiedHeadStillCostsFlops) {
  ModelSpec s = hand_model();
  s.tie_word_embeddings = true;
  Accounting a = account(s, 8);
  EXPECT_EQ(a.params.total, 172);
  EXPECT_EQ(a.params.matmul_active, 160);
}

TEST(Describe, JsonSchema) {
  ModelSpec s = hand_model();
  nlohmann::json d = describe(s, account(s, 8));
  for (const char* key : {"file", "model_type", "family", "architecture", "params", "memory", "flops"}) {
    EXPECT_TRUE(d.contains(key)) << key;
  }
  for (const char* key : {"total", "active", "non_embedding", "mtp", "by_component", "active_by_component"}) {
    EXPECT_TRUE(d["params"].contains(key)) << key;
  }
  EXPECT_TRUE(d["params"]["total"].is_number_integer());
  EXPECT_EQ(d["params"]["total"], 212);
  EXPECT_EQ(d["params"]["non_embedding"], 212 - 80);
  const auto& arch = d["architecture"];
  EXPECT_EQ(arch["norm"]["type"], "RMSNorm");
  EXPECT_EQ(arch["norm"]["placement"], "pre");
  EXPECT_EQ(arch["ffn"]["kind"], "SwiGLU");
  EXPECT_EQ(arch["ffn"]["matrices"], 3);
  EXPECT_DOUBLE_EQ(arch["ffn"]["ratio"].get<double>(), 1.5);
  EXPECT_EQ(arch["attention"]["kind"], "MQA");  // one kv head shared by all query heads
  EXPECT_EQ(arch["attention"]["num_kv_heads"], 1);
  EXPECT_TRUE(arch["moe"].is_null());
  for (const char* key : {"weights", "gradients", "adamw_state", "muon_state", "total_adamw", "total_muon"}) {
    EXPECT_TRUE(d["memory"]["fp32"][key].is_number_integer()) << key;
    EXPECT_TRUE(d["memory"]["bf16_mixed"][key].is_number_integer()) << key;
  }
  EXPECT_TRUE(d["memory"]["bf16_mixed"]["master_weights"].is_number_integer());
  EXPECT_TRUE(d["memory"]["kv_cache_bytes_per_token_bf16"].is_number_integer());
  EXPECT_EQ(d["flops"]["seq"], 8);
  EXPECT_TRUE(d["flops"]["per_token_training"].is_number());
  EXPECT_TRUE(d["flops"]["formula"].is_string());
}

TEST(Describe, FamilyFacts) {
  // gpt2's plain GELU MLP has two matrices; qwen3 always has QK-Norm; qwen2 always QKV bias.
  auto gpt2 = spec_from_config(nlohmann::json::parse(R"({"model_type": "gpt2", "n_embd": 8, "n_head": 2,
      "n_layer": 1, "vocab_size": 10})"), "g.json");
  auto d = describe(gpt2, account(gpt2, 4));
  EXPECT_EQ(d["architecture"]["ffn"]["matrices"], 2);
  EXPECT_EQ(d["architecture"]["norm"]["type"], "LayerNorm");
  EXPECT_TRUE(d["architecture"]["tie_word_embeddings"].get<bool>());
  auto qwen2 = spec_from_config(nlohmann::json::parse(R"({"model_type": "qwen2", "hidden_size": 8,
      "intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "vocab_size": 10})"), "q.json");
  EXPECT_TRUE(qwen2.attention.qkv_bias);
  EXPECT_FALSE(qwen2.attention.o_bias);
  EXPECT_FALSE(qwen2.attention.qk_norm);
}

}  // namespace
}  // namespace keel::arch
