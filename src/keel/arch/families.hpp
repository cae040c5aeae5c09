#pragma once
// The family table: one row per HF model_type. A row states what the HF modeling code fixes for
// that family (field spellings, defaults, which biases exist, QK-Norm, MLA, router kind), so that
// spec_from_config is the same code for every family.
#include <optional>
#include <span>
#include <string_view>

#include "keel/arch/model_spec.hpp"

namespace keel::arch {

// Where attention biases come from.
enum class AttentionBiasRule {
  Gpt2,            // c_attn and c_proj always carry biases
  None,            // no biases (mistral, mixtral)
  QkvAlways,       // q/k/v biases always, o_proj none (qwen2)
  QkvoFromConfig,  // `attention_bias` switches q/k/v/o (llama, qwen3, qwen3_moe)
  QkvFromConfig,   // `attention_bias` switches q/k/v, o_proj none (glm4_moe)
  MlaFromConfig,   // `attention_bias` switches q_a_proj, kv_a_proj_with_mqa, o_proj (deepseek_v3)
};

enum class MoeLayout {
  Dense,        // no experts
  Mixtral,      // every layer: block_sparse_moe with experts.{e}.w1/w2/w3
  Qwen3Moe,     // mlp.experts.{e}.*, decoder_sparse_step, mlp_only_layers
  DeepseekV3,   // mlp.experts.{e}.*, shared_experts, first_k_dense_replace, gate bias
};

struct FamilyRow {
  Family family;
  std::string_view model_type;
  std::string_view hf_architecture;   // CausalLM class name, for messages and docs
  bool gpt2_fields;                   // n_embd/n_layer/n_head spellings, LayerNorm, Conv1D
  bool mla;
  bool qk_norm_always;
  std::string_view qk_norm_field;     // config flag that turns QK-Norm on, or empty
  AttentionBiasRule attention_bias;
  bool mlp_bias_field;                // llama's `mlp_bias`
  MoeLayout moe;
  RouterKind router;
  bool default_tie_embeddings;
  double default_norm_eps;
  double default_rope_theta;
  double default_partial_rotary;
  int64_t default_head_dim;           // 0: hidden_size / num_attention_heads
};

std::span<const FamilyRow> family_table();
const FamilyRow* find_family(std::string_view model_type);
const FamilyRow& family_row(Family family);

}  // namespace keel::arch
