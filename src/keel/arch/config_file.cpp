#include "keel/arch/config_file.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel::arch {

namespace fs = std::filesystem;

namespace {
constexpr std::uintmax_t kMaxConfigBytes = 16u << 20;  // real configs are a few KB
}

nlohmann::json parse_config_text(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // parse_error for syntax, out_of_range for numbers beyond double ("1e999").
    std::string what = e.what();
    // Drop the library's "[json.exception.parse_error.101] " tag; keep position and reason.
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    throw Error(source, "", "not valid JSON: " + what);
  }
}

LoadedConfig read_config_file(const std::string& path) {
  std::error_code ec;
  fs::path p(path);
  auto status = fs::status(p, ec);
  if (ec || !fs::exists(status)) throw Error(path, "", "no such file or directory");
  if (fs::is_directory(status)) {
    p /= "config.json";
    if (!fs::is_regular_file(p, ec)) throw Error(path, "", "folder holds no config.json");
  } else if (!fs::is_regular_file(status)) {
    throw Error(path, "", "not a regular file");
  }
  const std::string file = p.string();
  auto size = fs::file_size(p, ec);
  if (ec) throw Error(file, "", "cannot read the file size: " + ec.message());
  if (size > kMaxConfigBytes) throw Error(file, "", "file is " + std::to_string(size) + " bytes; a config.json is at most 16 MiB");
  return {file, parse_config_text(read_file(file, "the config"), file)};
}

void apply_overrides(nlohmann::json& config, const std::vector<std::string>& overrides,
                     const std::string& source) {
  for (const auto& item : overrides) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw Error(source, item, "an override must look like key=value");
    }
    const std::string key = item.substr(0, eq);
    const std::string text = item.substr(eq + 1);
    nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = text;
    if (!config.is_object()) throw Error(source, key, "cannot override a field: the config is not an object");
    nlohmann::json* node = &config;
    std::string::size_type start = 0;
    while (true) {
      auto dot = key.find('.', start);
      std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (part.empty()) throw Error(source, key, "empty component in the override key");
      if (dot == std::string::npos) {
        (*node)[part] = value;
        break;
      }
      nlohmann::json& child = (*node)[part];
      if (child.is_null()) child = nlohmann::json::object();
      if (!child.is_object()) throw Error(source, key, "'" + part + "' is not an object");
      node = &child;
      start = dot + 1;
    }
  }
}

ModelSpec load_model_spec(const std::string& path, const std::vector<std::string>& overrides) {
  LoadedConfig loaded = read_config_file(path);
  apply_overrides(loaded.json, overrides, loaded.path);
  return spec_from_config(loaded.json, loaded.path);
}

}  // namespace keel::arch
