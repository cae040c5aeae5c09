#include "keel/io/model_dir.hpp"

#include <filesystem>

#include "keel/arch/config_file.hpp"
#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel::io {

namespace fs = std::filesystem;

LoadedModel load_model_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error(dir, "", "not a model directory (expected config.json + model.safetensors or its shards)");
  arch::LoadedConfig cfg = arch::read_config_file(dir);
  arch::ModelSpec spec = arch::spec_from_config(cfg.json, cfg.path);
  LoadedModel out;
  out.config = cfg.json;
  out.model = std::make_unique<nn::TransformerModel>(spec);
  load_weights(HfWeights::open_dir(dir), *out.model);
  return out;
}

void save_model_dir(const std::string& dir, const nlohmann::json& config, const nn::TransformerModel& model,
                    DType dtype) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir, "", "cannot create the directory: " + ec.message());
  const nn::ParameterStore& store = model.parameters();
  std::vector<TensorToWrite> tensors;
  for (const nn::ParamInfo& p : store.entries()) {
    tensors.push_back({p.name, dtype, p.shape, store.values().data() + p.offset});
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_file_atomic((fs::path(dir) / "config.json").string(), config.dump(2) + "\n");
}

}  // namespace keel::io
