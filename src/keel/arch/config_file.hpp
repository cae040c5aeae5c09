#pragma once
// Reading a config.json from disk (a file or a model folder) and `--set key=value` overrides.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/arch/model_spec.hpp"

namespace keel::arch {

struct LoadedConfig {
  std::string path;      // the config.json actually read
  nlohmann::json json;
};

// PATH is a config.json or a folder holding one. Throws keel::Error naming the path and reason.
LoadedConfig read_config_file(const std::string& path);

// Parses JSON text; `source` names it in errors.
nlohmann::json parse_config_text(const std::string& text, const std::string& source);

// Applies overrides "key=value" (dotted keys reach into objects: rope_scaling.factor=4,
// keel.norm=layernorm). The value is parsed as JSON when it is valid JSON, else taken as a string.
void apply_overrides(nlohmann::json& config, const std::vector<std::string>& overrides,
                     const std::string& source);

// read_config_file + apply_overrides + spec_from_config.
ModelSpec load_model_spec(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace keel::arch
