#pragma once
// The typed model description: everything keel needs to know about an architecture, built
// from a Hugging Face config.json. One row of the family table (families.cpp) per model_type
// decides the defaults and the HF names; errors name the config file and the field.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::arch {

enum class Family { Gpt2, Llama, Mistral, Qwen2, Qwen3, Qwen3Moe, Qwen3Next, Mixtral, GptOss, DeepseekV2, DeepseekV3, KimiK2, Glm4Moe, Olmo2, Gemma2, Gemma3Text };
enum class NormKind { RmsNorm, LayerNorm };
// pre: x + f(N(x)), final norm.  post: N(x + f(x)), no final norm.
// sandwich (Gemma 2): x + N_out(f(N_in(x))), final norm.
// post_sublayer (OLMo 2, arXiv:2501.00656 §3.2.1): x + N(f(x)), final norm; the residual stream
// itself is never normalized, only what each sublayer adds to it.
enum class NormPlacement { Pre, Post, Sandwich, PostSublayer };
// Elementwise activation. GeluTanh is HF's gelu_new / gelu_pytorch_tanh.
enum class Activation { Silu, Gelu, GeluTanh, Relu };
// Gated: down(act(gate(x)) * up(x)), three matrices. Plain: down(act(up(x))), two matrices.
enum class FfnKind { Gated, Plain };
enum class AttentionKind { Mha, Gqa, Mqa, Mla };
// SoftmaxTopK: Mixtral / Qwen3-MoE. SigmoidGrouped: DeepSeek-V3 / Kimi K2 / GLM-4.5
// (sigmoid scores, correction bias for selection, group-limited top-k). SoftmaxGrouped:
// DeepSeek-V2 (softmax scores, topk_method greedy or group_limited_greedy, groups ranked by
// their best expert, weights times routed_scaling_factor).
enum class RouterKind { SoftmaxTopK, SigmoidGrouped, SoftmaxGrouped };

std::string_view to_string(Family f);
std::string_view to_string(NormKind k);
std::string_view to_string(NormPlacement p);
std::string_view to_string(Activation a);
std::string_view to_string(FfnKind k);
std::string_view to_string(AttentionKind k);
std::string_view to_string(RouterKind k);
// Name of the FFN a practitioner uses: SwiGLU, GeGLU, ReGLU, GELU MLP, ...
std::string ffn_display_name(FfnKind kind, Activation act);

struct RopeSpec {
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  int64_t rotary_dim = 0;        // dims of each head that rotate (even), rest pass through
  bool interleave = false;       // DeepSeek's rope_interleave (adjacent pairs)
  nlohmann::json scaling;        // rope_scaling object as given, or null
  // Gemma 3's rope_local_base_freq: the base of the sliding-window layers, which rotate without
  // rope_scaling (Gemma3TextModel.rotary_emb_local); 0 = every layer uses `theta` and `scaling`.
  double local_theta = 0.0;
};

struct AttentionSpec {
  AttentionKind kind = AttentionKind::Mha;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;          // q/k/v head dim for MHA/GQA/MQA; qk head dim for MLA
  bool qkv_bias = false;
  bool o_bias = false;
  bool qk_norm = false;          // RMSNorm of queries and keys before RoPE
  // false: over each head's head_dim, one gain shared by the heads (Qwen3, GLM-4.5);
  // true: over the whole projection, heads·head_dim wide, one gain per element (OLMo 2).
  bool qk_norm_full_width = false;
  RopeSpec rope;
  bool learned_positions = false;  // GPT-2's wpe table instead of RoPE
  // MLA (DeepSeek-V3); q_lora_rank 0 means a plain q_proj.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // keel.mla_latent_norms = false drops q_a_layernorm and kv_a_layernorm (an ablation: DeepSeek-V2
  // §2.1.2 adds them after the compressed latents; the MLA study asks whether they are needed).
  bool mla_latent_norms = true;
  double softcap = 0.0;          // keel.attn_softcap or Gemma 2's attn_logit_softcapping; 0 = off
  // Gemma's query_pre_attn_scalar: logits are scaled by its -1/2 power instead of head_dim's; 0 = unset.
  double query_pre_attn_scalar = 0.0;
  // Sliding-window (local) attention on the layers ModelSpec::sliding_layer marks: a query sees
  // the `sliding_window` most recent positions, its own included. 0 = every layer global.
  int64_t sliding_window = 0;
  // gpt-oss's attention sinks: a learned logit per head in every softmax's denominator
  // (kernels/attention_sink.hpp); keel.attn_sinks on other families.
  bool sinks = false;
  // Qwen3-Next's gated attention: q_proj is twice as wide, each head's second half a gate, and
  // the attention output is multiplied by σ(gate) before o_proj (nn/output_gate.hpp);
  // keel.attn_output_gate on other families.
  bool output_gate = false;
  double softmax_scale() const {
    return query_pre_attn_scalar > 0 ? 1.0 / std::sqrt(query_pre_attn_scalar)
                                     : 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  }
  int64_t qk_head_dim() const { return kind == AttentionKind::Mla ? qk_nope_head_dim + qk_rope_head_dim : head_dim; }
  int64_t value_head_dim() const { return kind == AttentionKind::Mla ? v_head_dim : head_dim; }
};

struct MlpSpec {
  FfnKind kind = FfnKind::Gated;
  Activation activation = Activation::Silu;
  std::string hidden_act;        // the config's spelling
  int64_t intermediate_size = 0;
  bool bias = false;
};

struct MoeSpec {
  bool enabled = false;
  RouterKind router = RouterKind::SoftmaxTopK;
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t num_shared_experts = 0;
  int64_t expert_intermediate_size = 0;
  int64_t shared_intermediate_size = 0;  // total width of the shared expert MLP
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool score_correction_bias = false;    // gate.e_score_correction_bias stored
  int64_t first_k_dense = 0;             // first_k_dense_replace
  std::vector<bool> moe_layer;           // per decoder layer: routed experts or dense MLP
  // gpt-oss's experts (HF GptOssExperts): gate_up_proj fused over all experts and stored
  // [E, hidden, 2·width] with gate and up interleaved, down_proj [E, width, hidden], a bias on
  // each, and the clamped SwiGLU (up + 1)·g·σ(α·g) with g = min(gate, limit), up clamped to
  // ±limit (kernels/clamped_swiglu.hpp); the router is a linear layer with a bias.
  bool gpt_oss_experts = false;
  // Qwen3-Next: the shared expert's output is scaled by σ(shared_expert_gate(x)), a [1, hidden] row.
  bool shared_expert_gate = false;
  double swiglu_limit = 7.0;
  double swiglu_alpha = 1.702;
};

// Qwen3-Next's Gated DeltaNet layers (HF Qwen3NextGatedDeltaNet; Yang et al. 2024, "Gated Delta
// Networks", arXiv:2412.06464): a linear-attention recurrence in place of softmax attention on
// the layers ModelSpec::linear_attention_layer marks. keel counts them; it does not train them.
struct LinearAttentionSpec {
  int64_t num_key_heads = 0;
  int64_t num_value_heads = 0;
  int64_t key_head_dim = 0;
  int64_t value_head_dim = 0;
  int64_t conv_kernel = 0;
  int64_t key_dim() const { return num_key_heads * key_head_dim; }
  int64_t value_dim() const { return num_value_heads * value_head_dim; }
};

struct ModelSpec {
  Family family = Family::Llama;
  std::string model_type;
  std::string source;            // file the spec came from, for messages
  // A multimodal config whose language model keel read from its text_config ("gemma3"), or empty.
  std::string wrapper_model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t max_position_embeddings = 0;
  NormKind norm = NormKind::RmsNorm;
  double norm_eps = 1e-6;
  NormPlacement placement = NormPlacement::Pre;
  // Gemma's RMSNorm: x̂·(1 + w) with w stored and initialized at zero, instead of x̂·w.
  bool norm_unit_offset = false;
  // Norm gains take weight decay (Qwen3-Next's zero-centred, weight-decayed norm, keel.norm =
  // "rmsnorm_1p"): with x̂·(1 + w), decay pulls w to 0, the gain to 1.
  bool norm_weight_decay = false;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  AttentionSpec attention;
  MlpSpec mlp;                   // dense MLP (all layers of dense models, leading layers of MoE)
  MoeSpec moe;
  int64_t mtp_layers = 0;        // num_nextn_predict_layers
  double z_loss = 0.0;           // keel.z_loss
  double final_softcap = 0.0;    // keel.final_softcap
  double embed_scale = 1.0;      // keel.embed_scale: token embeddings are multiplied by it
  std::vector<bool> sliding_layer;  // per decoder layer: local (sliding-window) attention
  LinearAttentionSpec linear_attention;
  std::vector<bool> linear_attention_layer;  // per decoder layer: Gated DeltaNet instead of attention
  bool is_linear_attention_layer(int64_t layer) const {
    return !linear_attention_layer.empty() && linear_attention_layer[static_cast<size_t>(layer)];
  }
  bool is_sliding_layer(int64_t layer) const {
    return attention.sliding_window > 0 && sliding_layer[static_cast<size_t>(layer)];
  }

  bool is_moe_layer(int64_t layer) const {
    return moe.enabled && moe.moe_layer[static_cast<size_t>(layer)];
  }
  bool has_final_norm() const { return placement != NormPlacement::Post; }
};

// Limits that keep accounting exact in 64 bits and bound work on hostile input.
inline constexpr int64_t kMaxDim = int64_t{1} << 24;     // any width, vocab, rank
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxExperts = 1 << 16;
inline constexpr int64_t kMaxPositions = int64_t{1} << 30;

// The factor attention logits are multiplied by: AttentionSpec::softmax_scale(), and for MLA
// (qk_nope + qk_rope)^-1/2 times YaRN's mscale² when rope_scaling sets mscale_all_dim (HF
// DeepseekV3Attention; DeepSeek-V3 §4.3). keel::Error for a malformed rope_scaling.
double attention_softmax_scale(const ModelSpec& spec);

// Builds the typed description; throws keel::Error(source, field, reason) on bad input.
ModelSpec spec_from_config(const nlohmann::json& config, const std::string& source);

// model_type values keel understands, in the order the table lists them.
std::vector<std::string> supported_model_types();

}  // namespace keel::arch
