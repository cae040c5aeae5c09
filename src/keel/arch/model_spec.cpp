#include "keel/arch/model_spec.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "keel/arch/config_reader.hpp"
#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"

namespace keel::arch {

std::string_view to_string(Family f) {
  switch (f) {
    case Family::Gpt2: return "gpt2";
    case Family::Llama: return "llama";
    case Family::Mistral: return "mistral";
    case Family::Qwen2: return "qwen2";
    case Family::Qwen3: return "qwen3";
    case Family::Qwen3Moe: return "qwen3_moe";
    case Family::Qwen3Next: return "qwen3_next";
    case Family::Mixtral: return "mixtral";
    case Family::GptOss: return "gpt_oss";
    case Family::DeepseekV2: return "deepseek_v2";
    case Family::DeepseekV3: return "deepseek_v3";
    case Family::KimiK2: return "kimi_k2";
    case Family::Glm4Moe: return "glm4_moe";
    case Family::Olmo2: return "olmo2";
    case Family::Gemma2: return "gemma2";
    case Family::Gemma3Text: return "gemma3_text";
  }
  return "?";
}
std::string_view to_string(NormKind k) {
  switch (k) {
    case NormKind::RmsNorm: return "RMSNorm";
    case NormKind::LayerNorm: return "LayerNorm";
  }
  return "?";
}
std::string_view to_string(NormPlacement p) {
  switch (p) {
    case NormPlacement::Pre: return "pre";
    case NormPlacement::Post: return "post";
    case NormPlacement::Sandwich: return "sandwich";
    case NormPlacement::PostSublayer: return "post_sublayer";
  }
  return "?";
}
std::string_view to_string(Activation a) {
  switch (a) {
    case Activation::Silu: return "silu";
    case Activation::Gelu: return "gelu";
    case Activation::GeluTanh: return "gelu_tanh";
    case Activation::Relu: return "relu";
  }
  return "?";
}
std::string_view to_string(FfnKind k) {
  switch (k) {
    case FfnKind::Gated: return "gated";
    case FfnKind::Plain: return "plain";
  }
  return "?";
}
std::string_view to_string(AttentionKind k) {
  switch (k) {
    case AttentionKind::Mha: return "MHA";
    case AttentionKind::Gqa: return "GQA";
    case AttentionKind::Mqa: return "MQA";
    case AttentionKind::Mla: return "MLA";
  }
  return "?";
}
std::string_view to_string(RouterKind k) {
  switch (k) {
    case RouterKind::SoftmaxTopK: return "softmax top-k";
    case RouterKind::SigmoidGrouped: return "sigmoid, group-limited top-k, bias-corrected selection";
    case RouterKind::SoftmaxGrouped: return "softmax, group-limited greedy top-k";
  }
  return "?";
}

std::string ffn_display_name(FfnKind kind, Activation act) {
  if (kind == FfnKind::Gated) {
    switch (act) {
      case Activation::Silu: return "SwiGLU";
      case Activation::Gelu: return "GeGLU";
      case Activation::GeluTanh: return "GeGLU (tanh)";
      case Activation::Relu: return "ReGLU";
    }
  }
  switch (act) {
    case Activation::Silu: return "SiLU MLP";
    case Activation::Gelu: return "GELU MLP";
    case Activation::GeluTanh: return "GELU MLP (tanh)";
    case Activation::Relu: return "ReLU MLP";
  }
  return "?";
}

namespace {

Activation parse_activation(const ConfigReader& r, const std::string& field, const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::Silu;
  if (name == "gelu") return Activation::Gelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return Activation::GeluTanh;
  if (name == "relu") return Activation::Relu;
  r.fail(field, "unknown activation '" + name +
                    "'; supported: silu, swish, gelu, gelu_new, gelu_pytorch_tanh, relu");
}

// The optional "keel" object: variants beyond the HF families (transformers ignores it).
void apply_keel_extensions(const nlohmann::json& config, const std::string& source, ModelSpec& spec,
                           const FamilyRow& row) {
  auto it = config.find("keel");
  if (it == config.end() || it->is_null()) return;
  if (!it->is_object()) throw Error(source, "keel", "expected an object, got a " + std::string(it->type_name()));
  static const std::set<std::string> known = {"norm",         "norm_placement", "qk_norm",       "qkv_bias", "z_loss",
                                              "attn_softcap", "final_softcap",  "mla_latent_norms", "mlp",
                                              "embed_scale",  "attn_sinks",     "attn_output_gate"};
  for (const auto& [key, value] : it->items()) {
    if (!known.contains(key)) {
      throw Error(source, "keel." + key,
                  "unknown key; supported: norm, norm_placement, qk_norm, qkv_bias, z_loss, "
                  "attn_softcap, final_softcap, mla_latent_norms, mlp, embed_scale, attn_sinks, "
                  "attn_output_gate");
    }
  }
  ConfigReader r(*it, source, "keel.");
  if (r.has("norm")) {
    auto norm = r.optional_string("norm", "");
    if (norm == "rmsnorm") spec.norm = NormKind::RmsNorm;
    else if (norm == "layernorm") spec.norm = NormKind::LayerNorm;
    else if (norm == "rmsnorm_1p") {
      if (row.mla) r.fail("norm", "rmsnorm_1p is not available for MLA families (their latent norms stay x_hat*w)");
      // Qwen3-Next's zero-centred RMSNorm: x̂·(1 + w), w from 0, with weight decay.
      spec.norm = NormKind::RmsNorm;
      spec.norm_unit_offset = true;
      spec.norm_weight_decay = true;
    } else {
      r.fail("norm", "unknown norm '" + norm + "'; supported: rmsnorm, layernorm, rmsnorm_1p");
    }
    if (spec.norm_unit_offset && spec.norm != NormKind::RmsNorm) {
      r.fail("norm", std::string(row.model_type) + "'s norms are (1 + w) RMSNorms; LayerNorm is not available");
    }
  }
  if (r.has("norm_placement")) {
    auto p = r.optional_string("norm_placement", "");
    if (p == "pre") spec.placement = NormPlacement::Pre;
    else if (p == "post") spec.placement = NormPlacement::Post;
    else if (p == "sandwich") spec.placement = NormPlacement::Sandwich;
    else if (p == "post_sublayer") spec.placement = NormPlacement::PostSublayer;
    else r.fail("norm_placement", "unknown placement '" + p + "'; supported: pre, post, sandwich, post_sublayer");
    if (row.gpt2_fields && spec.placement != NormPlacement::Pre) {
      r.fail("norm_placement", "gpt2 supports only 'pre' (its HF names have no post-norm slots)");
    }
  }
  if (r.has("qk_norm")) {
    // true / false, or the width: "per_head" (Qwen3) or "full_width" (OLMo 2).
    if (it->at("qk_norm").is_string()) {
      const auto width = r.optional_string("qk_norm", "");
      if (width != "per_head" && width != "full_width") {
        r.fail("qk_norm", "expected true, false, \"per_head\" or \"full_width\", got \"" + width + "\"");
      }
      spec.attention.qk_norm = true;
      spec.attention.qk_norm_full_width = width == "full_width";
    } else {
      spec.attention.qk_norm = r.optional_bool("qk_norm", false);
    }
    if (spec.attention.qk_norm && (row.mla || row.gpt2_fields)) {
      r.fail("qk_norm", "QK-Norm is not available for " + std::string(row.model_type));
    }
  }
  if (r.has("qkv_bias")) {
    spec.attention.qkv_bias = r.optional_bool("qkv_bias", false);
    if (row.mla || row.gpt2_fields) r.fail("qkv_bias", "not available for " + std::string(row.model_type));
  }
  if (r.has("mla_latent_norms")) {
    spec.attention.mla_latent_norms = r.optional_bool("mla_latent_norms", true);
    if (!row.mla) r.fail("mla_latent_norms", "only MLA families (deepseek_v3, kimi_k2) have latent norms");
  }
  if (r.has("mlp")) {
    // "plain": up_proj → activation → down_proj (the pre-GLU MLP, e.g. GELU at 4×), for
    // comparing FFN kinds inside one family; "gated" is the family's own GLU.
    auto kind = r.optional_string("mlp", "");
    if (kind == "plain") spec.mlp.kind = FfnKind::Plain;
    else if (kind == "gated") spec.mlp.kind = FfnKind::Gated;
    else r.fail("mlp", "unknown MLP kind '" + kind + "'; supported: gated, plain");
    if (row.gpt2_fields && spec.mlp.kind != FfnKind::Plain) r.fail("mlp", "gpt2's MLP is plain only");
    if (row.moe != MoeLayout::Dense && spec.mlp.kind == FfnKind::Plain) {
      r.fail("mlp", "MoE families keep gated MLPs (their experts are GLUs)");
    }
  }
  for (const char* key : {"attn_sinks", "attn_output_gate"}) {
    if (!r.has(key)) continue;
    const bool on = r.optional_bool(key, false);
    if (on && (row.mla || row.gpt2_fields)) {
      r.fail(key, std::string("not available for ") + std::string(row.model_type) +
                      " (its attention is not the separate q/k/v/o projections these extend)");
    }
    (std::string_view(key) == "attn_sinks" ? spec.attention.sinks : spec.attention.output_gate) = on;
  }
  spec.z_loss = r.optional_number("z_loss", 0.0, 0.0, 1e3);
  // The family's own caps (Gemma 2) stay unless the keel object sets others.
  spec.attention.softcap = r.optional_number("attn_softcap", spec.attention.softcap, 0.0, 1e6);
  spec.final_softcap = r.optional_number("final_softcap", spec.final_softcap, 0.0, 1e6);
  if (r.has("embed_scale")) {
    // Vaswani et al. 2017 (§3.4) and Gemma multiply the embeddings by sqrt(hidden_size), so that
    // a 0.02-scale table enters the first block at unit scale; "sqrt_hidden" names that choice.
    if (it->at("embed_scale").is_string()) {
      const auto name = r.optional_string("embed_scale", "");
      if (name != "sqrt_hidden") r.fail("embed_scale", "expected a number or \"sqrt_hidden\", got \"" + name + "\"");
      spec.embed_scale = std::sqrt(static_cast<double>(spec.hidden_size));
    } else {
      spec.embed_scale = r.optional_number("embed_scale", 1.0, 0.0, 1e4, /*min_exclusive=*/true);
    }
  }
}

// DeepSeek-V2's gate (HF DeepseekV2Moe.route_tokens_to_experts; DeepSeek-V2 §2.2): softmax
// scores, and topk_method either "greedy" (plain top-k, groups ignored) or
// "group_limited_greedy" (keep the topk_group groups whose best expert scores highest).
void parse_deepseek_v2_routing(const ConfigReader& r, MoeSpec& moe) {
  const std::string scoring = r.optional_string("scoring_func", "softmax");
  if (scoring != "softmax") r.fail("scoring_func", "deepseek_v2 routes with softmax scores, got '" + scoring + "'");
  const std::string method = r.optional_string("topk_method", "greedy");
  if (method == "greedy") {
    moe.n_group = moe.topk_group = 1;
  } else if (method != "group_limited_greedy") {
    r.fail("topk_method", "unknown method '" + method + "'; deepseek_v2 supports greedy, group_limited_greedy");
  }
  // transformers' DeepseekV2Moe ignores norm_topk_prob and always scales; DeepSeek's own
  // MoEGate renormalizes instead of scaling when it is true. Every released V2 config sets false.
  if (moe.norm_topk_prob) {
    r.fail("norm_topk_prob", "true is not supported for deepseek_v2 (transformers ignores it, DeepSeek's code "
                             "renormalizes without scaling; released configs set false)");
  }
}

// Qwen3-Next (Qwen3NextConfig defaults): gated attention and zero-centred, weight-decayed norms
// on every layer; Gated DeltaNet on the layers layer_types calls "linear_attention", by default
// all but every full_attention_interval-th (Qwen3NextConfig: "linear_attention" if (i + 1) %
// interval else "full_attention").
void parse_qwen3_next_fields(const ConfigReader& r, ModelSpec& spec) {
  spec.attention.output_gate = true;
  spec.norm_unit_offset = true;
  spec.norm_weight_decay = true;
  LinearAttentionSpec& la = spec.linear_attention;
  la.num_key_heads = r.optional_int("linear_num_key_heads", 16, 1, kMaxDim);
  la.num_value_heads = r.optional_int("linear_num_value_heads", 32, 1, kMaxDim);
  la.key_head_dim = r.optional_int("linear_key_head_dim", 128, 1, kMaxDim);
  la.value_head_dim = r.optional_int("linear_value_head_dim", 128, 1, kMaxDim);
  la.conv_kernel = r.optional_int("linear_conv_kernel_dim", 4, 1, 1024);
  if (la.num_value_heads % la.num_key_heads != 0) {
    r.fail("linear_num_value_heads", "(" + std::to_string(la.num_value_heads) + ") must be a multiple of linear_num_key_heads (" +
                                         std::to_string(la.num_key_heads) + ")");
  }
  const int64_t layers = spec.num_layers;
  spec.linear_attention_layer.assign(static_cast<size_t>(layers), false);
  if (!r.has("layer_types")) {
    const int64_t interval = r.optional_int("full_attention_interval", 4, 1, kMaxLayers);
    for (int64_t l = 0; l < layers; ++l) spec.linear_attention_layer[static_cast<size_t>(l)] = (l + 1) % interval != 0;
    return;
  }
  const auto& list = r.object().at("layer_types");
  if (!list.is_array()) r.fail("layer_types", "expected a list with one entry per layer");
  if (static_cast<int64_t>(list.size()) != layers) {
    r.fail("layer_types", "has " + std::to_string(list.size()) + " entries but num_hidden_layers is " + std::to_string(layers));
  }
  for (int64_t l = 0; l < layers; ++l) {
    const auto& v = list[static_cast<size_t>(l)];
    const std::string type = v.is_string() ? v.get<std::string>() : v.dump();
    if (type != "linear_attention" && type != "full_attention") {
      r.fail("layer_types", "entry " + std::to_string(l) + " is '" + type + "'; supported: linear_attention, full_attention");
    }
    spec.linear_attention_layer[static_cast<size_t>(l)] = type == "linear_attention";
  }
}

void parse_moe(const ConfigReader& r, const FamilyRow& row, ModelSpec& spec) {
  MoeSpec& moe = spec.moe;
  moe.router = row.router;
  moe.moe_layer.assign(static_cast<size_t>(spec.num_layers), false);
  switch (row.moe) {
    case MoeLayout::Dense:
      return;
    case MoeLayout::Mixtral: {
      moe.enabled = true;
      moe.num_experts = r.required_int("num_local_experts", 1, kMaxExperts);
      moe.experts_per_token = r.required_int("num_experts_per_tok", 1, kMaxExperts);
      moe.expert_intermediate_size = spec.mlp.intermediate_size;
      moe.norm_topk_prob = true;  // Mixtral renormalizes the top-k softmax weights
      std::fill(moe.moe_layer.begin(), moe.moe_layer.end(), true);
      break;
    }
    case MoeLayout::GptOss: {
      // GptOssConfig: every layer routed; the experts' width is intermediate_size. HF reads
      // num_experts_per_tok (released configs also carry experts_per_token, which it ignores).
      moe.enabled = true;
      moe.gpt_oss_experts = true;
      moe.num_experts = r.required_int("num_local_experts", 1, kMaxExperts);
      moe.experts_per_token = r.required_int("num_experts_per_tok", 1, kMaxExperts);
      moe.expert_intermediate_size = spec.mlp.intermediate_size;
      moe.norm_topk_prob = true;  // softmax over the k chosen logits = the renormalized top-k softmax
      moe.swiglu_limit = r.optional_number("swiglu_limit", 7.0, 0.0, 1e6, true);
      moe.swiglu_alpha = r.optional_number("swiglu_alpha", 1.702, 0.0, 1e6, true);
      std::fill(moe.moe_layer.begin(), moe.moe_layer.end(), true);
      break;
    }
    case MoeLayout::Qwen3Next:
    case MoeLayout::Qwen3Moe: {
      moe.num_experts = r.optional_int("num_experts", 0, 0, kMaxExperts);
      moe.enabled = moe.num_experts > 0;
      if (!moe.enabled) return;
      moe.experts_per_token = r.required_int("num_experts_per_tok", 1, kMaxExperts);
      moe.expert_intermediate_size = r.required_int("moe_intermediate_size", 1, kMaxDim);
      moe.norm_topk_prob = r.optional_bool("norm_topk_prob", row.moe == MoeLayout::Qwen3Next);
      if (row.moe == MoeLayout::Qwen3Next) {
        // Qwen3NextSparseMoeBlock: one shared expert, its output times σ(shared_expert_gate(x)).
        moe.shared_intermediate_size = r.optional_int("shared_expert_intermediate_size", 512, 0, kMaxDim);
        moe.num_shared_experts = moe.shared_intermediate_size > 0 ? 1 : 0;
        moe.shared_expert_gate = moe.num_shared_experts > 0;
      }
      int64_t step = r.optional_int("decoder_sparse_step", 1, 1, kMaxLayers);
      std::set<int64_t> dense_only;
      if (r.has("mlp_only_layers")) {
        const auto& list = r.object().at("mlp_only_layers");
        if (!list.is_array()) r.fail("mlp_only_layers", "expected a list of layer indices");
        for (const auto& v : list) {
          if (!v.is_number_integer()) r.fail("mlp_only_layers", "expected integer layer indices, got " + v.dump());
          dense_only.insert(v.get<int64_t>());
        }
      }
      // HF Qwen3MoeDecoderLayer: sparse unless listed in mlp_only_layers, every step-th layer.
      for (int64_t l = 0; l < spec.num_layers; ++l) {
        moe.moe_layer[static_cast<size_t>(l)] = !dense_only.contains(l) && (l + 1) % step == 0;
      }
      break;
    }
    case MoeLayout::DeepseekV3: {
      moe.num_experts = r.optional_int("n_routed_experts", 0, 0, kMaxExperts);
      moe.enabled = moe.num_experts > 0;
      if (!moe.enabled) return;
      moe.experts_per_token = r.required_int("num_experts_per_tok", 1, kMaxExperts);
      moe.expert_intermediate_size = r.required_int("moe_intermediate_size", 1, kMaxDim);
      moe.num_shared_experts = r.optional_int("n_shared_experts", 1, 0, 1024);
      moe.shared_intermediate_size = moe.expert_intermediate_size * moe.num_shared_experts;
      const bool v2 = row.router == RouterKind::SoftmaxGrouped;
      moe.norm_topk_prob = r.optional_bool("norm_topk_prob", !v2);  // DeepseekV2Config: false
      const RouterDefaults& d = row.router_defaults;
      moe.routed_scaling_factor = r.optional_number("routed_scaling_factor", d.routed_scaling_factor, 0.0, 1e6, true);
      moe.n_group = r.optional_int("n_group", d.n_group, 1, kMaxExperts);
      moe.topk_group = r.optional_int("topk_group", d.topk_group, 1, kMaxExperts);
      moe.first_k_dense = r.optional_int("first_k_dense_replace", d.first_k_dense_replace, 0, kMaxLayers);
      int64_t freq = r.optional_int("moe_layer_freq", 1, 1, kMaxLayers);
      // HF's DeepSeek-V3 router always holds e_score_correction_bias (topk_method noaux_tc);
      // DeepSeek-V2's gate has none.
      moe.score_correction_bias = !v2;
      if (v2) parse_deepseek_v2_routing(r, moe);
      if (moe.num_experts % moe.n_group != 0) {
        r.fail("n_group", "n_routed_experts (" + std::to_string(moe.num_experts) +
                              ") must be divisible by n_group (" + std::to_string(moe.n_group) + ")");
      }
      if (moe.topk_group > moe.n_group) {
        r.fail("topk_group", "must not exceed n_group (" + std::to_string(moe.n_group) + ")");
      }
      if (moe.experts_per_token > moe.topk_group * (moe.num_experts / moe.n_group)) {
        r.fail("num_experts_per_tok", "exceeds the experts reachable in topk_group groups");
      }
      for (int64_t l = 0; l < spec.num_layers; ++l) {
        moe.moe_layer[static_cast<size_t>(l)] = l >= moe.first_k_dense && l % freq == 0;
      }
      break;
    }
  }
  if (moe.experts_per_token > moe.num_experts) {
    r.fail("num_experts_per_tok", "(" + std::to_string(moe.experts_per_token) +
                                      ") exceeds the number of experts (" + std::to_string(moe.num_experts) + ")");
  }
}

ModelSpec spec_from_gpt2(const ConfigReader& r, const FamilyRow& row) {
  ModelSpec spec;
  spec.hidden_size = r.required_int("n_embd", 1, kMaxDim);
  spec.num_layers = r.required_int("n_layer", 1, kMaxLayers);
  spec.vocab_size = r.required_int("vocab_size", 1, kMaxDim);
  spec.max_position_embeddings = r.optional_int("n_positions", 1024, 1, kMaxDim);
  spec.norm = NormKind::LayerNorm;
  spec.norm_eps = r.optional_number("layer_norm_epsilon", row.default_norm_eps, 0.0, 1.0, true);
  auto& a = spec.attention;
  a.num_heads = r.required_int("n_head", 1, kMaxDim);
  a.num_kv_heads = a.num_heads;
  if (spec.hidden_size % a.num_heads != 0) {
    r.fail("n_head", "n_embd (" + std::to_string(spec.hidden_size) + ") is not divisible by n_head (" +
                         std::to_string(a.num_heads) + ")");
  }
  a.head_dim = spec.hidden_size / a.num_heads;
  a.kind = AttentionKind::Mha;
  a.qkv_bias = a.o_bias = true;
  a.learned_positions = true;
  a.rope.rotary_dim = 0;
  a.rope.partial_rotary_factor = 0.0;
  // GPT2Attention's switches keel does not implement are refused, not ignored: each changes the
  // logits (modeling_gpt2.py: divide by sqrt(head_dim) only if scale_attn_weights, and by
  // layer_idx + 1 if scale_attn_by_inverse_layer_idx).
  if (!r.optional_bool("scale_attn_weights", true)) {
    r.fail("scale_attn_weights", "false (unscaled attention logits) is not supported; keel divides by sqrt(head_dim)");
  }
  if (r.optional_bool("scale_attn_by_inverse_layer_idx", false)) {
    r.fail("scale_attn_by_inverse_layer_idx", "true is not supported (keel does not scale logits by 1 / (layer + 1))");
  }
  if (r.optional_bool("add_cross_attention", false)) {
    r.fail("add_cross_attention", "true is not supported: keel builds decoder-only models");
  }
  auto act = r.optional_string("activation_function", "gelu_new");
  spec.mlp.kind = FfnKind::Plain;
  spec.mlp.hidden_act = act;
  spec.mlp.activation = parse_activation(r, "activation_function", act);
  spec.mlp.intermediate_size = r.optional_int("n_inner", 4 * spec.hidden_size, 1, kMaxDim);
  spec.mlp.bias = true;
  return spec;
}

// A soft-cap field: absent -> the default, null -> off (HF: `if config.x is not None`).
double optional_cap(const ConfigReader& r, const std::string& field, double fallback) {
  if (r.object().contains(field) && r.object().at(field).is_null()) return 0.0;
  return r.optional_number(field, fallback, 0.0, 1e6, /*min_exclusive=*/true);
}

// sliding_window: absent -> the class's default, null -> no window (0), else a positive length.
int64_t optional_window(const ConfigReader& r, int64_t fallback) {
  if (r.object().contains("sliding_window") && r.object().at("sliding_window").is_null()) return 0;
  return r.optional_int("sliding_window", fallback, 1, kMaxPositions);
}

// Which layers use the sliding window: `layer_types` when given ("sliding_attention" or
// "full_attention" per layer), else Gemma 2's rule: even layer indices slide (Gemma2Config:
// "sliding_attention" if (i + 1) % 2 else "full_attention").
void parse_layer_types(const ConfigReader& r, ModelSpec& spec, int64_t pattern) {
  const int64_t layers = spec.num_layers;
  if (!r.has("layer_types")) {
    for (int64_t l = 0; l < layers; ++l) spec.sliding_layer[static_cast<size_t>(l)] = (l + 1) % pattern != 0;
    return;
  }
  const auto& list = r.object().at("layer_types");
  if (!list.is_array()) r.fail("layer_types", "expected a list with one entry per layer");
  if (static_cast<int64_t>(list.size()) != layers) {
    r.fail("layer_types", "has " + std::to_string(list.size()) + " entries but num_hidden_layers is " +
                              std::to_string(layers));
  }
  for (int64_t l = 0; l < layers; ++l) {
    const auto& v = list[static_cast<size_t>(l)];
    const std::string type = v.is_string() ? v.get<std::string>() : v.dump();
    if (type != "sliding_attention" && type != "full_attention") {
      r.fail("layer_types", "entry " + std::to_string(l) + " is '" + type +
                                "'; supported: sliding_attention, full_attention");
    }
    spec.sliding_layer[static_cast<size_t>(l)] = type == "sliding_attention";
  }
}

// The Gemma fixtures (Gemma2Config / Gemma3TextConfig defaults in the fallbacks): (1 + w) norms,
// embeddings times √hidden (the models' normalizer), query_pre_attn_scalar, the soft-caps (on by
// default in Gemma 2, off in Gemma 3), sliding windows (every other layer in Gemma 2, five of
// every six in Gemma 3), and Gemma 3's local RoPE base.
void parse_gemma_fields(const ConfigReader& r, ModelSpec& spec) {
  auto& a = spec.attention;
  const bool gemma3 = spec.family == Family::Gemma3Text;
  spec.norm_unit_offset = true;
  spec.embed_scale = std::sqrt(static_cast<double>(spec.hidden_size));
  a.query_pre_attn_scalar = r.optional_number("query_pre_attn_scalar", 256.0, 0.0, 1e9, /*min_exclusive=*/true);
  a.softcap = gemma3 && !r.has("attn_logit_softcapping") ? 0.0 : optional_cap(r, "attn_logit_softcapping", 50.0);
  spec.final_softcap =
      gemma3 && !r.has("final_logit_softcapping") ? 0.0 : optional_cap(r, "final_logit_softcapping", 30.0);
  a.sliding_window = optional_window(r, 4096);
  // Only a window the config states: Gemma2Config's default of 4096 on a small test context just
  // means that every position is in the window.
  if (r.has("sliding_window") && a.sliding_window > spec.max_position_embeddings) {
    r.fail("sliding_window", std::to_string(a.sliding_window) + " exceeds max_position_embeddings (" +
                                 std::to_string(spec.max_position_embeddings) + "): no layer could be local");
  }
  // Gemma3TextConfig: layer i is local unless (i + 1) % sliding_window_pattern == 0 (default 6).
  const int64_t pattern = gemma3 ? r.optional_int("sliding_window_pattern", 6, 1, kMaxLayers) : 2;
  parse_layer_types(r, spec, pattern);
  if (gemma3) a.rope.local_theta = r.optional_number("rope_local_base_freq", 10000.0, 0.0, 1e15, true);
}

// Sliding windows of the Llama-style families that have them (Gemma's are parse_gemma_fields'):
// MistralAttention uses config.sliding_window on every layer (MistralConfig default 4096; null is
// full attention); Mixtral the same with a default of none; Qwen2/Qwen3 only when
// use_sliding_window is true, on the layers from max_window_layers on (default 28) unless
// layer_types lists them (Qwen2Config: sliding_window is forced to None otherwise); Qwen3-MoE
// with use_sliding_window on every layer (Qwen3MoeAttention reads config.sliding_window alone).
void parse_decoder_window(const ConfigReader& r, ModelSpec& spec) {
  auto& a = spec.attention;
  switch (spec.family) {
    case Family::Mistral:
    case Family::Mixtral:
      a.sliding_window = optional_window(r, spec.family == Family::Mistral ? 4096 : 0);
      std::fill(spec.sliding_layer.begin(), spec.sliding_layer.end(), a.sliding_window > 0);
      return;
    case Family::Qwen2:
    case Family::Qwen3:
    case Family::Qwen3Moe: {
      if (!r.optional_bool("use_sliding_window", false)) return;
      a.sliding_window = optional_window(r, 4096);
      if (a.sliding_window == 0) return;
      if (spec.family == Family::Qwen3Moe) {
        std::fill(spec.sliding_layer.begin(), spec.sliding_layer.end(), true);
        return;
      }
      if (r.has("layer_types")) {
        parse_layer_types(r, spec, 1);
        return;
      }
      const int64_t first = r.optional_int("max_window_layers", 28, 0, kMaxLayers);
      for (int64_t l = 0; l < spec.num_layers; ++l) spec.sliding_layer[static_cast<size_t>(l)] = l >= first;
      return;
    }
    case Family::GptOss:
      // GptOssConfig: sliding_window 128 on layer_types' sliding layers, by default the even ones.
      a.sliding_window = optional_window(r, 128);
      parse_layer_types(r, spec, 2);
      return;
    default:
      return;
  }
}

// Gemma3TextConfig's defaults, which real configs rely on (gemma-3-4b's text_config sets only
// five fields): filled in where the config is silent, as transformers does.
nlohmann::json with_gemma3_defaults(nlohmann::json c) {
  static const nlohmann::json defaults = {
      {"vocab_size", 262208},       {"hidden_size", 2304},          {"intermediate_size", 9216},
      {"num_hidden_layers", 26},    {"num_attention_heads", 8},     {"num_key_value_heads", 4},
      {"head_dim", 256},            {"max_position_embeddings", 131072}, {"rope_theta", 1000000.0},
      {"rms_norm_eps", 1e-6},       {"hidden_activation", "gelu_pytorch_tanh"}};
  for (const auto& [key, value] : defaults.items()) {
    if (!c.contains(key)) c[key] = value;
  }
  return c;
}

ModelSpec spec_from_decoder(const ConfigReader& r, const FamilyRow& row) {
  ModelSpec spec;
  spec.hidden_size = r.required_int("hidden_size", 1, kMaxDim);
  spec.num_layers = r.required_int("num_hidden_layers", 1, kMaxLayers);
  spec.vocab_size = r.required_int("vocab_size", 1, kMaxDim);
  spec.max_position_embeddings = r.optional_int("max_position_embeddings", 4096, 1, kMaxPositions);
  spec.norm = NormKind::RmsNorm;
  spec.norm_eps = r.optional_number("rms_norm_eps", row.default_norm_eps, 0.0, 1.0, true);

  // Gemma's MLP reads `hidden_activation` (Gemma2MLP: ACT2FN[config.hidden_activation]); its
  // config.json also carries a `hidden_act` that the modeling code ignores.
  const char* act_field = row.gemma_fields ? "hidden_activation" : "hidden_act";
  auto act = r.optional_string(act_field, row.gemma_fields ? "gelu_pytorch_tanh" : "silu");
  spec.mlp.kind = FfnKind::Gated;
  spec.mlp.hidden_act = act;
  spec.mlp.activation = parse_activation(r, act_field, act);
  spec.mlp.intermediate_size = r.required_int("intermediate_size", 1, kMaxDim);
  spec.mlp.bias = row.mlp_bias_field && r.optional_bool("mlp_bias", false);

  auto& a = spec.attention;
  a.num_heads = r.required_int("num_attention_heads", 1, kMaxDim);
  a.num_kv_heads = r.optional_int("num_key_value_heads", a.num_heads, 1, kMaxDim);
  a.rope.theta = r.optional_number("rope_theta", row.default_rope_theta, 0.0, 1e15, true);
  if (r.has("rope_scaling")) {
    const auto& s = r.object().at("rope_scaling");
    if (!s.is_object()) r.fail("rope_scaling", "expected an object or null");
    a.rope.scaling = s;
  }
  a.rope.partial_rotary_factor = r.optional_number("partial_rotary_factor", row.default_partial_rotary, 0.0, 1.0, true);

  bool attention_bias = r.optional_bool("attention_bias", row.default_attention_bias);
  switch (row.attention_bias) {
    case AttentionBiasRule::Gpt2: a.qkv_bias = a.o_bias = true; break;
    case AttentionBiasRule::None: break;
    case AttentionBiasRule::QkvAlways: a.qkv_bias = true; break;
    case AttentionBiasRule::QkvoFromConfig: a.qkv_bias = a.o_bias = attention_bias; break;
    case AttentionBiasRule::QkvFromConfig: a.qkv_bias = attention_bias; break;
    case AttentionBiasRule::MlaFromConfig: a.qkv_bias = a.o_bias = attention_bias; break;
  }
  a.qk_norm = row.qk_norm_always ||
              (!row.qk_norm_field.empty() && r.optional_bool(std::string(row.qk_norm_field), false));
  a.qk_norm_full_width = row.qk_norm_full_width;
  a.sinks = row.attention_sinks;

  if (row.mla) {
    a.kind = AttentionKind::Mla;
    a.q_lora_rank = r.optional_int("q_lora_rank", 0, 0, kMaxDim);
    a.kv_lora_rank = r.required_int("kv_lora_rank", 1, kMaxDim);
    a.qk_nope_head_dim = r.required_int("qk_nope_head_dim", 0, kMaxDim);
    a.qk_rope_head_dim = r.required_int("qk_rope_head_dim", 1, kMaxDim);
    a.v_head_dim = r.required_int("v_head_dim", 1, kMaxDim);
    if (a.qk_rope_head_dim % 2 != 0) r.fail("qk_rope_head_dim", "must be even for RoPE");
    a.head_dim = a.qk_nope_head_dim + a.qk_rope_head_dim;
    a.rope.rotary_dim = a.qk_rope_head_dim;
    a.rope.partial_rotary_factor = 1.0;
    // DeepSeek-V2 always rotates adjacent pairs (HF apply_rotary_emb, complex form), which is
    // V3's rope_interleave; V2's config has no such field.
    a.rope.interleave = row.family == Family::DeepseekV2 || r.optional_bool("rope_interleave", true);
    // Every head has its own k^C and v; kv heads are the query heads.
    a.num_kv_heads = a.num_heads;
  } else {
    if (r.has("head_dim")) {
      a.head_dim = r.required_int("head_dim", 1, kMaxDim);
    } else if (row.default_head_dim > 0) {
      a.head_dim = row.default_head_dim;
    } else {
      if (spec.hidden_size % a.num_heads != 0) {
        r.fail("num_attention_heads", "hidden_size (" + std::to_string(spec.hidden_size) +
                                          ") is not divisible by num_attention_heads (" +
                                          std::to_string(a.num_heads) + ") and head_dim is absent");
      }
      a.head_dim = spec.hidden_size / a.num_heads;
    }
    if (a.num_heads % a.num_kv_heads != 0) {
      r.fail("num_key_value_heads", "num_attention_heads (" + std::to_string(a.num_heads) +
                                        ") is not divisible by num_key_value_heads (" +
                                        std::to_string(a.num_kv_heads) + ")");
    }
    if (a.num_kv_heads == a.num_heads) a.kind = AttentionKind::Mha;
    else if (a.num_kv_heads == 1) a.kind = AttentionKind::Mqa;
    else a.kind = AttentionKind::Gqa;
    // HF: rotary dim = int(head_dim * partial_rotary_factor), rounded down to even.
    a.rope.rotary_dim = static_cast<int64_t>(static_cast<double>(a.head_dim) * a.rope.partial_rotary_factor);
    a.rope.rotary_dim -= a.rope.rotary_dim % 2;
    if (a.rope.rotary_dim == 0) r.fail("partial_rotary_factor", "leaves no dimension to rotate");
  }
  parse_moe(r, row, spec);
  // Qwen3-Next's checkpoints hold one MTP layer (mtp.*) that config.json does not mention; vLLM's
  // Qwen3NextMTP reads num_nextn_predict_layers with a default of 1.
  spec.mtp_layers = r.optional_int("num_nextn_predict_layers", row.moe == MoeLayout::Qwen3Next ? 1 : 0, 0, 64);
  spec.sliding_layer.assign(static_cast<size_t>(spec.num_layers), false);
  spec.family = row.family;
  if (row.gemma_fields) parse_gemma_fields(r, spec);
  if (row.family == Family::Qwen3Next) parse_qwen3_next_fields(r, spec);
  parse_decoder_window(r, spec);
  return spec;
}

}  // namespace

// transformers 5 writes RoPE as one `rope_parameters` object ({"rope_type", "rope_theta", "factor",
// ..., "partial_rotary_factor"}), or one per layer type for models with local layers (Gemma 3:
// {"full_attention": {...}, "sliding_attention": {...}}), instead of the top-level rope_theta,
// rope_scaling, partial_rotary_factor and rope_local_base_freq of 4.x. Rewritten here into the
// 4.x fields, so a config saved by either reads the same; the two spellings disagreeing is an error.
nlohmann::json with_rope_parameters_spelled_out(nlohmann::json body, const std::string& source,
                                                const std::string& prefix) {
  const auto it = body.find("rope_parameters");
  if (it == body.end() || it->is_null()) return body;
  const std::string field = prefix + "rope_parameters";
  if (!it->is_object()) throw Error(source, field, "expected an object or null");
  const nlohmann::json params = *it;
  auto set = [&](const std::string& key, const nlohmann::json& value, const std::string& from) {
    const auto old = body.find(key);
    if (old != body.end() && !old->is_null() && *old != value) {
      throw Error(source, prefix + from,
                  value.dump() + " disagrees with " + prefix + key + " " + old->dump() + " in the same config");
    }
    body[key] = value;
  };
  // One object per layer type, or one for all layers.
  const bool per_type = params.contains("full_attention") || params.contains("sliding_attention");
  const nlohmann::json global = per_type ? params.value("full_attention", nlohmann::json::object()) : params;
  const std::string global_field = per_type ? field + ".full_attention" : field;
  if (!global.is_object()) throw Error(source, global_field, "expected an object");
  if (global.contains("rope_theta")) set("rope_theta", global["rope_theta"], global_field.substr(prefix.size()) + ".rope_theta");
  if (global.contains("partial_rotary_factor")) {
    set("partial_rotary_factor", global["partial_rotary_factor"], global_field.substr(prefix.size()) + ".partial_rotary_factor");
  }
  const char* type_key = global.contains("rope_type") ? "rope_type" : "type";  // "type": the older spelling
  const std::string type = global.contains(type_key) && global[type_key].is_string()
                               ? global[type_key].get<std::string>()
                               : "default";
  if (type != "default") {
    nlohmann::json scaling = global;
    scaling.erase("rope_theta");
    scaling.erase("partial_rotary_factor");
    const auto old = body.find("rope_scaling");
    if (old != body.end() && !old->is_null()) {
      nlohmann::json old_scaling = *old;
      if (old_scaling.is_object()) {
        old_scaling.erase("rope_theta");
        old_scaling.erase("partial_rotary_factor");
      }
      if (old_scaling != scaling) {
        throw Error(source, global_field, scaling.dump() + " disagrees with " + prefix + "rope_scaling " +
                                              old->dump() + " in the same config");
      }
    }
    body["rope_scaling"] = scaling;
  }
  if (per_type && params.contains("sliding_attention")) {
    const nlohmann::json& local = params["sliding_attention"];
    if (!local.is_object()) throw Error(source, field + ".sliding_attention", "expected an object");
    if (local.contains("rope_type") && local["rope_type"] != "default") {
      throw Error(source, field + ".sliding_attention.rope_type", "keel rotates sliding-window layers without scaling");
    }
    if (local.contains("rope_theta")) {
      // Only Gemma 3 rotates its sliding layers with their own base; elsewhere a different one
      // would be silently dropped.
      const bool own_base = body.value("model_type", "") == "gemma3_text";
      if (!own_base && global.contains("rope_theta") && local["rope_theta"] != global["rope_theta"]) {
        throw Error(source, field + ".sliding_attention.rope_theta",
                    "differs from the full-attention layers' base; only gemma3_text gives sliding layers their own");
      }
      if (own_base) set("rope_local_base_freq", local["rope_theta"], "rope_parameters.sliding_attention.rope_theta");
    }
  }
  body.erase("rope_parameters");
  return body;
}

double attention_softmax_scale(const ModelSpec& spec) {
  const auto& a = spec.attention;
  if (a.kind != AttentionKind::Mla) return a.softmax_scale();
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.qk_nope_head_dim + a.qk_rope_head_dim));
  // scaling *= mscale² whenever rope_scaling sets mscale_all_dim (YaRN context extension,
  // "sqrt(t) = 0.1 ln s + 1"). Absent or 0: no change, which is the 4K pretraining setting.
  const auto& sc = a.rope.scaling;
  if (!sc.is_object() || !sc.contains("mscale_all_dim") || sc["mscale_all_dim"].is_null()) return scale;
  if (!sc["mscale_all_dim"].is_number()) throw Error(spec.source, "rope_scaling.mscale_all_dim", "must be a number");
  const double m = sc["mscale_all_dim"].get<double>();
  if (m == 0.0) return scale;
  if (!sc.contains("factor") || !sc["factor"].is_number()) {
    throw Error(spec.source, "rope_scaling.factor", "is required when mscale_all_dim is set");
  }
  const double factor = sc["factor"].get<double>();
  const double mscale = factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;  // YaRN's get_mscale
  return scale * mscale * mscale;
}

ModelSpec spec_from_config(const nlohmann::json& config, const std::string& source) {
  if (!config.is_object()) {
    throw Error(source, "", std::string("expected a JSON object at the top level, got ") +
                                (config.is_array() ? "an array" : std::string("a ") + config.type_name()));
  }
  ConfigReader top(config, source);
  auto it = config.find("model_type");
  if (it == config.end() || it->is_null()) top.fail("model_type", "is required but missing");
  if (!it->is_string()) top.fail("model_type", "expected a string, got " + it->dump());
  std::string model_type = it->get<std::string>();
  // Gemma 3's multimodal config (Gemma3ForConditionalGeneration) holds its language model in
  // text_config; keel reads that (the vision tower is not counted or trained).
  nlohmann::json body = config;
  std::string prefix, wrapper;
  if (model_type == "gemma3") {
    const auto tc = config.find("text_config");
    if (tc == config.end() || !tc->is_object()) {
      top.fail("text_config", tc == config.end() ? "missing: a gemma3 config holds its language model there"
                                                 : "expected an object (the language model's config)");
    }
    body = *tc;
    body["model_type"] = "gemma3_text";
    prefix = "text_config.";
    wrapper = model_type;
    model_type = "gemma3_text";
  }
  const FamilyRow* row = find_family(model_type);
  if (row == nullptr) {
    std::string list;
    for (const auto& name : supported_model_types()) list += (list.empty() ? "" : ", ") + name;
    top.fail("model_type", "unsupported model_type '" + model_type + "'; supported: " + list);
  }
  body = with_rope_parameters_spelled_out(std::move(body), source, prefix);
  if (row->family == Family::Gemma3Text) body = with_gemma3_defaults(std::move(body));
  ConfigReader r(body, source, prefix);
  ModelSpec spec = row->gpt2_fields ? spec_from_gpt2(r, *row) : spec_from_decoder(r, *row);
  spec.family = row->family;
  spec.model_type = model_type;
  spec.wrapper_model_type = wrapper;
  spec.source = source;
  spec.tie_word_embeddings = r.optional_bool("tie_word_embeddings", row->default_tie_embeddings);
  spec.initializer_range = r.optional_number("initializer_range", 0.02, 0.0, 10.0);
  spec.placement = row->placement;
  if (!spec.moe.enabled) spec.moe.moe_layer.assign(static_cast<size_t>(spec.num_layers), false);
  if (spec.sliding_layer.empty()) spec.sliding_layer.assign(static_cast<size_t>(spec.num_layers), false);
  apply_keel_extensions(config, source, spec, *row);
  return spec;
}

}  // namespace keel::arch
