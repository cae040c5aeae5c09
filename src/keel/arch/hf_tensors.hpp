#pragma once
// Every tensor of a model as its HF checkpoint stores it: name, shape, role. Parameter counts,
// memory, optimizer routing (Muon vs AdamW) and safetensors I/O all read this one list.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "keel/arch/model_spec.hpp"
#include "keel/arch/tensor_names.hpp"

namespace keel::arch {

enum class Component {
  Embedding,          // input token embedding
  PositionEmbedding,  // GPT-2's learned positions
  Attention,          // projections, their biases, q_norm/k_norm, MLA latent norms
  LinearAttention,    // Qwen3-Next's Gated DeltaNet layers (linear_attn.*)
  Mlp,                // dense FFN
  RoutedExperts,
  SharedExperts,
  Router,             // gate weight and e_score_correction_bias
  LayerNorms,         // the per-layer norms around attention and FFN
  FinalNorm,
  LmHead,
  Mtp,                // multi-token-prediction modules (all of their tensors)
};
std::string_view to_string(Component c);
inline constexpr Component kAllComponents[] = {
    Component::Embedding, Component::PositionEmbedding, Component::Attention, Component::LinearAttention, Component::Mlp,
    Component::RoutedExperts, Component::SharedExperts, Component::Router, Component::LayerNorms,
    Component::FinalNorm, Component::LmHead, Component::Mtp};

enum class OptimizerGroup { Muon, AdamW };

struct TensorEntry {
  std::string name;              // HF name; routed experts use "{E}" for the expert index
  TensorRole role;               // what it is, its layer (-1 outside the stack); routed experts: expert -1,
                                 // one entry for all copies
  std::vector<int64_t> shape;
  Component component;
  int64_t copies = 1;            // experts sharing this template, 1 otherwise
  int64_t fused_experts = 0;     // > 0: one tensor holding that many experts along dim 0 (gpt-oss)
  bool matmul = false;           // a weight multiplied with activations (a FLOP-bearing matrix)
  OptimizerGroup optimizer = OptimizerGroup::AdamW;  // default routing (issue: Muon on hidden matrices)

  int64_t numel() const;         // elements of one copy
  std::string name_for_expert(int64_t expert) const;
};

// All tensors in checkpoint order; MTP modules (layers num_layers..) only if include_mtp.
std::vector<TensorEntry> hf_tensor_layout(const ModelSpec& spec, bool include_mtp = true);

}  // namespace keel::arch
