#include "keel/train/model_source.hpp"

#include <climits>
#include <filesystem>

#include <toml++/toml.h>

#include "keel/arch/config_file.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/train/run_dir.hpp"

namespace keel::train {

namespace fs = std::filesystem;

namespace {

// Only [data] tokenizer is read: the rest of run.toml is the trainer's business, and a run
// written by an older keel must still be usable here.
std::string run_tokenizer(const std::string& run_dir) {
  const std::string toml_path = (fs::path(run_dir) / kRunConfigFile).string();
  toml::table root;
  try {
    root = toml::parse_file(toml_path);
  } catch (const toml::parse_error& e) {
    throw Error(toml_path, "", "not valid TOML: " + std::string(e.description()));
  }
  const toml::node* node = root.at_path("data.tokenizer").node();
  if (node == nullptr) return "";
  const auto* text = node->as_string();
  if (text == nullptr) throw Error(toml_path, "data.tokenizer", "expected a string (path of a tokenizer.json)");
  const std::string path = text->get();
  if (path.empty()) return "";
  if (fs::path(path).is_absolute() || fs::exists(path)) return path;
  const fs::path in_run = fs::path(run_dir) / path;
  if (fs::exists(in_run)) return in_run.string();
  throw Error(toml_path, "data.tokenizer", "'" + path + "' exists neither here nor inside the run folder");
}

}  // namespace

ModelSource resolve_model_source(const std::string& dir) {
  if (!fs::is_directory(dir)) {
    throw Error(dir, "", "not a folder (expected a model directory or a run folder)");
  }
  ModelSource s;
  if (fs::exists(fs::path(dir) / kRunConfigFile)) {
    s.run_dir = dir;
    const auto checkpoint = latest_complete_checkpoint(dir);
    if (!checkpoint) throw Error(dir, "", "the run has no complete checkpoint yet (none with a COMMIT marker)");
    s.checkpoint_dir = *checkpoint;
    s.config_path = (fs::path(dir) / kModelConfigFile).string();
    s.weights_path = (fs::path(*checkpoint) / "model.safetensors").string();
    s.tokenizer_path = run_tokenizer(dir);
  } else {
    s.config_path = (fs::path(dir) / "config.json").string();
    s.weights_path = io::HfWeights::find_in_dir(dir).value_or((fs::path(dir) / io::kWeightsFile).string());
    const fs::path generation = fs::path(dir) / "generation_config.json";
    if (fs::exists(generation)) s.generation_config_path = generation.string();
    const fs::path tok = fs::path(dir) / "tokenizer.json";
    if (fs::exists(tok)) s.tokenizer_path = tok.string();
  }
  for (const std::string& p : {s.config_path, s.weights_path}) {
    if (!fs::exists(p)) throw Error(p, "", "no such file");
  }
  return s;
}

std::vector<int32_t> generation_eos_ids(const ModelSource& source) {
  if (source.generation_config_path.empty()) return {};
  const std::string& path = source.generation_config_path;
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(read_file(path, "the generation config"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path, "", std::string("not valid JSON: ") + e.what());
  }
  if (!root.is_object()) throw Error(path, "", "must be a JSON object");
  if (!root.contains("eos_token_id") || root["eos_token_id"].is_null()) return {};
  const nlohmann::json& eos = root["eos_token_id"];
  std::vector<int32_t> ids;
  auto add = [&](const nlohmann::json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      throw Error(path, "eos_token_id", "expected a token id or a list of token ids, got " + v.dump());
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  };
  if (eos.is_array()) {
    for (const auto& v : eos) add(v);
  } else {
    add(eos);
  }
  return ids;
}

io::LoadedModel load_model_source(const ModelSource& source) {
  arch::LoadedConfig cfg = arch::read_config_file(source.config_path);
  io::LoadedModel out;
  out.model = std::make_unique<nn::TransformerModel>(arch::spec_from_config(cfg.json, cfg.path));
  out.config = std::move(cfg.json);
  io::load_weights(io::HfWeights::open(source.weights_path), *out.model);
  return out;
}

}  // namespace keel::train
