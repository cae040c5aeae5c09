#include "keel/train/hf_export.hpp"

#include <unistd.h>

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

// Qwen2/Qwen3 config fields for full attention in every layer: sliding_window stays null while
// use_sliding_window is off.
void full_attention_layers(json& c, const arch::ModelSpec& spec) {
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  c["max_window_layers"] = spec.num_layers;
  c["layer_types"] = json::array();
  for (int64_t l = 0; l < spec.num_layers; ++l) c["layer_types"].push_back("full_attention");
}

// Refuses what transformers' class for this family cannot express. Checked from the spec, so a
// variant reached through any route (keel object, --set) is caught.
void check_expressible(const arch::ModelSpec& spec) {
  const std::string& src = spec.source;
  const std::string family(arch::to_string(spec.family));
  const auto& a = spec.attention;
  if (!arch::family_row(spec).supports.export_hf) {
    std::vector<std::string> names;
    for (const arch::FamilyRow& row : arch::family_table()) {
      if (row.supports.export_hf) names.emplace_back(row.model_type);
    }
    std::string list;
    for (size_t i = 0; i < names.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
    }
    throw Error(src, "model_type", "export supports " + list + ", not " + spec.model_type);
  }
  const arch::NormPlacement own = arch::family_row(spec).placement;
  if (spec.placement != own) {
    throw Error(src, "keel.norm_placement",
                std::string(arch::to_string(spec.placement)) + " norms have no place in " + family +
                    "'s decoder layer (" + std::string(arch::to_string(own)) + " only)");
  }
  if (a.qk_norm && a.qk_norm_full_width != arch::family_row(spec).qk_norm_full_width) {
    throw Error(src, "keel.qk_norm",
                family + "'s q_norm/k_norm are " + (a.qk_norm_full_width ? "per head" : "full width") + ", not " +
                    (a.qk_norm_full_width ? "full width" : "per head"));
  }
  if (spec.norm != arch::NormKind::RmsNorm) {
    throw Error(src, "keel.norm", family + " uses RMSNorm; transformers cannot load LayerNorm weights into it");
  }
  // Gemma 2 has both soft-caps (any values, or off) and scales its embeddings by √hidden_size.
  const bool gemma = arch::family_row(spec).gemma_fields;
  if (!gemma && a.softcap > 0) throw Error(src, "keel.attn_softcap", family + " has no attention logit soft-cap");
  if (spec.mlp.kind != arch::FfnKind::Gated) throw Error(src, "keel.mlp", family + "'s MLP is gated (gate_proj)");
  if (!gemma && spec.final_softcap > 0) throw Error(src, "keel.final_softcap", family + " has no final logit soft-cap");
  const double own_scale = gemma ? std::sqrt(static_cast<double>(spec.hidden_size)) : 1.0;
  if (spec.embed_scale != own_scale) {
    throw Error(src, "keel.embed_scale",
                family + (gemma ? " scales its embeddings by sqrt(hidden_size) only" : " does not scale its embeddings"));
  }
  if (a.rope.rotary_dim != a.head_dim) {
    throw Error(src, "partial_rotary_factor", family + " rotates the whole head (partial_rotary_factor 1)");
  }
  switch (spec.family) {
    case arch::Family::Llama:
      if (a.qk_norm) throw Error(src, "keel.qk_norm", "llama has no q_norm/k_norm");
      if (a.qkv_bias != a.o_bias) {
        throw Error(src, "keel.qkv_bias", "llama's attention_bias puts biases on q, k, v and o together");
      }
      if (spec.hidden_size % a.num_heads != 0) {
        throw Error(src, "num_attention_heads", "LlamaConfig requires hidden_size divisible by num_attention_heads");
      }
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
      if (!a.qk_norm) throw Error(src, "keel.qk_norm", "qwen3 always applies q_norm/k_norm");
      if (a.qkv_bias != a.o_bias) {
        throw Error(src, "keel.qkv_bias", "qwen3's attention_bias puts biases on q, k, v and o together");
      }
      break;
    case arch::Family::Gemma3Text:
      if (!a.qk_norm) throw Error(src, "keel.qk_norm", "gemma3_text always applies q_norm/k_norm");
      if (a.qkv_bias != a.o_bias) {
        throw Error(src, "keel.qkv_bias", "gemma3_text's attention_bias puts biases on q, k, v and o together");
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
    case arch::Family::Gpt2:
    case arch::Family::Mistral:
    case arch::Family::Qwen3Moe:
    case arch::Family::Mixtral:
    case arch::Family::DeepseekV3:
    case arch::Family::KimiK2:
    case arch::Family::Glm4Moe:
      break;  // refused above
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

json hf_export_config(const arch::ModelSpec& spec, const SpecialTokenIds& ids) {
  check_expressible(spec);
  const auto& a = spec.attention;
  const arch::FamilyRow& row = arch::family_row(spec.family);
  json c = json::object();
  c["architectures"] = json::array({std::string(row.hf_architecture)});
  c["model_type"] = spec.model_type;
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
  c["tie_word_embeddings"] = spec.tie_word_embeddings;
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = id_or_null(ids.bos);
  c["eos_token_id"] = id_or_null(ids.eos);
  c["torch_dtype"] = "float32";
  c["use_cache"] = true;
  switch (spec.family) {
    case arch::Family::Llama:
      c["attention_bias"] = a.qkv_bias;
      c["mlp_bias"] = spec.mlp.bias;
      c["pretraining_tp"] = 1;
      break;
    case arch::Family::Qwen3:
      c["attention_bias"] = a.qkv_bias;  // Qwen3Config has the switch; Qwen2's q/k/v biases are fixed
      full_attention_layers(c, spec);
      break;
    case arch::Family::Qwen2:
      full_attention_layers(c, spec);
      break;
    case arch::Family::Olmo2:
      c["attention_bias"] = a.qkv_bias;
      c.erase("head_dim");  // Olmo2Config derives it; checked equal above
      break;
    case arch::Family::Gemma2:
    case arch::Family::Gemma3Text: {
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
      if (spec.family == arch::Family::Gemma3Text) c["rope_local_base_freq"] = a.rope.local_theta;
      break;
    }
    case arch::Family::Gpt2:
    case arch::Family::Mistral:
    case arch::Family::Qwen3Moe:
    case arch::Family::Mixtral:
    case arch::Family::DeepseekV3:
    case arch::Family::KimiK2:
    case arch::Family::Glm4Moe:
      break;  // check_expressible refused them
  }
  return c;
}

json hf_generation_config(const SpecialTokenIds& ids) {
  return json{{"_from_model_config", true}, {"bos_token_id", id_or_null(ids.bos)},
              {"eos_token_id", id_or_null(ids.eos)}};
}

ExportResult export_run(const std::string& run_dir, const std::string& out_dir) {
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
  const json config = hf_export_config(model.spec(), ids);  // refuses before anything is written

  std::error_code ec;
  if (fs::exists(out_dir, ec) && !(fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec))) {
    throw Error(out_dir, "", "already exists and is not an empty folder");
  }
  const fs::path target = fs::path(out_dir).lexically_normal();
  const fs::path staging = target.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec) throw Error(staging.string(), "", "cannot create the folder: " + ec.message());
  try {
    const nn::ParameterStore& store = model.parameters();
    std::vector<io::TensorToWrite> tensors;
    for (const nn::ParamInfo& p : store.entries()) {
      tensors.push_back({p.name, io::DType::F32, p.shape, store.values().data() + p.offset});
    }
    io::write_safetensors((staging / "model.safetensors").string(), tensors, {{"format", "pt"}});
    write_file_atomic((staging / "config.json").string(), config.dump(2) + "\n");
    write_file_atomic((staging / "generation_config.json").string(), hf_generation_config(ids).dump(2) + "\n");
    write_file_atomic((staging / "tokenizer.json").string(), read_file(source.tokenizer_path, "the tokenizer"));
    // rename(2) replaces an empty directory atomically.
    fs::rename(staging, target, ec);
    if (ec) throw Error(out_dir, "", "cannot move the finished export into place: " + ec.message());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    throw;
  }
  return {out_dir, source.checkpoint_dir, model.parameters().size()};
}

}  // namespace keel::train
