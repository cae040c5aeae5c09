#pragma once
// QK-Clip, the "Clip" of MuonClip (Kimi K2, arXiv:2507.20534 §2.1, Algorithm 1): after the
// optimizer step, every attention head whose max scaled pre-softmax logit S_h of this step exceeds
// tau has its query/key weights rescaled so that its logits shrink by gamma_h = tau / S_h, which
// puts S_h back on tau. Optimizer state (momentum, Adam moments) is left alone, as in the paper and
// Megatron.
//
// Families: the MHA/GQA/MQA decoders whose attention is `model.layers.{L}.self_attn.{q,k}_proj`
// (llama, mistral, qwen2, qwen3, and the MoE families sharing that attention), and MLA
// (deepseek_v3, kimi_k2: per head q^C and k^C rows by sqrt(gamma_h), q^R rows by gamma_h, the
// shared k^R untouched; q_b_proj or q_proj). GPT-2's fused c_attn throws keel::Error naming the
// model_type.
#include <cstdint>
#include <vector>

#include "keel/arch/model_spec.hpp"
#include "keel/nn/parameters.hpp"

namespace keel::optim {

struct QkClipConfig {
  float tau = 100.f;  // K2 used 100
};

struct QkClipReport {
  int64_t clipped_heads = 0;  // query heads with S_h > tau
  // (layers, heads): the per-head target gamma_h = tau / S_h, 1 where S_h <= tau. Without QK-Norm
  // each head's logits are scaled by exactly this; with QK-Norm the whole layer is scaled by the
  // minimum over its heads (see qk_clip.cpp).
  std::vector<float> gamma;
};

// max_logits: (layers, heads), the per-head max scaled logit of this step, max-reduced over
// micro-batches (TransformerModel::max_logits() gives one forward's). Heads at or below tau, and
// layers with no such head, are not touched at all. Throws keel::Error for unsupported families,
// a max_logits of the wrong size, a non-positive tau or a non-finite max logit.
QkClipReport qk_clip(nn::ParameterStore& store, const arch::ModelSpec& spec, const std::vector<float>& max_logits,
                     const QkClipConfig& cfg);

}  // namespace keel::optim
