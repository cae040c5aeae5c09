#include "keel/arch/families.hpp"

#include <array>

#include "keel/core/error.hpp"

namespace keel::arch {

namespace {
using B = AttentionBiasRule;
using M = MoeLayout;
using R = RouterKind;

// Defaults follow each family's transformers Config class (e.g. Qwen3Config.head_dim = 128,
// Glm4MoeConfig.partial_rotary_factor = 0.5, MixtralConfig.rope_theta = 1e6).
constexpr std::array kFamilies = {
    //        family            model_type     HF class                  gpt2  mla   qkn    qk field       bias rule            mlp_b  moe         router              tie    eps    theta   rot   hd
    FamilyRow{Family::Gpt2,       "gpt2",        "GPT2LMHeadModel",        true,  false, false, "",           B::Gpt2,           false, M::Dense,      R::SoftmaxTopK,    true,  1e-5, 10000,  1.0, 0},
    FamilyRow{Family::Llama,      "llama",       "LlamaForCausalLM",       false, false, false, "",           B::QkvoFromConfig, true,  M::Dense,      R::SoftmaxTopK,    false, 1e-6, 10000,  1.0, 0},
    FamilyRow{Family::Mistral,    "mistral",     "MistralForCausalLM",     false, false, false, "",           B::None,           false, M::Dense,      R::SoftmaxTopK,    false, 1e-6, 10000,  1.0, 0},
    FamilyRow{Family::Qwen2,      "qwen2",       "Qwen2ForCausalLM",       false, false, false, "",           B::QkvAlways,      false, M::Dense,      R::SoftmaxTopK,    false, 1e-6, 10000,  1.0, 0},
    FamilyRow{Family::Qwen3,      "qwen3",       "Qwen3ForCausalLM",       false, false, true,  "",           B::QkvoFromConfig, false, M::Dense,      R::SoftmaxTopK,    false, 1e-6, 10000,  1.0, 128},
    FamilyRow{Family::Qwen3Moe,   "qwen3_moe",   "Qwen3MoeForCausalLM",    false, false, true,  "",           B::QkvoFromConfig, false, M::Qwen3Moe,   R::SoftmaxTopK,    false, 1e-6, 10000,  1.0, 128},
    FamilyRow{Family::Mixtral,    "mixtral",     "MixtralForCausalLM",     false, false, false, "",           B::None,           false, M::Mixtral,    R::SoftmaxTopK,    false, 1e-5, 1e6,    1.0, 0},
    FamilyRow{Family::DeepseekV3, "deepseek_v3", "DeepseekV3ForCausalLM",  false, true,  false, "",           B::MlaFromConfig,  false, M::DeepseekV3, R::SigmoidGrouped, false, 1e-6, 10000,  1.0, 0},
    FamilyRow{Family::KimiK2,     "kimi_k2",     "DeepseekV3ForCausalLM",  false, true,  false, "",           B::MlaFromConfig,  false, M::DeepseekV3, R::SigmoidGrouped, false, 1e-6, 10000,  1.0, 0},
    FamilyRow{Family::Glm4Moe,    "glm4_moe",    "Glm4MoeForCausalLM",     false, false, false, "use_qk_norm", B::QkvFromConfig, false, M::DeepseekV3, R::SigmoidGrouped, false, 1e-5, 10000,  0.5, 128},
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
  for (const auto& row : kFamilies) out.emplace_back(row.model_type);
  return out;
}

}  // namespace keel::arch
