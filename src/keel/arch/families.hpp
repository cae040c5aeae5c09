#pragma once
// The family table: one row per HF model_type. A row states what the HF modeling code fixes for
// that family (field spellings, defaults, which biases exist, QK-Norm, MLA, router kind), how its
// checkpoint spells every tensor (tensor_names.hpp) and what keel can do with it, so that
// spec_from_config, the modules, the layout, QK-Clip and export are the same code for every
// family. Adding a family: docs/adding_a_family.md.
#include <array>
#include <optional>
#include <span>
#include <string_view>

#include "keel/arch/model_spec.hpp"
#include "keel/arch/tensor_names.hpp"

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
  Qwen3Next,    // as Qwen3Moe, plus one shared_expert with a sigmoid shared_expert_gate
  GptOss,       // every layer: mlp.router (with bias), fused mlp.experts.gate_up_proj / down_proj
  DeepseekV3,   // mlp.experts.{e}.*, shared_experts, first_k_dense_replace, gate bias
};

// How attention and MLP weights are stored.
enum class ProjectionLayout {
  Linear,      // separate q/k/v/o and gate/up/down, nn.Linear [out, in]
  Gpt2Conv1D,  // GPT-2: fused c_attn [in, 3·hidden], every projection a Conv1D [in, out]
};

// What keel can do with a family; each place that acts on one asks here.
struct FamilyCapabilities {
  bool train;       // TransformerModel builds it (forward, backward, keel train)
  bool generate;    // the incremental (KV-cache) forward: keel generate
  bool export_hf;   // keel export writes an HF folder transformers loads
  bool qk_clip;     // QK-Clip can rescale its query/key projections per head
  bool muon;        // Muon may orthogonalize its hidden matrices (is_hidden_matrix_kind)
};

// Defaults of the sigmoid-grouped router fields, which differ between families sharing the
// DeepseekV3 layout (DeepseekV3Config vs Glm4MoeConfig).
struct RouterDefaults {
  double routed_scaling_factor;
  int64_t n_group;
  int64_t topk_group;
  int64_t first_k_dense_replace;
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
  RouterDefaults router_defaults;
  const TensorNameTable* names;       // how the checkpoint spells every tensor
  ProjectionLayout projections;
  std::string_view optional_prefix;   // checkpoints also exist without it ("transformer." for GPT-2)
  // Name endings of non-parameter tensors real checkpoints hold (GPT-2's causal-mask buffers).
  std::array<std::string_view, 2> ignored_buffers;
  FamilyCapabilities supports;
  // Fixed by the family's modeling code (after `supports`, so rows that keep the defaults say
  // nothing): where its norms sit, and QK-Norm over the whole projection instead of per head.
  NormPlacement placement = NormPlacement::Pre;
  bool qk_norm_full_width = false;
  // Gemma 2: the field its MLP reads the activation from, and the other Gemma fixtures: (1 + w)
  // norms, embeddings times √hidden, query_pre_attn_scalar, soft-caps and alternating sliding
  // windows read from their own config fields (model_spec.cpp, spec_from_gemma_fields).
  bool gemma_fields = false;
  // gpt-oss: attention_bias defaults to true (GptOssConfig) and every layer has sinks.
  bool default_attention_bias = false;
  bool attention_sinks = false;
};

std::span<const FamilyRow> family_table();
const FamilyRow* find_family(std::string_view model_type);
const FamilyRow& family_row(Family family);
inline const FamilyRow& family_row(const ModelSpec& spec) { return family_row(spec.family); }

// The HF name of a role in this spec's family.
inline std::string tensor_name(const ModelSpec& spec, const TensorRole& role) {
  return tensor_name(*family_row(spec).names, role);
}

}  // namespace keel::arch
