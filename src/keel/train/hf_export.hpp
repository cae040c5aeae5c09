#pragma once
// Export of a trained run as a Hugging Face model folder that transformers'
// AutoModelForCausalLM / AutoTokenizer load as they are:
//   config.json             architectures, model_type and every field of the family's Config
//                           class that decides the model written out (no defaults left to the
//                           reader; docs/hf_export_fields.md lists them), no "keel" object
//   model.safetensors       F32 or BF16 (--dtype), the HF tensor names and layouts keel trains
//                           under (GPT-2's fused Conv1D c_attn, per-expert MoE tensors); above
//                           --max-shard-size, model-0000K-of-0000N.safetensors shards and
//                           model.safetensors.index.json
//   tokenizer.json          the run's tokenizer, byte for byte
//   generation_config.json  bos/eos ids
// Every family keel trains. Variants transformers cannot express for the family (another norm
// placement or kind, QK-Norm where the class has none, bias patterns the class cannot hold,
// soft-caps, partial rotary, MLA without latent norms, MoE layer patterns) are refused with
// keel::Error naming the field, and the written config must read back as the same model field
// by field; z_loss, a training objective only, is dropped. Kimi K2 is written as deepseek_v3
// (DeepseekV3ForCausalLM, the same computation, no remote code).
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "keel/arch/model_spec.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/nn/model.hpp"

namespace keel::train {

struct SpecialTokenIds {
  std::optional<int32_t> bos, eos;
};

// The HF config.json for `spec` (torch_dtype from `dtype`); errors name spec.source.
nlohmann::json hf_export_config(const arch::ModelSpec& spec, const SpecialTokenIds& ids,
                                io::DType dtype = io::DType::F32);
nlohmann::json hf_generation_config(const SpecialTokenIds& ids);

struct ExportResult {
  std::string out_dir;
  std::string checkpoint_dir;  // the checkpoint exported
  int64_t parameters = 0;
};

inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;  // transformers' "5GB"

struct ExportOptions {
  io::DType dtype = io::DType::F32;                 // F32 or BF16 (rounded to nearest even)
  int64_t max_shard_bytes = kDefaultMaxShardBytes;  // above this, shards and an index
};

// "5GB" (10⁹), "500MiB" (2²⁰), "123456" (bytes), as transformers' max_shard_size reads them.
int64_t parse_shard_size(const std::string& text);

// Writes the folder for a model in memory (tokenizer_path may be empty: no tokenizer.json). The
// folder appears whole or not at all: everything goes to OUT.tmp-<pid>, renamed to OUT at the
// end. OUT must not exist or be an empty folder.
void write_hf_folder(const nn::TransformerModel& model, const SpecialTokenIds& ids, const std::string& tokenizer_path,
                     const std::string& out_dir, const ExportOptions& options = {});

// The folder for the newest complete checkpoint of run_dir. The run must name a tokenizer
// ([data] tokenizer in run.toml).
ExportResult export_run(const std::string& run_dir, const std::string& out_dir, const ExportOptions& options = {});

}  // namespace keel::train
