#include "keel/arch/hf_tensors.hpp"

#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"

namespace keel::arch {

std::string_view to_string(Component c) {
  switch (c) {
    case Component::Embedding: return "embedding";
    case Component::PositionEmbedding: return "position_embedding";
    case Component::Attention: return "attention";
    case Component::LinearAttention: return "linear_attention";
    case Component::Mlp: return "mlp";
    case Component::RoutedExperts: return "routed_experts";
    case Component::SharedExperts: return "shared_experts";
    case Component::Router: return "router";
    case Component::LayerNorms: return "layer_norms";
    case Component::FinalNorm: return "final_norm";
    case Component::LmHead: return "lm_head";
    case Component::Mtp: return "mtp";
  }
  return "?";
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorEntry::name_for_expert(int64_t expert) const {
  auto pos = name.find("{E}");
  if (pos == std::string::npos) return name;
  return name.substr(0, pos) + std::to_string(expert) + name.substr(pos + 3);
}

namespace {

using K = TensorKind;

class LayoutBuilder {
 public:
  LayoutBuilder(const ModelSpec& spec, std::vector<TensorEntry>& out)
      : s_(spec), names_(*family_row(spec).names), out_(out) {}

  // One tensor by role; its name comes from the family's table, its FLOP and optimizer flags
  // from its kind. Routed experts keep "{E}" in the name and count `copies`.
  void add(TensorKind kind, TensorPart part, int64_t layer, std::vector<int64_t> shape, Component c,
           int64_t copies = 1) {
    TensorEntry e;
    e.role = {kind, part, layer, -1};
    e.name = tensor_name(names_, e.role);  // routed experts: "{E}" stays
    if (mtp_prefix_) e.name = qwen3_next_mtp_name(e.name, layer);
    e.shape = std::move(shape);
    e.component = override_ ? *override_ : c;
    e.copies = copies;
    const bool weight = part == TensorPart::Weight || part == TensorPart::Bare;
    e.matmul = weight && is_matmul_kind(kind);
    e.optimizer = weight && is_hidden_matrix_kind(kind) ? OptimizerGroup::Muon : OptimizerGroup::AdamW;
    out_.push_back(std::move(e));
  }

  // A norm: weight, plus bias for LayerNorm.
  void norm(TensorKind kind, int64_t layer, int64_t dim, Component c, NormKind norm_kind) {
    add(kind, TensorPart::Weight, layer, {dim}, c);
    if (norm_kind == NormKind::LayerNorm) add(kind, TensorPart::Bias, layer, {dim}, c);
  }

  // A linear layer in PyTorch [out, in] layout.
  void linear(TensorKind kind, int64_t layer, int64_t out, int64_t in, bool bias, Component c, int64_t copies = 1) {
    add(kind, TensorPart::Weight, layer, {out, in}, c, copies);
    if (bias) add(kind, TensorPart::Bias, layer, {out}, c, copies);
  }

  void gated_mlp(TensorKind gate, TensorKind up, TensorKind down, int64_t layer, int64_t width, bool bias,
                 Component c, int64_t copies = 1) {
    linear(gate, layer, width, s_.hidden_size, bias, c, copies);
    linear(up, layer, width, s_.hidden_size, bias, c, copies);
    linear(down, layer, s_.hidden_size, width, bias, c, copies);
  }

  void attention(int64_t layer) {
    const auto& a = s_.attention;
    const int64_t h = s_.hidden_size;
    const Component c = Component::Attention;
    if (a.kind == AttentionKind::Mla) {
      const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
      if (a.q_lora_rank > 0) {
        linear(K::QA, layer, a.q_lora_rank, h, a.qkv_bias, c);
        if (a.mla_latent_norms) norm(K::QANorm, layer, a.q_lora_rank, c, NormKind::RmsNorm);
        linear(K::QB, layer, a.num_heads * qk, a.q_lora_rank, false, c);
      } else {
        linear(K::Q, layer, a.num_heads * qk, h, false, c);
      }
      linear(K::KvA, layer, a.kv_lora_rank + a.qk_rope_head_dim, h, a.qkv_bias, c);
      if (a.mla_latent_norms) norm(K::KvANorm, layer, a.kv_lora_rank, c, NormKind::RmsNorm);
      linear(K::KvB, layer, a.num_heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, false, c);
      linear(K::O, layer, h, a.num_heads * a.v_head_dim, a.o_bias, c);
      return;
    }
    // Qwen3-Next's output gate: q_proj gives each head its query and its gate side by side.
    linear(K::Q, layer, (a.output_gate ? 2 : 1) * a.num_heads * a.head_dim, h, a.qkv_bias, c);
    linear(K::K, layer, a.num_kv_heads * a.head_dim, h, a.qkv_bias, c);
    linear(K::V, layer, a.num_kv_heads * a.head_dim, h, a.qkv_bias, c);
    linear(K::O, layer, h, a.num_heads * a.head_dim, a.o_bias, c);
    if (a.sinks) add(K::AttentionSink, TensorPart::Bare, layer, {a.num_heads}, c);
    if (a.qk_norm) {  // RMSNorm over head_dim shared by all heads, or over the full width (OLMo 2)
      norm(K::QNorm, layer, a.qk_norm_full_width ? a.num_heads * a.head_dim : a.head_dim, c, NormKind::RmsNorm);
      norm(K::KNorm, layer, a.qk_norm_full_width ? a.num_kv_heads * a.head_dim : a.head_dim, c, NormKind::RmsNorm);
    }
  }

  // Routed experts (and shared experts and the correction bias where the family has them).
  void moe(int64_t layer, Component router, Component experts, Component shared) {
    const auto& moe = s_.moe;
    if (moe.gpt_oss_experts) {
      gpt_oss_experts(layer, router, experts);
      return;
    }
    linear(K::Router, layer, moe.num_experts, s_.hidden_size, false, router);
    if (moe.score_correction_bias) add(K::Router, TensorPart::CorrectionBias, layer, {moe.num_experts}, router);
    gated_mlp(K::ExpertGate, K::ExpertUp, K::ExpertDown, layer, moe.expert_intermediate_size, false, experts,
              moe.num_experts);
    if (moe.num_shared_experts > 0) {
      gated_mlp(K::SharedGate, K::SharedUp, K::SharedDown, layer, moe.shared_intermediate_size, false, shared);
    }
    if (moe.shared_expert_gate) linear(K::SharedExpertGate, layer, 1, s_.hidden_size, false, shared);
  }

  // gpt-oss (GptOssTopKRouter, GptOssExperts): a biased router and four fused expert tensors.
  void gpt_oss_experts(int64_t layer, Component router, Component experts) {
    const int64_t E = s_.moe.num_experts, F = s_.moe.expert_intermediate_size, h = s_.hidden_size;
    linear(K::Router, layer, E, h, true, router);
    add(K::ExpertsGateUp, TensorPart::Bare, layer, {E, h, 2 * F}, experts);
    add(K::ExpertsGateUpBias, TensorPart::Bare, layer, {E, 2 * F}, experts);
    add(K::ExpertsDown, TensorPart::Bare, layer, {E, F, h}, experts);
    add(K::ExpertsDownBias, TensorPart::Bare, layer, {E, h}, experts);
    for (size_t i = out_.size() - 4; i < out_.size(); ++i) out_[i].fused_experts = E;
  }

  // Qwen3-Next's Gated DeltaNet (Qwen3NextGatedDeltaNet): q, k, v, z from one projection grouped
  // by key head, β and a from another, a causal depthwise conv over q, k, v, per-value-head decay
  // (A_log, dt_bias), a gated RMSNorm over each value head, out_proj.
  void linear_attention(int64_t layer) {
    const auto& la = s_.linear_attention;
    const int64_t h = s_.hidden_size, kd = la.key_dim(), vd = la.value_dim();
    const Component c = Component::LinearAttention;
    linear(K::LinearQkvz, layer, 2 * kd + 2 * vd, h, false, c);
    linear(K::LinearBa, layer, 2 * la.num_value_heads, h, false, c);
    add(K::LinearConv, TensorPart::Weight, layer, {2 * kd + vd, 1, la.conv_kernel}, c);
    add(K::LinearDtBias, TensorPart::Bare, layer, {la.num_value_heads}, c);
    add(K::LinearALog, TensorPart::Bare, layer, {la.num_value_heads}, c);
    norm(K::LinearNorm, layer, la.value_head_dim, c, NormKind::RmsNorm);
    linear(K::LinearOut, layer, h, vd, false, c);
  }

  void ffn(int64_t layer) {
    if (s_.is_moe_layer(layer)) {
      moe(layer, Component::Router, Component::RoutedExperts, Component::SharedExperts);
      return;
    }
    switch (s_.mlp.kind) {
      case FfnKind::Plain:  // keel.mlp = "plain", or GPT-2: up, activation, down
        linear(K::MlpUp, layer, s_.mlp.intermediate_size, s_.hidden_size, s_.mlp.bias, Component::Mlp);
        linear(K::MlpDown, layer, s_.hidden_size, s_.mlp.intermediate_size, s_.mlp.bias, Component::Mlp);
        return;
      case FfnKind::Gated:
        gated_mlp(K::MlpGate, K::MlpUp, K::MlpDown, layer, s_.mlp.intermediate_size, s_.mlp.bias, Component::Mlp);
        return;
    }
  }

  void decoder_layer(int64_t layer) {
    const int64_t h = s_.hidden_size;
    const Component c = Component::LayerNorms;
    switch (s_.placement) {
      case NormPlacement::Pre:
        norm(K::InputNorm, layer, h, c, s_.norm);
        if (s_.is_linear_attention_layer(layer)) linear_attention(layer);
        else attention(layer);
        norm(K::PostAttentionNorm, layer, h, c, s_.norm);
        ffn(layer);
        break;
      case NormPlacement::Post:          // N(x + f(x))
      case NormPlacement::PostSublayer:  // x + N(f(x)): the same tensors in the same order
        attention(layer);
        norm(K::PostAttentionNorm, layer, h, c, s_.norm);
        ffn(layer);
        norm(K::PostFeedforwardNorm, layer, h, c, s_.norm);
        break;
      case NormPlacement::Sandwich:
        norm(K::InputNorm, layer, h, c, s_.norm);
        attention(layer);
        norm(K::PostAttentionNorm, layer, h, c, s_.norm);
        norm(K::PreFeedforwardNorm, layer, h, c, s_.norm);
        ffn(layer);
        norm(K::PostFeedforwardNorm, layer, h, c, s_.norm);
        break;
    }
  }

  // DeepSeek-V3's MTP module as its checkpoint stores it (layer index num_layers + k): its own
  // embed_tokens and shared_head copies, enorm/hnorm, eh_proj [H, 2H], and one decoder layer.
  void mtp_module(int64_t index) {
    if (s_.family == Family::Qwen3Next) {
      qwen3_next_mtp_module(index);
      return;
    }
    const int64_t layer = s_.num_layers + index;
    const int64_t h = s_.hidden_size;
    const Component c = Component::Mtp;
    override_ = Component::Mtp;
    add(K::MtpEmbedding, TensorPart::Weight, layer, {s_.vocab_size, h}, c);
    norm(K::MtpENorm, layer, h, c, s_.norm);
    norm(K::MtpHNorm, layer, h, c, s_.norm);
    linear(K::MtpEhProj, layer, h, 2 * h, false, c);
    // The MTP block is an MoE block when the model has experts (as DeepSeek-V3's layer 61).
    norm(K::InputNorm, layer, h, c, s_.norm);
    attention(layer);
    norm(K::PostAttentionNorm, layer, h, c, s_.norm);
    if (s_.moe.enabled) moe(layer, c, c, c);
    else gated_mlp(K::MlpGate, K::MlpUp, K::MlpDown, layer, s_.mlp.intermediate_size, s_.mlp.bias, c);
    norm(K::MtpHeadNorm, layer, h, c, s_.norm);
    add(K::MtpHead, TensorPart::Weight, layer, {s_.vocab_size, h}, c);
    override_.reset();
  }

  // Qwen3-Next's MTP layer as its checkpoint stores it (vLLM qwen3_next_mtp.py; transformers
  // drops mtp.*): fc [H, 2H] after pre_fc_norm_embedding / pre_fc_norm_hidden, one full-attention
  // MoE decoder layer as mtp.layers.K, mtp.norm; it shares embed_tokens and lm_head with the model.
  void qwen3_next_mtp_module(int64_t index) {
    const int64_t layer = s_.num_layers + index;
    const int64_t h = s_.hidden_size;
    const Component c = Component::Mtp;
    override_ = Component::Mtp;
    linear(K::MtpEhProj, layer, h, 2 * h, false, c);
    norm(K::MtpENorm, layer, h, c, s_.norm);
    norm(K::MtpHNorm, layer, h, c, s_.norm);
    mtp_prefix_ = true;
    norm(K::InputNorm, layer, h, c, s_.norm);
    attention(layer);
    norm(K::PostAttentionNorm, layer, h, c, s_.norm);
    if (s_.moe.enabled) moe(layer, c, c, c);
    else gated_mlp(K::MlpGate, K::MlpUp, K::MlpDown, layer, s_.mlp.intermediate_size, s_.mlp.bias, c);
    mtp_prefix_ = false;
    norm(K::MtpHeadNorm, layer, h, c, s_.norm);
    override_.reset();
  }

  // "model.layers.{num_layers + K}.rest" -> "mtp.layers.{K}.rest".
  std::string qwen3_next_mtp_name(const std::string& name, int64_t layer) const {
    const std::string from = "model.layers." + std::to_string(layer) + ".";
    KEEL_CHECK(name.rfind(from, 0) == 0);
    return "mtp.layers." + std::to_string(layer - s_.num_layers) + "." + name.substr(from.size());
  }

  // GPT-2 stores Conv1D weights as [in, out] and fuses q, k, v into c_attn.
  void gpt2_layer(int64_t l) {
    const int64_t h = s_.hidden_size, w = s_.mlp.intermediate_size;
    norm(K::InputNorm, l, h, Component::LayerNorms, s_.norm);
    add(K::Qkv, TensorPart::Weight, l, {h, 3 * h}, Component::Attention);
    add(K::Qkv, TensorPart::Bias, l, {3 * h}, Component::Attention);
    add(K::O, TensorPart::Weight, l, {h, h}, Component::Attention);
    add(K::O, TensorPart::Bias, l, {h}, Component::Attention);
    norm(K::PostAttentionNorm, l, h, Component::LayerNorms, s_.norm);
    add(K::MlpUp, TensorPart::Weight, l, {h, w}, Component::Mlp);
    add(K::MlpUp, TensorPart::Bias, l, {w}, Component::Mlp);
    add(K::MlpDown, TensorPart::Weight, l, {w, h}, Component::Mlp);
    add(K::MlpDown, TensorPart::Bias, l, {h}, Component::Mlp);
  }

  void model(bool include_mtp) {
    const int64_t h = s_.hidden_size;
    add(K::Embedding, TensorPart::Weight, -1, {s_.vocab_size, h}, Component::Embedding);
    const ProjectionLayout layout = family_row(s_).projections;
    switch (layout) {
      case ProjectionLayout::Gpt2Conv1D:
        add(K::PositionEmbedding, TensorPart::Weight, -1, {s_.max_position_embeddings, h},
            Component::PositionEmbedding);
        for (int64_t l = 0; l < s_.num_layers; ++l) gpt2_layer(l);
        break;
      case ProjectionLayout::Linear:
        for (int64_t l = 0; l < s_.num_layers; ++l) decoder_layer(l);
        if (include_mtp) {
          for (int64_t k = 0; k < s_.mtp_layers; ++k) mtp_module(k);
        }
        break;
    }
    if (s_.has_final_norm()) norm(K::FinalNorm, -1, h, Component::FinalNorm, s_.norm);
    if (!s_.tie_word_embeddings) add(K::LmHead, TensorPart::Weight, -1, {s_.vocab_size, h}, Component::LmHead);
  }

 private:
  const ModelSpec& s_;
  const TensorNameTable& names_;
  std::vector<TensorEntry>& out_;
  std::optional<Component> override_;
  bool mtp_prefix_ = false;  // Qwen3-Next's MTP decoder layer: mtp.layers.K. instead of model.layers.L.
};

}  // namespace

std::vector<TensorEntry> hf_tensor_layout(const ModelSpec& spec, bool include_mtp) {
  std::vector<TensorEntry> out;
  LayoutBuilder b(spec, out);
  b.model(include_mtp);
  return out;
}

}  // namespace keel::arch
