#include "keel/io/model_dir.hpp"

#include <filesystem>
#include <set>

#include "keel/arch/config_file.hpp"
#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel::io {

namespace fs = std::filesystem;

namespace {

// Some checkpoints spell names without the family's leading module (GPT-2 with and without
// "transformer."); keel's names carry it. The head sits outside that module.
std::string canonical_name(const std::string& name, const nn::TransformerModel& model) {
  const arch::FamilyRow& row = arch::family_row(model.spec());
  const std::string_view prefix = row.optional_prefix;
  const std::string head = arch::tensor_name(*row.names, {arch::TensorKind::LmHead});
  if (!prefix.empty() && !name.starts_with(prefix) && name != head) return std::string(prefix) + name;
  return name;
}

// Tensors a real checkpoint may hold that are not parameters: the family's buffers (GPT-2's
// causal masks) and a copy of a tied head.
bool ignorable(const std::string& name, const nn::TransformerModel& model) {
  const arch::FamilyRow& row = arch::family_row(model.spec());
  for (std::string_view ending : row.ignored_buffers) {
    if (!ending.empty() && name.ends_with(ending)) return true;
  }
  return model.spec().tie_word_embeddings && name == arch::tensor_name(*row.names, {arch::TensorKind::LmHead});
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

void load_weights(const SafetensorsFile& file, nn::TransformerModel& model) {
  nn::ParameterStore& store = model.parameters();
  std::set<std::string> seen;
  for (const TensorRecord& t : file.tensors()) {
    const std::string name = canonical_name(t.name, model);
    const nn::ParamInfo* p = store.find(name);
    if (p == nullptr) {
      if (ignorable(t.name, model) || (name != t.name && ignorable(name, model))) continue;
      throw Error(file.path(), t.name, "unexpected tensor: the config has no parameter of that name");
    }
    if (t.shape != p->shape) {
      throw Error(file.path(), t.name, "shape " + shape_string(t.shape) + " does not match the config's " +
                                           shape_string(p->shape));
    }
    if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16) {
      throw Error(file.path(), t.name, "dtype " + std::string(to_string(t.dtype)) + " is not a float type");
    }
    if (!seen.insert(name).second) throw Error(file.path(), t.name, "appears twice (with and without prefix)");
    std::vector<float> values = file.read_f32(t.name);
    std::memcpy(store.data(name), values.data(), values.size() * sizeof(float));
  }
  for (const nn::ParamInfo& p : store.entries()) {
    if (!seen.contains(p.name)) throw Error(file.path(), p.name, "missing tensor required by the config");
  }
}

LoadedModel load_model_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error(dir, "", "not a model directory (expected config.json + model.safetensors)");
  arch::LoadedConfig cfg = arch::read_config_file(dir);
  arch::ModelSpec spec = arch::spec_from_config(cfg.json, cfg.path);
  LoadedModel out;
  out.config = cfg.json;
  out.model = std::make_unique<nn::TransformerModel>(spec);
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  if (!fs::exists(weights)) throw Error(weights, "", "no such file");
  load_weights(SafetensorsFile::open(weights), *out.model);
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
