#pragma once
// Tensors by role. Every tensor of a model is a TensorRole — what it is (kind), which part
// (weight, bias, correction bias), its layer and, for routed experts, its expert — and each
// family's row holds one TensorNameTable that spells every kind the HF way. Modules, the HF
// layout, QK-Clip, export and monitors ask a name for a role (or a role for a name); nothing
// else spells or parses an HF name. In the style of llama.cpp's architecture tables, but typed.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace keel::arch {

enum class TensorKind {
  // Outside the decoder stack.
  Embedding, PositionEmbedding, FinalNorm, LmHead,
  // The norms of a decoder layer, by HF module (which ones exist depends on the placement).
  InputNorm, PostAttentionNorm, PreFeedforwardNorm, PostFeedforwardNorm,
  // Attention: separate projections, GPT-2's fused c_attn, QK-Norm gains.
  Q, K, V, O, Qkv, QNorm, KNorm,
  // gpt-oss's per-head sink logits (self_attn.sinks, a bare nn.Parameter).
  AttentionSink,
  // Multi-head Latent Attention (Q is q_proj when q_lora_rank is null).
  QA, QANorm, QB, KvA, KvANorm, KvB,
  // Dense FFN (Up and Down only for a plain MLP).
  MlpGate, MlpUp, MlpDown,
  // Mixture of experts: router, routed experts (need an expert index), shared experts.
  Router, ExpertGate, ExpertUp, ExpertDown, SharedGate, SharedUp, SharedDown,
  // gpt-oss's experts, fused over all experts of a layer (bare parameters, [in, out] per expert):
  // gate_up_proj [E, hidden, 2·width], its bias [E, 2·width], down_proj [E, width, hidden], its bias.
  ExpertsGateUp, ExpertsGateUpBias, ExpertsDown, ExpertsDownBias,
  // Qwen3-Next: the shared expert's gate row; the Gated DeltaNet layers' tensors (linear_attn.*:
  // in_proj_qkvz, in_proj_ba, the depthwise conv1d, dt_bias and A_log (bare), the gated norm, out_proj).
  SharedExpertGate, LinearQkvz, LinearBa, LinearConv, LinearDtBias, LinearALog, LinearNorm, LinearOut,
  // DeepSeek-V3's multi-token-prediction module (layer = num_layers + k); its decoder layer
  // uses the kinds above at the same layer index.
  MtpEmbedding, MtpENorm, MtpHNorm, MtpEhProj, MtpHeadNorm, MtpHead,
};
std::string_view to_string(TensorKind kind);

// .weight / .bias / .e_score_correction_bias; Bare: a module's own nn.Parameter, named without a
// suffix (gpt-oss's sinks), only for the kinds is_bare_kind lists.
enum class TensorPart { Weight, Bias, CorrectionBias, Bare };

struct TensorRole {
  TensorKind kind = TensorKind::Embedding;
  TensorPart part = TensorPart::Weight;
  int64_t layer = -1;   // decoder layer; -1 outside the stack
  int64_t expert = -1;  // routed experts only
  bool operator==(const TensorRole&) const = default;
};

// A family's spelling of each kind, without the part's suffix. "{L}" stands for the layer and
// "{E}" for the expert. Empty: the family has no tensor of that kind.
struct TensorNameTable {
  std::string_view embedding, position_embedding, final_norm, lm_head;
  std::string_view input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
  std::string_view q, k, v, o, qkv, q_norm, k_norm, sinks;
  std::string_view q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b;
  std::string_view mlp_gate, mlp_up, mlp_down;
  std::string_view router, expert_gate, expert_up, expert_down, shared_gate, shared_up, shared_down;
  std::string_view experts_gate_up, experts_gate_up_bias, experts_down, experts_down_bias;
  std::string_view shared_expert_gate, linear_qkvz, linear_ba, linear_conv, linear_dt_bias, linear_a_log, linear_norm,
      linear_out;
  std::string_view mtp_embedding, mtp_enorm, mtp_hnorm, mtp_eh_proj, mtp_head_norm, mtp_head;
};

// The template of a kind ("model.layers.{L}.self_attn.q_proj"), empty when the family lacks it.
std::string_view name_template(const TensorNameTable& names, TensorKind kind);
// The HF name of a role: "model.layers.3.self_attn.q_proj.weight". A role the family cannot
// spell (empty template, a layer kind without a layer) is a broken invariant. A routed-expert
// role with expert -1 keeps "{E}": the name template of all of that layer's copies.
std::string tensor_name(const TensorNameTable& names, const TensorRole& role);
// The role a name spells in this table, or nullopt (names from outside: checkpoints, patterns).
std::optional<TensorRole> parse_tensor_name(const TensorNameTable& names, std::string_view name);

// What each kind is, for parameter counts, optimizer routing and initialization.
bool is_layer_kind(TensorKind kind);         // needs a layer index
bool is_expert_kind(TensorKind kind);        // needs an expert index
bool is_norm_kind(TensorKind kind);
bool is_bare_kind(TensorKind kind);          // stored without a part suffix (TensorPart::Bare)
bool is_bare_bias_kind(TensorKind kind);     // a bare parameter that is a bias (zeros at init, no decay)          // a norm gain (ones at init), plus bias for LayerNorm
// A weight multiplied with activations (FLOP-bearing): projections, router, heads.
bool is_matmul_kind(TensorKind kind);
// A hidden matrix: Muon orthogonalizes it by default and AdamW decays it. Not the embeddings,
// the LM heads or the router, which stay with AdamW (Moonlight §2.2; the router's rows are
// per-expert scores, not a linear map of the hidden state worth orthogonalizing).
bool is_hidden_matrix_kind(TensorKind kind);

}  // namespace keel::arch
