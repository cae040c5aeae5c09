#pragma once
// Export of a trained run as a Hugging Face model folder that transformers'
// AutoModelForCausalLM / AutoTokenizer load as they are:
//   config.json             architectures, model_type and every field of the family's Config
//                           class written out (no defaults left to the reader), no "keel" object
//   model.safetensors       F32, the HF tensor names keel trains under
//   tokenizer.json          the run's tokenizer, byte for byte
//   generation_config.json  bos/eos ids
// Families: llama, qwen2, qwen3, olmo2, gemma2, gemma3_text. Variants transformers cannot express for the family (post or
// sandwich norms, LayerNorm, QK-Norm on llama/qwen2, bias patterns the class cannot hold,
// soft-caps, partial rotary) are refused with keel::Error naming the field; z_loss, a training
// objective only, is dropped.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "keel/arch/model_spec.hpp"

namespace keel::train {

struct SpecialTokenIds {
  std::optional<int32_t> bos, eos;
};

// The HF config.json for `spec`; `source` names the config in errors.
nlohmann::json hf_export_config(const arch::ModelSpec& spec, const SpecialTokenIds& ids);
nlohmann::json hf_generation_config(const SpecialTokenIds& ids);

struct ExportResult {
  std::string out_dir;
  std::string checkpoint_dir;  // the checkpoint exported
  int64_t parameters = 0;
};

// Writes the folder for the newest complete checkpoint of run_dir. The folder appears whole or
// not at all: everything goes to OUT.tmp-<pid>, renamed to OUT at the end. OUT must not exist
// or be an empty folder. The run must name a tokenizer ([data] tokenizer in run.toml).
ExportResult export_run(const std::string& run_dir, const std::string& out_dir);

}  // namespace keel::train
