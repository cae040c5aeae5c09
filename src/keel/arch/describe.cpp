#include "keel/arch/describe.hpp"

#include <algorithm>
#include <cmath>

#include "keel/arch/families.hpp"

namespace keel::arch {

using nlohmann::json;

namespace {

json memory_json(const MemoryPlan& m, bool mixed) {
  json j = {{"weights", m.weights},
            {"gradients", m.gradients},
            {"adamw_state", m.adamw_state},
            {"muon_state", m.muon_state},
            {"total_adamw", m.total_adamw()},
            {"total_muon", m.total_muon()}};
  if (mixed) j["master_weights"] = m.master_weights;
  return j;
}

json components_json(const std::map<Component, int64_t>& counts, bool include_mtp) {
  json j = json::object();
  for (Component c : kAllComponents) {
    if (c == Component::Mtp && !include_mtp) continue;
    auto it = counts.find(c);
    j[std::string(to_string(c))] = it == counts.end() ? 0 : it->second;
  }
  return j;
}

}  // namespace

int64_t default_flops_seq(const ModelSpec& spec) {
  return std::min<int64_t>(4096, spec.max_position_embeddings);
}

json describe(const ModelSpec& spec, const Accounting& acc) {
  const auto& a = spec.attention;
  const auto& row = family_row(spec.family);
  json attention = {{"kind", to_string(a.kind)},
                    {"num_heads", a.num_heads},
                    {"num_kv_heads", a.num_kv_heads},
                    {"head_dim", a.head_dim},
                    {"qk_norm", a.qk_norm},
                    {"qk_norm_width", a.qk_norm ? json(a.qk_norm_full_width ? "full_width" : "per_head") : json(nullptr)},
                    {"qkv_bias", a.qkv_bias},
                    {"o_bias", a.o_bias},
                    {"softcap", a.softcap > 0 ? json(a.softcap) : json(nullptr)},
                    {"sinks", a.sinks},
                    {"output_gate", a.output_gate},
                    {"query_pre_attn_scalar", a.query_pre_attn_scalar > 0 ? json(a.query_pre_attn_scalar) : json(nullptr)},
                    {"softmax_scale", attention_softmax_scale(spec)}};
  json sliding = json::array();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    if (spec.is_sliding_layer(l)) sliding.push_back(l);
  }
  attention["sliding_window"] = a.sliding_window > 0 ? json(a.sliding_window) : json(nullptr);
  attention["sliding_layers"] = sliding;
  // The same facts under HF's config names, for readers who search for them.
  json layer_types = json::array();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    layer_types.push_back(spec.is_linear_attention_layer(l) ? "linear_attention"
                          : spec.is_sliding_layer(l)        ? "sliding_attention"
                                                            : "full_attention");
  }
  attention["layer_types"] = layer_types;
  json linear_layers = json::array();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    if (spec.is_linear_attention_layer(l)) linear_layers.push_back(l);
  }
  const auto& la = spec.linear_attention;
  attention["linear_attention"] =
      linear_layers.empty() ? json(nullptr)
                            : json({{"kind", "gated_deltanet"},
                                    {"layers", linear_layers},
                                    {"num_key_heads", la.num_key_heads},
                                    {"num_value_heads", la.num_value_heads},
                                    {"key_head_dim", la.key_head_dim},
                                    {"value_head_dim", la.value_head_dim},
                                    {"conv_kernel", la.conv_kernel}});
  attention["attn_logit_softcapping"] = a.softcap > 0 ? json(a.softcap) : json(nullptr);
  attention["rope_local_base_freq"] = a.rope.local_theta > 0 ? json(a.rope.local_theta) : json(nullptr);
  if (a.learned_positions) {
    attention["positions"] = "learned";
    attention["rope"] = nullptr;
  } else {
    attention["positions"] = "rope";
    attention["rope"] = {{"theta", a.rope.theta},
                         {"partial_rotary_factor", a.rope.partial_rotary_factor},
                         {"rotary_dim", a.rope.rotary_dim},
                         {"interleave", a.rope.interleave},
                         {"scaling", a.rope.scaling},
                         // Gemma 3: the sliding layers' base (they rotate without scaling).
                         {"local_theta", a.rope.local_theta > 0 ? json(a.rope.local_theta) : json(nullptr)}};
  }
  if (a.kind == AttentionKind::Mla) {
    attention["mla"] = {{"q_lora_rank", a.q_lora_rank > 0 ? json(a.q_lora_rank) : json(nullptr)},
                        {"kv_lora_rank", a.kv_lora_rank},
                        {"qk_nope_head_dim", a.qk_nope_head_dim},
                        {"qk_rope_head_dim", a.qk_rope_head_dim},
                        {"v_head_dim", a.v_head_dim},
                        {"qk_head_dim", a.qk_head_dim()},
                        {"latent_norms", a.mla_latent_norms}};
  } else {
    attention["mla"] = nullptr;
  }

  const auto& mlp = spec.mlp;
  // Mixtral has no dense MLP: its intermediate_size is the experts' width.
  int64_t ffn_width = mlp.intermediate_size;
  switch (family_row(spec).moe) {
    case MoeLayout::Mixtral:
    case MoeLayout::GptOss:
      if (spec.moe.enabled) ffn_width = spec.moe.expert_intermediate_size;
      break;
    case MoeLayout::Dense:
    case MoeLayout::Qwen3Moe:
    case MoeLayout::Qwen3Next:
    case MoeLayout::DeepseekV3:
      break;
  }
  json ffn = {{"kind", ffn_display_name(mlp.kind, mlp.activation)},
              {"gated", mlp.kind == FfnKind::Gated},
              {"hidden_act", mlp.hidden_act},
              {"matrices", mlp.kind == FfnKind::Gated ? 3 : 2},
              {"bias", mlp.bias},
              {"intermediate_size", ffn_width},
              {"ratio", static_cast<double>(ffn_width) / static_cast<double>(spec.hidden_size)}};

  json moe = nullptr;
  if (spec.moe.enabled) {
    const auto& m = spec.moe;
    int64_t moe_layers = std::count(m.moe_layer.begin(), m.moe_layer.end(), true);
    moe = {{"num_experts", m.num_experts},
           {"experts_per_token", m.experts_per_token},
           {"num_shared_experts", m.num_shared_experts},
           {"expert_intermediate_size", m.expert_intermediate_size},
           {"expert_ratio", static_cast<double>(m.expert_intermediate_size) / static_cast<double>(spec.hidden_size)},
           {"shared_intermediate_size", m.shared_intermediate_size},
           {"moe_layers", moe_layers},
           {"dense_layers", spec.num_layers - moe_layers},
           {"first_k_dense", m.first_k_dense},
           // DeepSeek-V2's greedy topk_method is the grouped router with one group.
           {"router", m.router == RouterKind::SoftmaxGrouped && m.n_group == 1 ? std::string("softmax, greedy top-k")
                                                                               : std::string(to_string(m.router))},
           {"norm_topk_prob", m.norm_topk_prob},
           {"clamped_swiglu", m.gpt_oss_experts ? json({{"limit", m.swiglu_limit}, {"alpha", m.swiglu_alpha}}) : json(nullptr)},
           {"routed_scaling_factor", m.routed_scaling_factor},
           {"n_group", m.n_group},
           {"topk_group", m.topk_group},
           {"score_correction_bias", m.score_correction_bias}};
  }

  json arch = {{"hidden_size", spec.hidden_size},
               {"num_hidden_layers", spec.num_layers},
               {"vocab_size", spec.vocab_size},
               {"context_length", spec.max_position_embeddings},
               {"norm", {{"type", to_string(spec.norm)},
                         {"eps", spec.norm_eps},
                         // Gemma: y = x_hat * (1 + w), w stored (and initialized) around 0.
                         {"form", spec.norm_unit_offset ? "x_hat*(1+w)" : spec.norm == NormKind::LayerNorm
                                                                            ? "(x-mean)/std*w+b"
                                                                            : "x_hat*w"},
                         {"weight_decay", spec.norm_weight_decay},
                         {"placement", to_string(spec.placement)},
                         {"final_norm", spec.has_final_norm()}}},
               {"ffn", ffn},
               {"attention", attention},
               {"moe", moe},
               {"tie_word_embeddings", spec.tie_word_embeddings},
               {"mtp_layers", spec.mtp_layers},
               {"initializer_range", spec.initializer_range},
               {"z_loss", spec.z_loss},
               {"final_softcap", spec.final_softcap > 0 ? json(spec.final_softcap) : json(nullptr)},
               {"final_logit_softcapping", spec.final_softcap > 0 ? json(spec.final_softcap) : json(nullptr)},
               {"embed_scale", spec.embed_scale},
               {"embed_scale_is_sqrt_hidden",
                spec.embed_scale != 1.0 &&
                    std::abs(spec.embed_scale - std::sqrt(static_cast<double>(spec.hidden_size))) < 1e-9}};

  const auto& p = acc.params;
  json params = {{"total", p.total},
                 {"active", p.active},
                 {"non_embedding", p.non_embedding},
                 {"mtp", p.mtp},
                 {"muon", p.muon},
                 {"adamw", p.adamw},
                 {"matmul_active", p.matmul_active},
                 {"tensors", p.tensors},
                 {"by_component", components_json(p.by_component, true)},
                 {"active_by_component", components_json(p.active_by_component, false)}};

  json memory = {{"fp32", memory_json(acc.fp32, false)},
                 {"bf16_mixed", memory_json(acc.bf16_mixed, true)},
                 {"kv_cache_bytes_per_token_bf16", acc.kv_cache_bytes_per_token_bf16},
                 {"notes", "bytes; gradients fp32 in both modes; Muon keeps one fp32 momentum per Muon "
                           "matrix element and AdamW's two moments for everything else; MTP excluded"}};

  const auto& f = acc.flops;
  json flops = {{"seq", f.seq},
                {"per_token_training", f.training()},
                {"per_token_training_causal", f.training_causal()},
                {"matmul", f.matmul},
                {"attention", f.attention},
                {"attention_causal", f.attention_causal},
                {"formula", "6 * matmul_active + 6 * layers * seq * heads * (qk_head_dim + v_head_dim); "
                            "causal variant uses (seq + 1) / 2 keys per query; a sliding-window layer counts at most window keys"}};

  return {{"file", spec.source},
          {"model_type", spec.model_type},
          {"family", to_string(spec.family)},
          {"hf_architecture", row.hf_architecture},
          // "gemma3": the multimodal config whose text_config this is; its vision tower is not counted.
          {"read_from", spec.wrapper_model_type.empty() ? json(nullptr)
                                                        : json(spec.wrapper_model_type + " text_config")},
          {"architecture", arch},
          {"params", params},
          {"memory", memory},
          {"flops", flops}};
}

}  // namespace keel::arch
