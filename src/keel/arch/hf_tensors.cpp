#include "keel/arch/hf_tensors.hpp"

#include "keel/core/error.hpp"

namespace keel::arch {

std::string_view to_string(Component c) {
  switch (c) {
    case Component::Embedding: return "embedding";
    case Component::PositionEmbedding: return "position_embedding";
    case Component::Attention: return "attention";
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

class LayoutBuilder {
 public:
  LayoutBuilder(const ModelSpec& spec, std::vector<TensorEntry>& out) : s_(spec), out_(out) {}

  void add(std::string name, std::vector<int64_t> shape, Component c, int64_t layer,
           bool matmul = false, bool muon = false, int64_t copies = 1) {
    TensorEntry e;
    e.name = std::move(name);
    e.shape = std::move(shape);
    e.component = override_ ? *override_ : c;
    e.layer = layer;
    e.copies = copies;
    e.matmul = matmul;
    e.optimizer = muon ? OptimizerGroup::Muon : OptimizerGroup::AdamW;
    out_.push_back(std::move(e));
  }

  // A norm: weight, plus bias for LayerNorm.
  void norm(const std::string& prefix, int64_t dim, Component c, int64_t layer, NormKind kind) {
    add(prefix + ".weight", {dim}, c, layer);
    if (kind == NormKind::LayerNorm) add(prefix + ".bias", {dim}, c, layer);
  }

  // A linear layer in PyTorch [out, in] layout.
  void linear(const std::string& prefix, int64_t out, int64_t in, bool bias, Component c, int64_t layer,
              bool muon = true, int64_t copies = 1) {
    add(prefix + ".weight", {out, in}, c, layer, true, muon, copies);
    if (bias) add(prefix + ".bias", {out}, c, layer, false, false, copies);
  }

  void gated_mlp(const std::string& p, int64_t width, bool bias, Component c, int64_t layer,
                 int64_t copies = 1, const char* gate = "gate_proj", const char* up = "up_proj",
                 const char* down = "down_proj") {
    linear(p + "." + gate, width, s_.hidden_size, bias, c, layer, true, copies);
    linear(p + "." + up, width, s_.hidden_size, bias, c, layer, true, copies);
    linear(p + "." + down, s_.hidden_size, width, bias, c, layer, true, copies);
  }

  void attention(const std::string& p, int64_t layer) {
    const auto& a = s_.attention;
    const int64_t h = s_.hidden_size;
    if (a.kind == AttentionKind::Mla) {
      const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
      if (a.q_lora_rank > 0) {
        linear(p + ".q_a_proj", a.q_lora_rank, h, a.qkv_bias, Component::Attention, layer);
        if (a.mla_latent_norms) norm(p + ".q_a_layernorm", a.q_lora_rank, Component::Attention, layer, NormKind::RmsNorm);
        linear(p + ".q_b_proj", a.num_heads * qk, a.q_lora_rank, false, Component::Attention, layer);
      } else {
        linear(p + ".q_proj", a.num_heads * qk, h, false, Component::Attention, layer);
      }
      linear(p + ".kv_a_proj_with_mqa", a.kv_lora_rank + a.qk_rope_head_dim, h, a.qkv_bias,
             Component::Attention, layer);
      if (a.mla_latent_norms) norm(p + ".kv_a_layernorm", a.kv_lora_rank, Component::Attention, layer, NormKind::RmsNorm);
      linear(p + ".kv_b_proj", a.num_heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, false,
             Component::Attention, layer);
      linear(p + ".o_proj", h, a.num_heads * a.v_head_dim, a.o_bias, Component::Attention, layer);
      return;
    }
    linear(p + ".q_proj", a.num_heads * a.head_dim, h, a.qkv_bias, Component::Attention, layer);
    linear(p + ".k_proj", a.num_kv_heads * a.head_dim, h, a.qkv_bias, Component::Attention, layer);
    linear(p + ".v_proj", a.num_kv_heads * a.head_dim, h, a.qkv_bias, Component::Attention, layer);
    linear(p + ".o_proj", h, a.num_heads * a.head_dim, a.o_bias, Component::Attention, layer);
    if (a.qk_norm) {  // QK-Norm is always RMSNorm over head_dim, shared by all heads
      norm(p + ".q_norm", a.head_dim, Component::Attention, layer, NormKind::RmsNorm);
      norm(p + ".k_norm", a.head_dim, Component::Attention, layer, NormKind::RmsNorm);
    }
  }

  void ffn(const std::string& p, int64_t layer) {
    const auto& moe = s_.moe;
    const auto family = s_.family;
    if (!s_.is_moe_layer(layer)) {
      if (s_.mlp.kind == FfnKind::Plain) {  // keel.mlp = "plain": up, activation, down
        linear(p + ".mlp.up_proj", s_.mlp.intermediate_size, s_.hidden_size, s_.mlp.bias, Component::Mlp, layer);
        linear(p + ".mlp.down_proj", s_.hidden_size, s_.mlp.intermediate_size, s_.mlp.bias, Component::Mlp, layer);
        return;
      }
      gated_mlp(p + ".mlp", s_.mlp.intermediate_size, s_.mlp.bias, Component::Mlp, layer);
      return;
    }
    if (family == Family::Mixtral) {
      const std::string m = p + ".block_sparse_moe";
      linear(m + ".gate", moe.num_experts, s_.hidden_size, false, Component::Router, layer, false);
      gated_mlp(m + ".experts.{E}", moe.expert_intermediate_size, false, Component::RoutedExperts, layer,
                moe.num_experts, "w1", "w3", "w2");
      return;
    }
    const std::string m = p + ".mlp";
    linear(m + ".gate", moe.num_experts, s_.hidden_size, false, Component::Router, layer, false);
    if (moe.score_correction_bias) add(m + ".gate.e_score_correction_bias", {moe.num_experts}, Component::Router, layer);
    gated_mlp(m + ".experts.{E}", moe.expert_intermediate_size, false, Component::RoutedExperts, layer,
              moe.num_experts);
    if (moe.num_shared_experts > 0) {
      gated_mlp(m + ".shared_experts", moe.shared_intermediate_size, false, Component::SharedExperts, layer);
    }
  }

  void decoder_layer(int64_t layer) {
    const std::string p = "model.layers." + std::to_string(layer);
    const int64_t h = s_.hidden_size;
    switch (s_.placement) {
      case NormPlacement::Pre:
        norm(p + ".input_layernorm", h, Component::LayerNorms, layer, s_.norm);
        attention(p + ".self_attn", layer);
        norm(p + ".post_attention_layernorm", h, Component::LayerNorms, layer, s_.norm);
        ffn(p, layer);
        break;
      case NormPlacement::Post:
        attention(p + ".self_attn", layer);
        norm(p + ".post_attention_layernorm", h, Component::LayerNorms, layer, s_.norm);
        ffn(p, layer);
        norm(p + ".post_feedforward_layernorm", h, Component::LayerNorms, layer, s_.norm);
        break;
      case NormPlacement::Sandwich:
        norm(p + ".input_layernorm", h, Component::LayerNorms, layer, s_.norm);
        attention(p + ".self_attn", layer);
        norm(p + ".post_attention_layernorm", h, Component::LayerNorms, layer, s_.norm);
        norm(p + ".pre_feedforward_layernorm", h, Component::LayerNorms, layer, s_.norm);
        ffn(p, layer);
        norm(p + ".post_feedforward_layernorm", h, Component::LayerNorms, layer, s_.norm);
        break;
    }
  }

  // DeepSeek-V3's MTP module as its checkpoint stores it (layer index num_layers + k): its own
  // embed_tokens and shared_head copies, enorm/hnorm, eh_proj [H, 2H], and one decoder layer.
  void mtp_module(int64_t index) {
    const int64_t layer = s_.num_layers + index;
    const std::string p = "model.layers." + std::to_string(layer);
    const int64_t h = s_.hidden_size;
    override_ = Component::Mtp;
    add(p + ".embed_tokens.weight", {s_.vocab_size, h}, Component::Mtp, layer);
    norm(p + ".enorm", h, Component::Mtp, layer, s_.norm);
    norm(p + ".hnorm", h, Component::Mtp, layer, s_.norm);
    linear(p + ".eh_proj", h, 2 * h, false, Component::Mtp, layer);
    // The MTP block is an MoE block when the model has experts (as DeepSeek-V3's layer 61).
    norm(p + ".input_layernorm", h, Component::Mtp, layer, s_.norm);
    attention(p + ".self_attn", layer);
    norm(p + ".post_attention_layernorm", h, Component::Mtp, layer, s_.norm);
    mtp_ffn(p, layer);
    norm(p + ".shared_head.norm", h, Component::Mtp, layer, s_.norm);
    add(p + ".shared_head.head.weight", {s_.vocab_size, h}, Component::Mtp, layer, true);
    override_.reset();
  }

  void mtp_ffn(const std::string& p, int64_t layer) {
    const auto& moe = s_.moe;
    if (!moe.enabled) {
      gated_mlp(p + ".mlp", s_.mlp.intermediate_size, s_.mlp.bias, Component::Mtp, layer);
      return;
    }
    const std::string m = p + ".mlp";
    linear(m + ".gate", moe.num_experts, s_.hidden_size, false, Component::Mtp, layer, false);
    if (moe.score_correction_bias) add(m + ".gate.e_score_correction_bias", {moe.num_experts}, Component::Mtp, layer);
    gated_mlp(m + ".experts.{E}", moe.expert_intermediate_size, false, Component::Mtp, layer, moe.num_experts);
    if (moe.num_shared_experts > 0) {
      gated_mlp(m + ".shared_experts", moe.shared_intermediate_size, false, Component::Mtp, layer);
    }
  }

  void gpt2() {
    const int64_t h = s_.hidden_size;
    const int64_t w = s_.mlp.intermediate_size;
    // GPT-2 stores Conv1D weights as [in, out].
    add("transformer.wte.weight", {s_.vocab_size, h}, Component::Embedding, -1);
    add("transformer.wpe.weight", {s_.max_position_embeddings, h}, Component::PositionEmbedding, -1);
    for (int64_t l = 0; l < s_.num_layers; ++l) {
      const std::string p = "transformer.h." + std::to_string(l);
      norm(p + ".ln_1", h, Component::LayerNorms, l, s_.norm);
      add(p + ".attn.c_attn.weight", {h, 3 * h}, Component::Attention, l, true, true);
      add(p + ".attn.c_attn.bias", {3 * h}, Component::Attention, l);
      add(p + ".attn.c_proj.weight", {h, h}, Component::Attention, l, true, true);
      add(p + ".attn.c_proj.bias", {h}, Component::Attention, l);
      norm(p + ".ln_2", h, Component::LayerNorms, l, s_.norm);
      add(p + ".mlp.c_fc.weight", {h, w}, Component::Mlp, l, true, true);
      add(p + ".mlp.c_fc.bias", {w}, Component::Mlp, l);
      add(p + ".mlp.c_proj.weight", {w, h}, Component::Mlp, l, true, true);
      add(p + ".mlp.c_proj.bias", {h}, Component::Mlp, l);
    }
    norm("transformer.ln_f", h, Component::FinalNorm, -1, s_.norm);
    if (!s_.tie_word_embeddings) add("lm_head.weight", {s_.vocab_size, h}, Component::LmHead, -1, true);
  }

  void decoder(bool include_mtp) {
    const int64_t h = s_.hidden_size;
    add("model.embed_tokens.weight", {s_.vocab_size, h}, Component::Embedding, -1);
    for (int64_t l = 0; l < s_.num_layers; ++l) decoder_layer(l);
    if (include_mtp) {
      for (int64_t k = 0; k < s_.mtp_layers; ++k) mtp_module(k);
    }
    if (s_.has_final_norm()) norm("model.norm", h, Component::FinalNorm, -1, s_.norm);
    if (!s_.tie_word_embeddings) add("lm_head.weight", {s_.vocab_size, h}, Component::LmHead, -1, true);
  }

 private:
  const ModelSpec& s_;
  std::vector<TensorEntry>& out_;
  std::optional<Component> override_;
};

}  // namespace

std::vector<TensorEntry> hf_tensor_layout(const ModelSpec& spec, bool include_mtp) {
  std::vector<TensorEntry> out;
  LayoutBuilder b(spec, out);
  if (spec.family == Family::Gpt2) b.gpt2();
  else b.decoder(include_mtp);
  return out;
}

}  // namespace keel::arch
