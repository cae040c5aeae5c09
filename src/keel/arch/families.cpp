#include "keel/arch/families.hpp"

#include <array>

#include "keel/core/error.hpp"

// Each family's TensorNameTable names only the tensors the family has; every field left out is
// an empty name on purpose (tensor_names.hpp), which GCC 12 reports, field by field, for designated
// initializers: over a hundred lines that would bury a real warning in every build.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace keel::arch {

namespace {
using B = AttentionBiasRule;
using M = MoeLayout;
using R = RouterKind;

// How the checkpoints spell each tensor (HF modeling_*.py module paths).
constexpr TensorNameTable kDecoderNames{
    .embedding = "model.embed_tokens",
    .final_norm = "model.norm",
    .lm_head = "lm_head",
    .input_norm = "model.layers.{L}.input_layernorm",
    .post_attention_norm = "model.layers.{L}.post_attention_layernorm",
    .pre_feedforward_norm = "model.layers.{L}.pre_feedforward_layernorm",
    .post_feedforward_norm = "model.layers.{L}.post_feedforward_layernorm",
    .q = "model.layers.{L}.self_attn.q_proj",
    .k = "model.layers.{L}.self_attn.k_proj",
    .v = "model.layers.{L}.self_attn.v_proj",
    .o = "model.layers.{L}.self_attn.o_proj",
    .q_norm = "model.layers.{L}.self_attn.q_norm",
    .k_norm = "model.layers.{L}.self_attn.k_norm",
    .sinks = "model.layers.{L}.self_attn.sinks",
    .q_a = "model.layers.{L}.self_attn.q_a_proj",
    .q_a_norm = "model.layers.{L}.self_attn.q_a_layernorm",
    .q_b = "model.layers.{L}.self_attn.q_b_proj",
    .kv_a = "model.layers.{L}.self_attn.kv_a_proj_with_mqa",
    .kv_a_norm = "model.layers.{L}.self_attn.kv_a_layernorm",
    .kv_b = "model.layers.{L}.self_attn.kv_b_proj",
    .mlp_gate = "model.layers.{L}.mlp.gate_proj",
    .mlp_up = "model.layers.{L}.mlp.up_proj",
    .mlp_down = "model.layers.{L}.mlp.down_proj",
    .router = "model.layers.{L}.mlp.gate",
    .expert_gate = "model.layers.{L}.mlp.experts.{E}.gate_proj",
    .expert_up = "model.layers.{L}.mlp.experts.{E}.up_proj",
    .expert_down = "model.layers.{L}.mlp.experts.{E}.down_proj",
    .shared_gate = "model.layers.{L}.mlp.shared_experts.gate_proj",
    .shared_up = "model.layers.{L}.mlp.shared_experts.up_proj",
    .shared_down = "model.layers.{L}.mlp.shared_experts.down_proj",
    .mtp_embedding = "model.layers.{L}.embed_tokens",
    .mtp_enorm = "model.layers.{L}.enorm",
    .mtp_hnorm = "model.layers.{L}.hnorm",
    .mtp_eh_proj = "model.layers.{L}.eh_proj",
    .mtp_head_norm = "model.layers.{L}.shared_head.norm",
    .mtp_head = "model.layers.{L}.shared_head.head",
};

// Mixtral: the decoder's names, but the FFN is block_sparse_moe with experts w1 (gate), w3 (up),
// w2 (down) (modeling_mixtral.py MixtralBlockSparseTop2MLP).
// gpt-oss (modeling_gpt_oss.py): the decoder's attention names plus sinks, mlp.router with a
// bias, and the experts fused into four bare parameters (GptOssExperts).
constexpr TensorNameTable kGptOssNames = [] {
  TensorNameTable t = kDecoderNames;
  t.router = "model.layers.{L}.mlp.router";
  t.expert_gate = t.expert_up = t.expert_down = "";
  t.shared_gate = t.shared_up = t.shared_down = "";
  t.experts_gate_up = "model.layers.{L}.mlp.experts.gate_up_proj";
  t.experts_gate_up_bias = "model.layers.{L}.mlp.experts.gate_up_proj_bias";
  t.experts_down = "model.layers.{L}.mlp.experts.down_proj";
  t.experts_down_bias = "model.layers.{L}.mlp.experts.down_proj_bias";
  t.q_a = t.q_a_norm = t.q_b = t.kv_a = t.kv_a_norm = t.kv_b = "";
  t.mtp_embedding = t.mtp_enorm = t.mtp_hnorm = t.mtp_eh_proj = t.mtp_head_norm = t.mtp_head = "";
  return t;
}();

// Qwen3-Next (modeling_qwen3_next.py): the decoder's names, one shared_expert (singular) with its
// shared_expert_gate, and linear_attn.* on the Gated DeltaNet layers. The MTP layer's tensors
// (mtp.*) are spelled by hf_tensors.cpp from these (mtp.layers.K. for model.layers.L.).
constexpr TensorNameTable kQwen3NextNames = [] {
  TensorNameTable t = kDecoderNames;
  t.shared_gate = "model.layers.{L}.mlp.shared_expert.gate_proj";
  t.shared_up = "model.layers.{L}.mlp.shared_expert.up_proj";
  t.shared_down = "model.layers.{L}.mlp.shared_expert.down_proj";
  t.shared_expert_gate = "model.layers.{L}.mlp.shared_expert_gate";
  t.linear_qkvz = "model.layers.{L}.linear_attn.in_proj_qkvz";
  t.linear_ba = "model.layers.{L}.linear_attn.in_proj_ba";
  t.linear_conv = "model.layers.{L}.linear_attn.conv1d";
  t.linear_dt_bias = "model.layers.{L}.linear_attn.dt_bias";
  t.linear_a_log = "model.layers.{L}.linear_attn.A_log";
  t.linear_norm = "model.layers.{L}.linear_attn.norm";
  t.linear_out = "model.layers.{L}.linear_attn.out_proj";
  t.mtp_embedding = t.mtp_head = "";
  t.mtp_eh_proj = "mtp.fc";
  t.mtp_enorm = "mtp.pre_fc_norm_embedding";
  t.mtp_hnorm = "mtp.pre_fc_norm_hidden";
  t.mtp_head_norm = "mtp.norm";
  return t;
}();

constexpr TensorNameTable kMixtralNames = [] {
  TensorNameTable t = kDecoderNames;
  t.router = "model.layers.{L}.block_sparse_moe.gate";
  t.expert_gate = "model.layers.{L}.block_sparse_moe.experts.{E}.w1";
  t.expert_up = "model.layers.{L}.block_sparse_moe.experts.{E}.w3";
  t.expert_down = "model.layers.{L}.block_sparse_moe.experts.{E}.w2";
  t.shared_gate = t.shared_up = t.shared_down = "";
  return t;
}();

// GPT-2 (modeling_gpt2.py): ln_1 before attention, ln_2 before the MLP (the pre-norm slots),
// fused c_attn, Conv1D c_fc (up) and c_proj (down).
constexpr TensorNameTable kGpt2Names{
    .embedding = "transformer.wte",
    .position_embedding = "transformer.wpe",
    .final_norm = "transformer.ln_f",
    .lm_head = "lm_head",
    .input_norm = "transformer.h.{L}.ln_1",
    .post_attention_norm = "transformer.h.{L}.ln_2",
    .o = "transformer.h.{L}.attn.c_proj",
    .qkv = "transformer.h.{L}.attn.c_attn",
    .mlp_up = "transformer.h.{L}.mlp.c_fc",
    .mlp_down = "transformer.h.{L}.mlp.c_proj",
};

constexpr RouterDefaults kNoRouter{1.0, 1, 1, 0};
constexpr RouterDefaults kDeepseekRouter{2.5, 8, 4, 3};  // DeepseekV3Config
constexpr RouterDefaults kGlmRouter{1.0, 1, 1, 1};       // Glm4MoeConfig
constexpr RouterDefaults kDeepseekV2Router{1.0, 1, 1, 0};  // DeepseekV2Config
using P = ProjectionLayout;
// train, generate, export_hf, qk_clip, muon
constexpr FamilyCapabilities kDenseExportable{true, true, true, true, true};
constexpr FamilyCapabilities kTrainable{true, true, true, true, true};
constexpr FamilyCapabilities kGpt2Supports{true, true, true, false, true};  // QK-Clip: fused c_attn
// OLMo 2: a full-width QK-Norm mixes the heads, so QK-Clip's per-head rescaling of W_q/W_k does
// not scale one head's logits; it is refused rather than silently ineffective.
constexpr FamilyCapabilities kOlmo2Supports{true, true, true, false, true};
// Gemma 2: soft-capped logits are bounded already and QK-Clip's rescaling is not what Gemma does.
constexpr FamilyCapabilities kGemma2Supports{true, true, true, false, true};
// gpt-oss: its fused [E, in, out] expert stacks are not the 2-D matrices Muon orthogonalizes.
constexpr FamilyCapabilities kGptOssSupports{true, true, true, true, false};
// Qwen3-Next: inspect only (its Gated DeltaNet layers are not implemented; nn/model.cpp says so).
constexpr FamilyCapabilities kInspectOnly{false, false, false, false, false};

// Defaults follow each family's transformers Config class (e.g. Qwen3Config.head_dim = 128,
// Glm4MoeConfig.partial_rotary_factor = 0.5, MixtralConfig.rope_theta = 1e6).
constexpr std::array kFamilies = {
    //        family            model_type     HF class                  gpt2  mla   qkn    qk field       bias rule            mlp_b  moe         router              tie    eps    theta   rot   hd   router defaults  names            projections    prefix          ignored buffers  supports
    FamilyRow{Family::Gpt2,       "gpt2",        "GPT2LMHeadModel",        true,  false, false, "",           B::Gpt2,           false, M::Dense,      R::SoftmaxTopK,    true,  1e-5, 10000,  1.0, 0,   kNoRouter,       &kGpt2Names,     P::Gpt2Conv1D, "transformer.", {".attn.bias", ".attn.masked_bias"}, kGpt2Supports},
    FamilyRow{Family::Llama,      "llama",       "LlamaForCausalLM",       false, false, false, "",           B::QkvoFromConfig, true,  M::Dense,      R::SoftmaxTopK,    false, 1e-6, 10000,  1.0, 0,   kNoRouter,       &kDecoderNames,  P::Linear,     "",             {}, kDenseExportable},
    FamilyRow{Family::Mistral,    "mistral",     "MistralForCausalLM",     false, false, false, "",           B::None,           false, M::Dense,      R::SoftmaxTopK,    false, 1e-6, 10000,  1.0, 0,   kNoRouter,       &kDecoderNames,  P::Linear,     "",             {}, kTrainable},
    FamilyRow{Family::Qwen2,      "qwen2",       "Qwen2ForCausalLM",       false, false, false, "",           B::QkvAlways,      false, M::Dense,      R::SoftmaxTopK,    false, 1e-6, 10000,  1.0, 0,   kNoRouter,       &kDecoderNames,  P::Linear,     "",             {}, kDenseExportable},
    FamilyRow{Family::Qwen3,      "qwen3",       "Qwen3ForCausalLM",       false, false, true,  "",           B::QkvoFromConfig, false, M::Dense,      R::SoftmaxTopK,    false, 1e-6, 10000,  1.0, 128, kNoRouter,       &kDecoderNames,  P::Linear,     "",             {}, kDenseExportable},
    FamilyRow{Family::Qwen3Moe,   "qwen3_moe",   "Qwen3MoeForCausalLM",    false, false, true,  "",           B::QkvoFromConfig, false, M::Qwen3Moe,   R::SoftmaxTopK,    false, 1e-6, 10000,  1.0, 128, kNoRouter,       &kDecoderNames,  P::Linear,     "",             {}, kTrainable},
    // Qwen3-Next (modeling_qwen3_next.py, Qwen3NextConfig defaults): Qwen3-MoE's router with one
    // gated shared expert, gated attention with (1 + w) QK-Norm and a quarter of each head rotated,
    // Gated DeltaNet on three layers of four.
    FamilyRow{Family::Qwen3Next,  "qwen3_next",  "Qwen3NextForCausalLM",   false, false, true,  "",           B::QkvoFromConfig, false, M::Qwen3Next,  R::SoftmaxTopK,    false, 1e-6, 10000,  0.25, 256, kNoRouter,      &kQwen3NextNames, P::Linear,     "",             {}, kInspectOnly},
    FamilyRow{Family::Mixtral,    "mixtral",     "MixtralForCausalLM",     false, false, false, "",           B::None,           false, M::Mixtral,    R::SoftmaxTopK,    false, 1e-5, 1e6,    1.0, 0,   kNoRouter,       &kMixtralNames,  P::Linear,     "",             {}, kTrainable},
    // gpt-oss (modeling_gpt_oss.py, GptOssConfig defaults): sinks in every softmax, biases on q/k/v/o
    // (attention_bias true), sliding windows of 128 on even layers, YaRN, a biased router whose
    // top-k logits are softmaxed, fused experts with the clamped SwiGLU, untied head.
    FamilyRow{Family::GptOss,     "gpt_oss",     "GptOssForCausalLM",      false, false, false, "",           B::QkvoFromConfig, false, M::GptOss,      R::SoftmaxTopK,    false, 1e-5, 150000, 1.0, 64,  kNoRouter,       &kGptOssNames,   P::Linear,     "",             {}, kGptOssSupports, NormPlacement::Pre, false, false, true, true},
    // DeepSeek-V2 (modeling_deepseek_v2.py): V3's MLA and names, a softmax gate without a
    // correction bias, greedy or group-limited greedy (groups ranked by their best expert).
    FamilyRow{Family::DeepseekV2, "deepseek_v2", "DeepseekV2ForCausalLM",  false, true,  false, "",           B::MlaFromConfig,  false, M::DeepseekV3, R::SoftmaxGrouped, false, 1e-6, 10000,  1.0, 0,   kDeepseekV2Router, &kDecoderNames, P::Linear,     "",             {}, kTrainable},
    FamilyRow{Family::DeepseekV3, "deepseek_v3", "DeepseekV3ForCausalLM",  false, true,  false, "",           B::MlaFromConfig,  false, M::DeepseekV3, R::SigmoidGrouped, false, 1e-6, 10000,  1.0, 0,   kDeepseekRouter, &kDecoderNames,  P::Linear,     "",             {}, kTrainable},
    FamilyRow{Family::KimiK2,     "kimi_k2",     "DeepseekV3ForCausalLM",  false, true,  false, "",           B::MlaFromConfig,  false, M::DeepseekV3, R::SigmoidGrouped, false, 1e-6, 10000,  1.0, 0,   kDeepseekRouter, &kDecoderNames,  P::Linear,     "",             {}, kTrainable},
    FamilyRow{Family::Glm4Moe,    "glm4_moe",    "Glm4MoeForCausalLM",     false, false, false, "use_qk_norm", B::QkvFromConfig, false, M::DeepseekV3, R::SigmoidGrouped, false, 1e-5, 10000,  0.5, 128, kGlmRouter,      &kDecoderNames,  P::Linear,     "",             {}, kTrainable},
    // OLMo 2 (modeling_olmo2.py): Llama's names and biases, no input norm: post_attention and
    // post_feedforward norms after each sublayer, q_norm/k_norm over the full q and k widths.
    // Olmo2Config defaults: rms_norm_eps 1e-5, rope_theta 10000 (the released configs set 1e-6, 5e5).
    FamilyRow{Family::Olmo2,      "olmo2",       "Olmo2ForCausalLM",       false, false, true,  "",           B::QkvoFromConfig, false, M::Dense,      R::SoftmaxTopK,    false, 1e-5, 10000,  1.0, 0,   kNoRouter,       &kDecoderNames,  P::Linear,     "",             {}, kOlmo2Supports, NormPlacement::PostSublayer, true},
    // Gemma 2 (modeling_gemma2.py, Gemma2Config defaults): four (1 + w) RMSNorms per layer
    // (sandwich), GeGLU from `hidden_activation`, head_dim 256, tied head, embeddings times
    // √hidden, query_pre_attn_scalar, attention and final soft-caps, sliding windows on even layers.
    FamilyRow{Family::Gemma2,     "gemma2",      "Gemma2ForCausalLM",      false, false, false, "",           B::QkvoFromConfig, false, M::Dense,      R::SoftmaxTopK,    true,  1e-6, 10000,  1.0, 256, kNoRouter,       &kDecoderNames,  P::Linear,     "",             {}, kGemma2Supports, NormPlacement::Sandwich, false, true},
    // Gemma 3 text (modeling_gemma3.py, Gemma3TextConfig defaults): Gemma 2's layer with (1 + w)
    // QK-Norm per head instead of soft-caps, five local layers (rope_local_base_freq, unscaled)
    // to one global (rope_theta, rope_scaling). A "gemma3" config is read through its text_config.
    FamilyRow{Family::Gemma3Text, "gemma3_text", "Gemma3ForCausalLM",      false, false, true,  "",           B::QkvoFromConfig, false, M::Dense,      R::SoftmaxTopK,    true,  1e-6, 1e6,    1.0, 256, kNoRouter,       &kDecoderNames,  P::Linear,     "",             {}, kGemma2Supports, NormPlacement::Sandwich, false, true},
};
}  // namespace

std::span<const FamilyRow> family_table() { return kFamilies; }

const FamilyRow* find_family(std::string_view model_type) {
  for (const auto& row : kFamilies) {
    if (row.model_type == model_type) return &row;
  }
  return nullptr;
}

const FamilyRow& family_row(Family family) {
  for (const auto& row : kFamilies) {
    if (row.family == family) return row;
  }
  check_failed("family missing from the table", __FILE__, __LINE__);
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const auto& row : kFamilies) {
    out.emplace_back(row.model_type);
    if (row.family == Family::Gemma3Text) out.emplace_back("gemma3");  // read through its text_config
  }
  return out;
}

}  // namespace keel::arch
