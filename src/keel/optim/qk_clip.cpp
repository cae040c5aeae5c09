// QK-Clip (Kimi K2, arXiv:2507.20534 §2.1, Algorithm 1) for MHA/GQA/MQA, with and without QK-Norm,
// and for MLA (DeepSeek-V3 / Kimi K2).
#include "keel/optim/qk_clip.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"

namespace keel::optim {
namespace {

using arch::TensorKind;
using arch::TensorPart;

// The tensor of a role in layer `layer`, checked against the size the spec implies.
float* param(nn::ParameterStore& store, const arch::ModelSpec& spec, TensorKind kind, TensorPart part, int64_t layer,
             int64_t numel) {
  const std::string name = arch::tensor_name(spec, {kind, part, layer});
  const nn::ParamInfo* info = store.find(name);
  if (!info) throw Error(spec.source, name, "QK-Clip: parameter not in the store");
  if (info->numel != numel)
    throw Error(spec.source, name,
                "QK-Clip: expected " + std::to_string(numel) + " elements, found " + std::to_string(info->numel));
  return store.data(name);
}

float* optional_param(nn::ParameterStore& store, const arch::ModelSpec& spec, TensorKind kind, TensorPart part,
                      int64_t layer, int64_t numel) {
  return store.find(arch::tensor_name(spec, {kind, part, layer})) ? param(store, spec, kind, part, layer, numel)
                                                                   : nullptr;
}
// Multiplies rows [row, row + rows) of a (·, cols) matrix, and the matching bias entries, by f.
void scale_rows(float* w, float* bias, int64_t row, int64_t rows, int64_t cols, float f) {
  for (int64_t i = row * cols; i < (row + rows) * cols; ++i) w[i] *= f;
  if (bias)
    for (int64_t i = row; i < row + rows; ++i) bias[i] *= f;
}

// MLA, per head h (Kimi K2 §2.1, algorithms.md §2): the logit is
//   s = scale·(q^C_h·k^C_h + q^R_h·k^R),
// with q^C_h, q^R_h rows of q_b_proj (or q_proj), k^C_h rows of kv_b_proj and k^R the last
// qk_rope_head_dim rows of kv_a_proj_with_mqa, shared by every head. Scaling q^C_h and k^C_h rows
// by sqrt(gamma_h) and q^R_h rows by gamma_h multiplies both terms, hence the logit, by exactly
// gamma_h (RoPE is linear; q^C/q^R pass no norm after these projections). k^R and v_h rows are
// left alone: k^R feeds every head, v does not enter the logit. q_a_proj / q_a_layernorm /
// kv_a_layernorm feed all heads too and stay untouched.
void clip_mla_layer(nn::ParameterStore& store, const arch::ModelSpec& spec, int64_t layer,
                    const std::vector<double>& gamma) {
  const auto& a = spec.attention;
  const int64_t heads = a.num_heads, nope = a.qk_nope_head_dim, rope = a.qk_rope_head_dim, qk = nope + rope;
  const int64_t q_in = a.q_lora_rank > 0 ? a.q_lora_rank : spec.hidden_size;
  float* wq = param(store, spec, a.q_lora_rank > 0 ? TensorKind::QB : TensorKind::Q, TensorPart::Weight, layer,
                    heads * qk * q_in);
  const int64_t kvb_rows = nope + a.v_head_dim;
  float* wkv_b = param(store, spec, TensorKind::KvB, TensorPart::Weight, layer, heads * kvb_rows * a.kv_lora_rank);
  for (int64_t h = 0; h < heads; ++h) {
    const double g = gamma[static_cast<size_t>(h)];
    if (g >= 1.0) continue;  // unclipped heads keep their bits
    const float root = static_cast<float>(std::sqrt(g));
    scale_rows(wq, nullptr, h * qk, nope, q_in, root);                         // q^C_h
    scale_rows(wq, nullptr, h * qk + nope, rope, q_in, static_cast<float>(g));  // q^R_h
    scale_rows(wkv_b, nullptr, h * kvb_rows, nope, a.kv_lora_rank, root);      // k^C_h
  }
}

}  // namespace

QkClipReport qk_clip(nn::ParameterStore& store, const arch::ModelSpec& spec, const std::vector<float>& max_logits,
                     const QkClipConfig& cfg) {
  if (!arch::family_row(spec).supports.qk_clip)
    throw Error(spec.source, "model_type", "QK-Clip is not implemented for model_type '" + spec.model_type + "'");
  if (!(cfg.tau > 0.f) || !std::isfinite(cfg.tau))
    throw Error(spec.source, "qk_clip.tau", "must be a positive finite number, got " + std::to_string(cfg.tau));
  const int64_t layers = spec.num_layers, heads = spec.attention.num_heads, kv_heads = spec.attention.num_kv_heads;
  const int64_t hd = spec.attention.head_dim, hidden = spec.hidden_size;
  if (static_cast<int64_t>(max_logits.size()) != layers * heads)
    throw Error(spec.source, "max_logits",
                "QK-Clip: expected (layers, heads) = " + std::to_string(layers * heads) + " values, got " +
                    std::to_string(max_logits.size()));
  const int64_t group = heads / kv_heads;
  // Validate everything before touching anything, so a bad value never leaves a half-clipped model.
  for (size_t i = 0; i < max_logits.size(); ++i)
    if (!std::isfinite(max_logits[i]))
      throw Error(spec.source, "max_logits", "QK-Clip: layer " + std::to_string(static_cast<int64_t>(i) / heads) + " head " +
                                        std::to_string(static_cast<int64_t>(i) % heads) +
                                        " has a non-finite max logit (training diverged)");

  QkClipReport report;
  report.gamma.assign(max_logits.size(), 1.f);
  for (int64_t l = 0; l < layers; ++l) {
    // gamma_h = tau / S_h for S_h > tau (paper's per-head version); computed in double.
    std::vector<double> gamma(static_cast<size_t>(heads), 1.0);
    bool any = false;
    for (int64_t h = 0; h < heads; ++h) {
      const float s = max_logits[static_cast<size_t>(l * heads + h)];
      if (s > cfg.tau) {
        gamma[static_cast<size_t>(h)] = static_cast<double>(cfg.tau) / static_cast<double>(s);
        report.gamma[static_cast<size_t>(l * heads + h)] = static_cast<float>(gamma[static_cast<size_t>(h)]);
        ++report.clipped_heads;
        any = true;
      }
    }
    if (!any) continue;  // nothing in this layer is touched: its weights stay bit-identical

    if (spec.attention.kind == arch::AttentionKind::Mla) {
      clip_mla_layer(store, spec, l, gamma);
      continue;
    }
    if (spec.attention.qk_norm) {
      // With QK-Norm (Qwen3, algorithms.md §3) q = g_q ⊙ RMSNorm(W_q x) per head, so scaling W_q or
      // W_k is cancelled by the norm (up to eps) and only the gains can move the logits. The gains
      // q_norm.weight / k_norm.weight are [head_dim] and shared by every head of the layer, so the
      // only change that scales each head's logits by a known factor is one scalar for the whole
      // layer: q_norm, k_norm ·= sqrt(gamma_layer) scale every logit of every head by gamma_layer
      // (RoPE is linear, so it commutes). To cap every clipped head, gamma_layer must be ≤ each
      // gamma_h, hence gamma_layer = min_h gamma_h. This over-clips the layer's other heads (their
      // logits shrink too), the per-layer behaviour the K2 authors replaced by per-head clipping;
      // with shared gains there is no exact per-head alternative.
      const double gl = *std::min_element(gamma.begin(), gamma.end());
      const float f = static_cast<float>(std::sqrt(gl));
      float* gq = param(store, spec, TensorKind::QNorm, TensorPart::Weight, l, hd);
      float* gk = param(store, spec, TensorKind::KNorm, TensorPart::Weight, l, hd);
      for (int64_t i = 0; i < hd; ++i) {
        gq[i] *= f;
        gk[i] *= f;
      }
      continue;
    }

    // With the output gate (Qwen3-Next) q_proj holds head h's query rows at h·2d and its gate
    // rows after them; only the query rows enter the logit.
    const int64_t q_rows_per_head = spec.attention.output_gate ? 2 * hd : hd;
    float* wq = param(store, spec, TensorKind::Q, TensorPart::Weight, l, heads * q_rows_per_head * hidden);
    float* wk = param(store, spec, TensorKind::K, TensorPart::Weight, l, kv_heads * hd * hidden);
    float* bq = optional_param(store, spec, TensorKind::Q, TensorPart::Bias, l, heads * q_rows_per_head);
    float* bk = optional_param(store, spec, TensorKind::K, TensorPart::Bias, l, kv_heads * hd);
    // GQA rule. Query head h reads kv head g = h / group; its logit is s = (q_h·k_g)/√d with
    // q_h = R(W_q^h x + b_q^h), k_g = R(W_k^g x' + b_k^g), R the (linear) RoPE rotation. Scaling
    // head h's q rows and bias by a_h and kv head g's k rows and bias by c_g multiplies every logit
    // of head h by exactly a_h·c_g. We need a_h·c_g = gamma_h for all h in the group (clipped heads
    // land on tau, unclipped ones keep their logits). With gamma_min = min over the group of gamma_h:
    //   c_g = sqrt(gamma_min),  a_h = gamma_h / sqrt(gamma_min)   =>  a_h·c_g = gamma_h.
    // For group = 1 (MHA) this is the paper's sqrt(gamma_h) on both q and k; the most clipped head of
    // a group gets the same balanced split. Unclipped heads of a clipped group get a_h = 1/sqrt(gamma_min)
    // > 1, so their q rows change (their logits do not); groups with no clipped head are not touched.
    for (int64_t g = 0; g < kv_heads; ++g) {
      double gmin = 1.0;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) gmin = std::min(gmin, gamma[static_cast<size_t>(h)]);
      if (gmin >= 1.0) continue;
      const double c = std::sqrt(gmin);
      scale_rows(wk, bk, g * hd, hd, hidden, static_cast<float>(c));
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        scale_rows(wq, bq, h * q_rows_per_head, hd, hidden, static_cast<float>(gamma[static_cast<size_t>(h)] / c));
    }
  }
  return report;
}

}  // namespace keel::optim
