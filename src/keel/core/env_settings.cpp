#include "keel/core/env_settings.hpp"

#include <cstdlib>

namespace keel {

const std::vector<EnvSetting>& env_settings() {
  static const std::vector<EnvSetting> table = {
      {"KEEL_GEMM", {"auto", "packed", "backend", "openblas"},
       "the kernel under every fp32 product's panels, for A/B runs (docs/blas.md)"},
      {"KEEL_BF16_GEMM", {"auto", "native", "portable"},
       "bf16 products on oneDNN's bf16 kernels or on the fp32 kernels (docs/precision.md)"},
      {"KEEL_TN_PANELS", {"auto", "transposed", "as-is"},
       "weight gradients' panels transposed into NN products or run as TN, for A/B runs (docs/blas.md)"},
      {"KEEL_THREADS", {"fixed", "adaptive"},
       "fixed keeps the OpenMP team at OMP_NUM_THREADS under load (docs/performance.md)"},
      {"KEEL_DENORMALS", {"keep", "flush"}, "keep leaves IEEE subnormals instead of flushing them to zero"},
  };
  return table;
}

namespace {

const EnvSetting* find_setting(std::string_view name) {
  for (const EnvSetting& s : env_settings())
    if (s.name == name) return &s;
  return nullptr;
}

// The table's own copy of `value` (it lives as long as the program, unlike the environment's,
// which a later setenv may free); empty if the setting does not take it.
std::string_view taken(const EnvSetting& s, std::string_view value) {
  for (std::string_view v : s.values)
    if (v == value) return v;
  return {};
}

}  // namespace

std::string_view env_setting(std::string_view name) {
  const EnvSetting* s = find_setting(name);
  if (s == nullptr) return {};
  const char* v = std::getenv(std::string(name).c_str());
  return v == nullptr ? std::string_view{} : taken(*s, v);
}

std::string env_settings_error(const char* (*lookup)(const char*)) {
  for (const EnvSetting& s : env_settings()) {
    const char* v = lookup(std::string(s.name).c_str());
    if (v == nullptr || *v == '\0' || !taken(s, v).empty()) continue;
    std::string line = "environment: " + std::string(s.name) + ": '" + v + "' is not a value it takes (";
    for (size_t i = 0; i < s.values.size(); ++i) line += (i ? ", " : "") + std::string(s.values[i]);
    return line + ")";
  }
  return "";
}

std::string env_settings_error() {
  return env_settings_error([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace keel
