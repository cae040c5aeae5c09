#include "keel/train/hf_export.hpp"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/data/tokenizer.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/train/model_source.hpp"
#include "keel/train/run_dir.hpp"

namespace keel::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json id_or_null(const std::optional<int32_t>& id) { return id ? json(*id) : json(nullptr); }

// Qwen2/Qwen3 window fields: use_sliding_window switches the window on for the layers that
// layer_types lists (max_window_layers, the 4.x default's rule, is the first of them); without a
// window, sliding_window stays null and every layer is full. Qwen3-MoE has no per-layer rule:
// the window covers every layer or none (checked by the read-back).
void qwen_window_fields(json& c, const arch::ModelSpec& spec, bool layer_types) {
  int64_t first_sliding = spec.num_layers;
  for (int64_t l = spec.num_layers - 1; l >= 0; --l) {
    if (spec.is_sliding_layer(l)) first_sliding = l;
  }
  const bool any = first_sliding < spec.num_layers;
  c["use_sliding_window"] = any;
  c["sliding_window"] = any ? json(spec.attention.sliding_window) : json(nullptr);
  if (!layer_types) return;
  c["max_window_layers"] = first_sliding;
  c["layer_types"] = json::array();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    c["layer_types"].push_back(spec.is_sliding_layer(l) ? "sliding_attention" : "full_attention");
  }
}

// What the HF class of a family fixes, and keel can vary ("keel" variants).
struct FamilyShape {
  arch::NormKind norm = arch::NormKind::RmsNorm;
  arch::FfnKind ffn = arch::FfnKind::Gated;
  bool partial_rotary = false;  // partial_rotary_factor is a config field (GLM-4.5)
};

FamilyShape family_shape(arch::Family f) {
  FamilyShape s;
  if (f == arch::Family::Gpt2) {
    s.norm = arch::NormKind::LayerNorm;
    s.ffn = arch::FfnKind::Plain;
  }
  s.partial_rotary = f == arch::Family::Glm4Moe;
  return s;
}

// The window each layer attends with (0: the whole context): what the model computes, whatever
// the spelling (a null window with Gemma's alternating layer pattern is no window at all).
std::vector<int64_t> effective_windows(const arch::ModelSpec& s) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < s.num_layers; ++l) out.push_back(s.is_sliding_layer(l) ? s.attention.sliding_window : 0);
  return out;
}

// The fields that decide what a model computes, compared one by one; the first that differs is
// named. Training-only fields (z_loss, initializer_range) and MTP modules (never trained here) are
// not compared.
std::optional<std::string> first_difference(const arch::ModelSpec& x, const arch::ModelSpec& y) {
  const auto& a = x.attention;
  const auto& b = y.attention;
  const auto& m = x.moe;
  const auto& n = y.moe;
  const std::vector<std::pair<const char*, bool>> same = {
      {"vocab_size", x.vocab_size == y.vocab_size},
      {"hidden_size", x.hidden_size == y.hidden_size},
      {"num_hidden_layers", x.num_layers == y.num_layers},
      {"max_position_embeddings", x.max_position_embeddings == y.max_position_embeddings},
      {"keel.norm", x.norm == y.norm},
      {"rms_norm_eps", x.norm_eps == y.norm_eps},
      {"keel.norm_placement", x.placement == y.placement},
      {"keel.norm", x.norm_unit_offset == y.norm_unit_offset},
      {"tie_word_embeddings", x.tie_word_embeddings == y.tie_word_embeddings},
      {"num_attention_heads", a.kind == b.kind && a.num_heads == b.num_heads},
      {"num_key_value_heads", a.num_kv_heads == b.num_kv_heads},
      {"head_dim", a.head_dim == b.head_dim},
      {"keel.qkv_bias", a.qkv_bias == b.qkv_bias && a.o_bias == b.o_bias},
      {"keel.qk_norm", a.qk_norm == b.qk_norm && a.qk_norm_full_width == b.qk_norm_full_width},
      {"rope_theta", a.rope.theta == b.rope.theta && a.rope.local_theta == b.rope.local_theta},
      {"partial_rotary_factor", a.rope.rotary_dim == b.rope.rotary_dim},
      {"rope_interleave", a.rope.interleave == b.rope.interleave},
      {"rope_scaling", a.rope.scaling == b.rope.scaling},
      {"keel.learned_positions", a.learned_positions == b.learned_positions},
      {"q_lora_rank", a.q_lora_rank == b.q_lora_rank},
      {"kv_lora_rank", a.kv_lora_rank == b.kv_lora_rank && a.qk_nope_head_dim == b.qk_nope_head_dim &&
                           a.qk_rope_head_dim == b.qk_rope_head_dim && a.v_head_dim == b.v_head_dim},
      {"keel.mla_latent_norms", a.mla_latent_norms == b.mla_latent_norms},
      {"keel.attn_softcap", a.softcap == b.softcap},
      {"keel.attn_sinks", a.sinks == b.sinks},
      {"keel.attn_output_gate", a.output_gate == b.output_gate},
      {"query_pre_attn_scalar", a.query_pre_attn_scalar == b.query_pre_attn_scalar},
      {"sliding_window", effective_windows(x) == effective_windows(y)},
      {"keel.mlp", x.mlp.kind == y.mlp.kind},
      {"hidden_act", x.mlp.activation == y.mlp.activation},
      {"intermediate_size", x.mlp.intermediate_size == y.mlp.intermediate_size},
      {"mlp_bias", x.mlp.bias == y.mlp.bias},
      {"num_experts", m.enabled == n.enabled && m.num_experts == n.num_experts && m.router == n.router},
      {"num_experts_per_tok", m.experts_per_token == n.experts_per_token},
      {"moe_intermediate_size", m.expert_intermediate_size == n.expert_intermediate_size},
      {"n_shared_experts", m.num_shared_experts == n.num_shared_experts &&
                               m.shared_intermediate_size == n.shared_intermediate_size},
      {"norm_topk_prob", m.norm_topk_prob == n.norm_topk_prob},
      {"routed_scaling_factor", m.routed_scaling_factor == n.routed_scaling_factor},
      {"n_group", m.n_group == n.n_group && m.topk_group == n.topk_group},
      {"moe_layer_freq", m.moe_layer == n.moe_layer},
      {"swiglu_limit", m.gpt_oss_experts == n.gpt_oss_experts && m.swiglu_limit == n.swiglu_limit &&
                           m.swiglu_alpha == n.swiglu_alpha},
      {"keel.final_softcap", x.final_softcap == y.final_softcap},
      {"keel.embed_scale", x.embed_scale == y.embed_scale},
  };
  for (const auto& [field, equal] : same) {
    if (!equal) return std::string(field);
  }
  return std::nullopt;
}

// Refuses what transformers' class for this family cannot express. Checked from the spec, so a
// variant reached through any route (keel object, --set) is caught; the exported config is then
// read back and must describe the same model field by field (check_round_trip).
void check_family_biases_and_norms(const arch::ModelSpec& spec);

void check_expressible(const arch::ModelSpec& spec) {
  const std::string& src = spec.source;
  const std::string family(arch::to_string(spec.family));
  const auto& a = spec.attention;
  const arch::FamilyRow& row = arch::family_row(spec);
  const FamilyShape shape = family_shape(spec.family);
  if (!row.supports.export_hf) {
    throw Error(src, "model_type", "keel cannot export " + spec.model_type);
  }
  const arch::NormPlacement own = row.placement;
  if (spec.placement != own) {
    throw Error(src, "keel.norm_placement",
                std::string(arch::to_string(spec.placement)) + " norms have no place in " + family +
                    "'s decoder layer (" + std::string(arch::to_string(own)) + " only)");
  }
  if (a.qk_norm && a.qk_norm_full_width != row.qk_norm_full_width) {
    throw Error(src, "keel.qk_norm",
                family + "'s q_norm/k_norm are " + (a.qk_norm_full_width ? "per head" : "full width") + ", not " +
                    (a.qk_norm_full_width ? "full width" : "per head"));
  }
  if (spec.norm != shape.norm) {
    throw Error(src, "keel.norm", family + " uses " + std::string(arch::to_string(shape.norm)) +
                                      "; transformers cannot load " + std::string(arch::to_string(spec.norm)) +
                                      " weights into it");
  }
  const bool gemma = row.gemma_fields;
  if (spec.norm_unit_offset != gemma) {
    throw Error(src, "keel.norm", family + (gemma ? " computes (1 + w) norms only" : "'s norms multiply by w, not (1 + w)"));
  }
  // Gemma 2 has both soft-caps (any values, or off) and scales its embeddings by √hidden_size.
  if (!gemma && a.softcap > 0) throw Error(src, "keel.attn_softcap", family + " has no attention logit soft-cap");
  if (spec.mlp.kind != shape.ffn) {
    throw Error(src, "keel.mlp", family + (shape.ffn == arch::FfnKind::Gated ? "'s MLP is gated (gate_proj)"
                                                                             : "'s MLP is c_fc, activation, c_proj"));
  }
  if (!gemma && spec.final_softcap > 0) throw Error(src, "keel.final_softcap", family + " has no final logit soft-cap");
  const double own_scale = gemma ? std::sqrt(static_cast<double>(spec.hidden_size)) : 1.0;
  if (spec.embed_scale != own_scale) {
    throw Error(src, "keel.embed_scale",
                family + (gemma ? " scales its embeddings by sqrt(hidden_size) only" : " does not scale its embeddings"));
  }
  if (!a.learned_positions && !shape.partial_rotary && a.rope.rotary_dim != a.qk_head_dim() &&
      a.kind != arch::AttentionKind::Mla) {
    throw Error(src, "partial_rotary_factor", family + " rotates the whole head (partial_rotary_factor 1)");
  }
  if (a.kind == arch::AttentionKind::Mla && !a.mla_latent_norms) {
    throw Error(src, "keel.mla_latent_norms", family + " always has q_a_layernorm and kv_a_layernorm");
  }
  if (a.kind == arch::AttentionKind::Mla && a.qk_norm) {
    throw Error(src, "keel.qk_norm", family + "'s MLA has no q_norm/k_norm");
  }
  const bool windowed_family = gemma || spec.family == arch::Family::Mistral || spec.family == arch::Family::Mixtral ||
                               spec.family == arch::Family::Qwen2 || spec.family == arch::Family::Qwen3 ||
                               spec.family == arch::Family::Qwen3Moe || spec.family == arch::Family::GptOss;
  if (a.sliding_window > 0 && !windowed_family) {
    throw Error(src, "sliding_window", family + "'s config class has no sliding window");
  }
  if (a.sinks != (spec.family == arch::Family::GptOss)) {
    throw Error(src, "keel.attn_sinks", family + (a.sinks ? " has no attention sinks (gpt_oss has)" : " always has sinks"));
  }
  if (a.output_gate) {
    throw Error(src, "keel.attn_output_gate", family + " has no attention output gate (Qwen3-Next's is not exported)");
  }
  check_family_biases_and_norms(spec);
}

// The per-family rules: which biases and QK-Norm the class holds, and its shape constraints.
void check_family_biases_and_norms(const arch::ModelSpec& spec) {
  const std::string& src = spec.source;
  const std::string family(arch::to_string(spec.family));
  const auto& a = spec.attention;
  switch (spec.family) {
    case arch::Family::Qwen3Next:  // inspect only: check_expressible refused it already
      break;
    case arch::Family::Llama:
      if (a.qk_norm) throw Error(src, "keel.qk_norm", "llama has no q_norm/k_norm");
      if (a.qkv_bias != a.o_bias) {
        throw Error(src, "keel.qkv_bias", "llama's attention_bias puts biases on q, k, v and o together");
      }
      if (spec.hidden_size % a.num_heads != 0) {
        throw Error(src, "num_attention_heads", "LlamaConfig requires hidden_size divisible by num_attention_heads");
      }
      break;
    case arch::Family::Mistral:
    case arch::Family::Mixtral:
      if (a.qk_norm) throw Error(src, "keel.qk_norm", family + " has no q_norm/k_norm");
      if (a.qkv_bias || a.o_bias) throw Error(src, "keel.qkv_bias", family + " has no attention biases");
      break;
    case arch::Family::Qwen2:
      if (a.qk_norm) throw Error(src, "keel.qk_norm", "qwen2 has no q_norm/k_norm");
      if (!a.qkv_bias || a.o_bias) {
        throw Error(src, "keel.qkv_bias", "qwen2 always has q/k/v biases and no o_proj bias");
      }
      // Qwen2Config has no head_dim argument; older transformers derive it from the sizes.
      if (a.head_dim * a.num_heads != spec.hidden_size) {
        throw Error(src, "head_dim", "qwen2 needs head_dim = hidden_size / num_attention_heads");
      }
      break;
    case arch::Family::Qwen3:
    case arch::Family::Qwen3Moe:
    case arch::Family::Gemma3Text:
      if (!a.qk_norm) throw Error(src, "keel.qk_norm", family + " always applies q_norm/k_norm");
      if (a.qkv_bias != a.o_bias) {
        throw Error(src, "keel.qkv_bias", family + "'s attention_bias puts biases on q, k, v and o together");
      }
      break;
    case arch::Family::Gemma2:
      if (a.qk_norm) throw Error(src, "keel.qk_norm", "gemma2 has no q_norm/k_norm");
      if (a.qkv_bias != a.o_bias) {
        throw Error(src, "keel.qkv_bias", "gemma2's attention_bias puts biases on q, k, v and o together");
      }
      break;
    case arch::Family::Olmo2:
      if (!a.qk_norm) throw Error(src, "keel.qk_norm", "olmo2 always applies q_norm/k_norm");
      if (a.qkv_bias != a.o_bias) {
        throw Error(src, "keel.qkv_bias", "olmo2's attention_bias puts biases on q, k, v and o together");
      }
      // Olmo2Config has no head_dim: the modeling code takes hidden_size / num_attention_heads.
      if (a.head_dim * a.num_heads != spec.hidden_size) {
        throw Error(src, "head_dim", "olmo2 needs head_dim = hidden_size / num_attention_heads");
      }
      break;
    case arch::Family::GptOss:
      if (a.qk_norm) throw Error(src, "keel.qk_norm", "gpt_oss has no q_norm/k_norm");
      if (a.qkv_bias != a.o_bias) {
        throw Error(src, "keel.qkv_bias", "gpt_oss's attention_bias puts biases on q, k, v and o together");
      }
      if (spec.moe.swiglu_alpha != 1.702) {
        throw Error(src, "swiglu_alpha", "transformers' GptOssExperts fixes alpha at 1.702");
      }
      break;
    case arch::Family::Gpt2:
      if (a.qk_norm) throw Error(src, "keel.qk_norm", "gpt2 has no q_norm/k_norm");
      if (!a.qkv_bias || !a.o_bias || !spec.mlp.bias) throw Error(src, "keel.qkv_bias", "gpt2's Conv1D layers all have biases");
      break;
    case arch::Family::DeepseekV2:
    case arch::Family::DeepseekV3:
    case arch::Family::KimiK2:
      // keel scales MLA logits by YaRN's mscale² as DeepSeek's code does; transformers'
      // DeepseekV2Attention does not, so such a V2 export would load with other logits.
      if (spec.family == arch::Family::DeepseekV2 &&
          arch::attention_softmax_scale(spec) != 1.0 / std::sqrt(static_cast<double>(a.qk_head_dim()))) {
        throw Error(src, "rope_scaling.mscale_all_dim",
                    "transformers' DeepseekV2Attention leaves out the YaRN mscale² keel (like DeepSeek's code) applies "
                    "to the softmax scale; the export would compute other logits");
      }
      if (a.qkv_bias != a.o_bias) {
        throw Error(src, "keel.qkv_bias", family + "'s attention_bias puts biases on q_a, kv_a and o together");
      }
      [[fallthrough]];
    case arch::Family::Glm4Moe:
      if (spec.family == arch::Family::Glm4Moe && a.o_bias) {
        throw Error(src, "keel.qkv_bias", "glm4_moe's o_proj has no bias");
      }
      // DeepseekV2/V3Config, Glm4MoeConfig: layer l is MoE iff l >= first_k_dense_replace
      // (transformers' decoder layers ignore moe_layer_freq).
      if (spec.moe.enabled) {
        for (int64_t l = 0; l < spec.num_layers; ++l) {
          if (spec.is_moe_layer(l) != (l >= spec.moe.first_k_dense)) {
            throw Error(src, "moe_layer_freq",
                        "transformers' " + family + " puts experts on every layer from first_k_dense_replace on");
          }
        }
      }
      break;
  }
}

// The exported config must read back as the model that was trained.
void check_round_trip(const arch::ModelSpec& spec, const json& config) {
  arch::ModelSpec back;
  try {
    back = arch::spec_from_config(config, spec.source + " (as exported)");
  } catch (const Error& e) {
    throw Error(spec.source, e.field(), "the exported config would not read back: " + e.reason());
  }
  if (auto field = first_difference(spec, back)) {
    throw Error(spec.source, *field, "no field of " + config["model_type"].get<std::string>() +
                                         "'s config can express this value (the exported config would describe another model)");
  }
}

// The begin-of-text token: Llama 3's, SentencePiece's, Gemma's; GPT-2 and Qwen use the
// end-of-text token for both.
std::optional<int32_t> bos_id(const data::Tokenizer& tok) {
  for (const char* name : {"<|begin_of_text|>", "<s>", "<bos>"}) {
    if (auto id = tok.token_id(name)) return id;
  }
  return tok.eos_id();
}

}  // namespace

namespace {

// GPT2Config: its own spelling of the sizes; dropout off (keel trains without it).
json gpt2_config(const arch::ModelSpec& spec) {
  json c = json::object();
  c["vocab_size"] = spec.vocab_size;
  c["n_embd"] = spec.hidden_size;
  c["n_layer"] = spec.num_layers;
  c["n_head"] = spec.attention.num_heads;
  c["n_positions"] = spec.max_position_embeddings;
  c["n_ctx"] = spec.max_position_embeddings;  // older transformers read it
  c["n_inner"] = spec.mlp.intermediate_size;
  c["activation_function"] = spec.mlp.hidden_act;
  c["layer_norm_epsilon"] = spec.norm_eps;
  c["initializer_range"] = spec.initializer_range;
  c["resid_pdrop"] = 0.0;
  c["embd_pdrop"] = 0.0;
  c["attn_pdrop"] = 0.0;
  c["scale_attn_weights"] = true;
  c["scale_attn_by_inverse_layer_idx"] = false;
  c["reorder_and_upcast_attn"] = false;
  return c;
}

// The fields every Llama-style config class shares.
json decoder_config(const arch::ModelSpec& spec) {
  const auto& a = spec.attention;
  json c = json::object();
  c["vocab_size"] = spec.vocab_size;
  c["hidden_size"] = spec.hidden_size;
  c["intermediate_size"] = spec.mlp.intermediate_size;
  c["num_hidden_layers"] = spec.num_layers;
  c["num_attention_heads"] = a.num_heads;
  c["num_key_value_heads"] = a.num_kv_heads;
  c["head_dim"] = a.head_dim;
  c["hidden_act"] = spec.mlp.hidden_act;
  c["max_position_embeddings"] = spec.max_position_embeddings;
  c["initializer_range"] = spec.initializer_range;
  c["rms_norm_eps"] = spec.norm_eps;
  c["rope_theta"] = a.rope.theta;
  c["rope_scaling"] = a.rope.scaling.is_null() ? json(nullptr) : a.rope.scaling;
  c["attention_dropout"] = 0.0;
  return c;
}

// The routed-expert fields DeepseekV2Config, DeepseekV3Config and Glm4MoeConfig share. A dense
// model keeps every layer below first_k_dense_replace, so transformers builds no experts either.
// false: the model is dense and nothing else is written.
bool deepseek_expert_fields(json& c, const arch::ModelSpec& spec) {
  const auto& moe = spec.moe;
  if (!moe.enabled) {  // keel reads a missing n_routed_experts as none
    c["first_k_dense_replace"] = spec.num_layers;
    return false;
  }
  c["n_routed_experts"] = moe.num_experts;
  c["n_shared_experts"] = moe.num_shared_experts;
  c["moe_intermediate_size"] = moe.expert_intermediate_size;
  c["num_experts_per_tok"] = moe.experts_per_token;
  c["routed_scaling_factor"] = moe.routed_scaling_factor;
  c["n_group"] = moe.n_group;
  c["topk_group"] = moe.topk_group;
  c["first_k_dense_replace"] = moe.first_k_dense;
  return true;
}

// Routed experts the DeepSeek-V3 way (DeepseekV3Config, Glm4MoeConfig).
void sigmoid_router_fields(json& c, const arch::ModelSpec& spec) {
  if (!deepseek_expert_fields(c, spec)) return;
  c["norm_topk_prob"] = spec.moe.norm_topk_prob;
  c["topk_method"] = "noaux_tc";  // sigmoid scores, e_score_correction_bias for selection
  c["scoring_func"] = "sigmoid";
}

void mla_fields(json& c, const arch::ModelSpec& spec) {
  const auto& a = spec.attention;
  c["q_lora_rank"] = a.q_lora_rank > 0 ? json(a.q_lora_rank) : json(nullptr);
  c["kv_lora_rank"] = a.kv_lora_rank;
  c["qk_nope_head_dim"] = a.qk_nope_head_dim;
  c["qk_rope_head_dim"] = a.qk_rope_head_dim;
  c["v_head_dim"] = a.v_head_dim;
}

// DeepSeek-V2's gate (DeepseekV2Config): softmax scores, greedy or group-limited greedy.
void softmax_router_fields(json& c, const arch::ModelSpec& spec) {
  if (!deepseek_expert_fields(c, spec)) return;
  c["topk_method"] = spec.moe.n_group > 1 ? "group_limited_greedy" : "greedy";  // greedy reads back as n_group 1
  c["moe_layer_freq"] = 1;
  c["norm_topk_prob"] = false;
  c["scoring_func"] = "softmax";
  c["aux_loss_alpha"] = 0.001;
  c["seq_aux"] = true;
}

// GptOssConfig: layer_types name the sliding layers; num_experts_per_tok is what the modeling
// code reads, experts_per_token what the released configs also carry.
void gpt_oss_fields(json& c, const arch::ModelSpec& spec) {
  const auto& a = spec.attention;
  c["attention_bias"] = a.qkv_bias;
  c["sliding_window"] = a.sliding_window > 0 ? a.sliding_window : 128;
  c["layer_types"] = json::array();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    c["layer_types"].push_back(spec.is_sliding_layer(l) ? "sliding_attention" : "full_attention");
  }
  c["num_local_experts"] = spec.moe.num_experts;
  c["num_experts_per_tok"] = spec.moe.experts_per_token;
  c["experts_per_token"] = spec.moe.experts_per_token;
  c["swiglu_limit"] = spec.moe.swiglu_limit;
  c["router_aux_loss_coef"] = 0.9;
  c["output_router_logits"] = false;
}

void add_gemma_fields(json& c, const arch::ModelSpec& spec) {
  const auto& a = spec.attention;
  // Gemma2Config / Gemma3TextConfig: the MLP reads hidden_activation; null soft-caps and
  // window switch them off; Gemma 3's local layers rotate with rope_local_base_freq.
  c["attention_bias"] = a.qkv_bias;
  c["hidden_activation"] = spec.mlp.hidden_act;
  c["query_pre_attn_scalar"] = a.query_pre_attn_scalar;
  c["attn_logit_softcapping"] = a.softcap > 0 ? json(a.softcap) : json(nullptr);
  c["final_logit_softcapping"] = spec.final_softcap > 0 ? json(spec.final_softcap) : json(nullptr);
  c["sliding_window"] = a.sliding_window > 0 ? json(a.sliding_window) : json(nullptr);
  c["layer_types"] = json::array();
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    c["layer_types"].push_back(spec.is_sliding_layer(l) ? "sliding_attention" : "full_attention");
  }
  c["cache_implementation"] = "hybrid";
  if (spec.family == arch::Family::Gemma3Text) {
    c["rope_local_base_freq"] = a.rope.local_theta;
    // Versions of Gemma3TextConfig without layer_types read the period instead (default 6).
    for (int64_t period = 1; period <= spec.num_layers; ++period) {
      bool fits = true;
      for (int64_t l = 0; l < spec.num_layers; ++l) fits = fits && spec.is_sliding_layer(l) == ((l + 1) % period != 0);
      if (fits) {
        c["sliding_window_pattern"] = period;
        break;
      }
    }
  }
}

// The fields of the family's own config class, beyond the shared ones.
void add_family_fields(json& c, const arch::ModelSpec& spec) {
  const auto& a = spec.attention;
  switch (spec.family) {
    case arch::Family::Gpt2:
    case arch::Family::Qwen3Next:  // inspect only, never exported
      break;
    case arch::Family::Llama:
      c["attention_bias"] = a.qkv_bias;
      c["mlp_bias"] = spec.mlp.bias;
      c["pretraining_tp"] = 1;
      break;
    case arch::Family::Mistral:  // every layer or none; MistralConfig's default is a 4096 window, so null is written
    case arch::Family::Mixtral:
      c["sliding_window"] = a.sliding_window > 0 ? json(a.sliding_window) : json(nullptr);
      if (spec.family == arch::Family::Mistral) break;
      c["num_local_experts"] = spec.moe.num_experts;
      c["num_experts_per_tok"] = spec.moe.experts_per_token;
      c["router_jitter_noise"] = 0.0;
      c["output_router_logits"] = false;
      c["router_aux_loss_coef"] = 0.001;
      break;
    case arch::Family::Qwen3:
      c["attention_bias"] = a.qkv_bias;  // Qwen3Config has the switch; Qwen2's q/k/v biases are fixed
      qwen_window_fields(c, spec, /*layer_types=*/true);
      break;
    case arch::Family::Qwen2:
      qwen_window_fields(c, spec, /*layer_types=*/true);
      break;
    case arch::Family::Qwen3Moe: {
      c["attention_bias"] = a.qkv_bias;
      qwen_window_fields(c, spec, /*layer_types=*/false);
      // Qwen3MoeDecoderLayer: experts unless listed in mlp_only_layers, every decoder_sparse_step-th layer.
      c["num_experts"] = spec.moe.enabled ? spec.moe.num_experts : 0;
      c["decoder_sparse_step"] = 1;
      json dense = json::array();
      for (int64_t l = 0; l < spec.num_layers; ++l) {
        if (spec.moe.enabled && !spec.is_moe_layer(l)) dense.push_back(l);
      }
      c["mlp_only_layers"] = dense;
      if (spec.moe.enabled) {
        c["moe_intermediate_size"] = spec.moe.expert_intermediate_size;
        c["num_experts_per_tok"] = spec.moe.experts_per_token;
        c["norm_topk_prob"] = spec.moe.norm_topk_prob;
      }
      c["output_router_logits"] = false;
      c["router_aux_loss_coef"] = 0.001;
      break;
    }
    case arch::Family::GptOss:
      gpt_oss_fields(c, spec);
      break;
    case arch::Family::DeepseekV2:
      c.erase("head_dim");  // DeepseekV2Config derives it (qk_rope_head_dim)
      c["num_key_value_heads"] = a.num_heads;
      c["attention_bias"] = a.qkv_bias;
      mla_fields(c, spec);
      softmax_router_fields(c, spec);
      break;
    case arch::Family::DeepseekV3:
    case arch::Family::KimiK2:
      c.erase("head_dim");  // DeepseekV3Config sets head_dim = qk_rope_head_dim for its rotary tables
      c["num_key_value_heads"] = a.num_heads;
      c["attention_bias"] = a.qkv_bias;
      c["q_lora_rank"] = a.q_lora_rank > 0 ? json(a.q_lora_rank) : json(nullptr);
      c["kv_lora_rank"] = a.kv_lora_rank;
      c["qk_nope_head_dim"] = a.qk_nope_head_dim;
      c["qk_rope_head_dim"] = a.qk_rope_head_dim;
      c["v_head_dim"] = a.v_head_dim;
      c["rope_interleave"] = a.rope.interleave;
      c["num_nextn_predict_layers"] = 0;  // keel does not train MTP modules; none are written
      sigmoid_router_fields(c, spec);
      break;
    case arch::Family::Glm4Moe:
      c["attention_bias"] = a.qkv_bias;  // q, k, v only: Glm4Moe's o_proj has none
      c["partial_rotary_factor"] = a.rope.partial_rotary_factor;
      c["use_qk_norm"] = a.qk_norm;
      c["num_nextn_predict_layers"] = 0;
      sigmoid_router_fields(c, spec);
      break;
    case arch::Family::Olmo2:
      c["attention_bias"] = a.qkv_bias;
      c.erase("head_dim");  // Olmo2Config derives it; checked equal above
      break;
    case arch::Family::Gemma2:
    case arch::Family::Gemma3Text:
      add_gemma_fields(c, spec);
      break;
  }
}

}  // namespace

json hf_export_config(const arch::ModelSpec& spec, const SpecialTokenIds& ids, io::DType dtype) {
  check_expressible(spec);
  const arch::FamilyRow& row = arch::family_row(spec.family);
  // Kimi K2 is DeepSeek-V3's architecture; its published folder loads it through remote code, so
  // the export names transformers' own class, which computes the same model.
  const std::string model_type = spec.family == arch::Family::KimiK2 ? "deepseek_v3" : spec.model_type;
  json c = json::object();
  c["architectures"] = json::array({std::string(row.hf_architecture)});
  c["model_type"] = model_type;
  c.update(spec.family == arch::Family::Gpt2 ? gpt2_config(spec) : decoder_config(spec));
  c["tie_word_embeddings"] = spec.tie_word_embeddings;
  c["bos_token_id"] = id_or_null(ids.bos);
  c["eos_token_id"] = id_or_null(ids.eos);
  c["torch_dtype"] = dtype == io::DType::BF16 ? "bfloat16" : "float32";
  c["use_cache"] = true;
  add_family_fields(c, spec);
  check_round_trip(spec, c);
  return c;
}

json hf_generation_config(const SpecialTokenIds& ids) {
  return json{{"_from_model_config", true}, {"bos_token_id", id_or_null(ids.bos)},
              {"eos_token_id", id_or_null(ids.eos)}};
}

int64_t parse_shard_size(const std::string& text) {
  // transformers' convert_file_size_to_int: "5GB" = 5·10⁹ bytes, "5GiB" = 5·2³⁰, a unit ending in
  // a lower-case "b" ("5Gb", "500mb") counts bits, a bare number is bytes.
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  const std::string number = text.substr(0, digits);
  const std::string unit_text = text.substr(digits);
  std::string unit = unit_text;
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  static const std::vector<std::pair<std::string, double>> units = {
      {"", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KIB", 1024.0}, {"MIB", 1024.0 * 1024}, {"GIB", 1024.0 * 1024 * 1024}, {"TIB", 1024.0 * 1024 * 1024 * 1024}};
  double value = -1;
  try {
    size_t used = 0;
    if (!number.empty()) value = std::stod(number, &used);
    if (used != number.size()) value = -1;
  } catch (const std::exception&) {
    value = -1;
  }
  const bool bits = unit.size() == 2 && unit_text.back() == 'b';
  for (const auto& [name, scale] : units) {
    const double bytes = value * scale / (bits ? 8.0 : 1.0);
    if (unit == name && value > 0 && bytes >= 1 && bytes < 9e18) return static_cast<int64_t>(bytes);
  }
  throw Error("keel export", "--max-shard-size",
              "'" + text + "' is not a size (a positive number of bytes, or with KB, MB, GB, KiB, MiB, GiB)");
}

void write_hf_folder(const nn::TransformerModel& model, const SpecialTokenIds& ids, const std::string& tokenizer_path,
                     const std::string& out_dir, const ExportOptions& options) {
  if (options.dtype != io::DType::F32 && options.dtype != io::DType::BF16) {
    throw Error("keel export", "--dtype", "float32 or bfloat16");
  }
  const json config = hf_export_config(model.spec(), ids, options.dtype);  // refuses before anything is written
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !(fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec))) {
    throw Error(out_dir, "", "already exists and is not an empty folder");
  }
  fs::path target = fs::path(out_dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "out/" names the folder "out"
  const fs::path staging = target.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec) throw Error(staging.string(), "", "cannot create the folder: " + ec.message());
  try {
    const nn::ParameterStore& store = model.parameters();
    std::vector<io::TensorToWrite> tensors;
    for (const nn::ParamInfo& p : store.entries()) {
      // Buffers (the router's e_score_correction_bias) stay fp32: transformers keeps them so, and
      // they are small offsets between scores that bf16 would round away.
      const io::DType dtype = p.buffer ? io::DType::F32 : options.dtype;
      tensors.push_back({p.name, dtype, p.shape, store.values().data() + p.offset});
    }
    io::write_hf_weights(staging.string(), tensors, options.max_shard_bytes);
    write_file_atomic((staging / "config.json").string(), config.dump(2) + "\n");
    write_file_atomic((staging / "generation_config.json").string(), hf_generation_config(ids).dump(2) + "\n");
    if (!tokenizer_path.empty()) {
      write_file_atomic((staging / "tokenizer.json").string(), read_file(tokenizer_path, "the tokenizer"));
    }
    // rename(2) replaces an empty directory atomically.
    fs::rename(staging, target, ec);
    if (ec) throw Error(out_dir, "", "cannot move the finished export into place: " + ec.message());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    throw;
  }
}

ExportResult export_run(const std::string& run_dir, const std::string& out_dir, const ExportOptions& options) {
  if (!fs::exists(fs::path(run_dir) / kRunConfigFile)) {
    throw Error(run_dir, "", "not a run folder (no run.toml)");
  }
  const ModelSource source = resolve_model_source(run_dir);
  if (source.tokenizer_path.empty()) {
    throw Error((fs::path(run_dir) / kRunConfigFile).string(), "data.tokenizer",
                "is not set: an exported model needs its tokenizer.json");
  }
  io::LoadedModel loaded = load_model_source(source);
  const nn::TransformerModel& model = *loaded.model;
  const data::Tokenizer tokenizer = data::Tokenizer::load(source.tokenizer_path);
  if (tokenizer.vocab_size() > model.spec().vocab_size) {
    throw Error(source.tokenizer_path, "vocab_size",
                "the tokenizer has " + std::to_string(tokenizer.vocab_size()) + " ids, more than the model's " +
                    std::to_string(model.spec().vocab_size));
  }
  const SpecialTokenIds ids{bos_id(tokenizer), tokenizer.eos_id()};
  write_hf_folder(model, ids, source.tokenizer_path, out_dir, options);
  return {out_dir, source.checkpoint_dir, model.parameters().size()};
}

}  // namespace keel::train
