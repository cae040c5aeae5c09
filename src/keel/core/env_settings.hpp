#pragma once
// The KEEL_* environment settings that steer how keel runs (which GEMM kernels, how many threads,
// subnormal floats), in one table: each is read the same way, and a value keel does not take is
// an error when a command starts instead of the default taken silently (a misspelt
// KEEL_GEMM=packd would otherwise benchmark the kernel it was meant to rule out). The fault
// injection settings of train/faults.hpp parse their own values and are not listed here.
#include <string>
#include <string_view>
#include <vector>

namespace keel {

struct EnvSetting {
  std::string_view name;
  std::vector<std::string_view> values;  // the values it takes
  std::string_view effect;               // what it does, one line (docs/usage.md lists the same)
};
const std::vector<EnvSetting>& env_settings();

// The value of the listed setting `name` when it is set to one it takes; empty when it is unset,
// set empty, or set to a value it does not take (env_settings_error names that one).
std::string_view env_setting(std::string_view name);

// One line naming the first listed setting set to a value it does not take, and the values it
// takes; empty when every setting is unset, empty or known. `lookup` stands in for getenv.
std::string env_settings_error(const char* (*lookup)(const char*));
std::string env_settings_error();

}  // namespace keel
