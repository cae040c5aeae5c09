// The KEEL_* environment settings: a value keel does not take is named with the values it does,
// and only a taken value is read.
#include "keel/core/env_settings.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace keel {
namespace {

// A stand-in environment holding one setting.
const char* stub_name = nullptr;
const char* stub_value = nullptr;
const char* stub_lookup(const char* name) {
  return stub_name != nullptr && std::strcmp(name, stub_name) == 0 ? stub_value : nullptr;
}

std::string error_with(const char* name, const char* value) {
  stub_name = name;
  stub_value = value;
  const std::string e = env_settings_error(stub_lookup);
  stub_name = stub_value = nullptr;
  return e;
}

TEST(EnvSettings, UnknownValueNamesTheSettingAndWhatItTakes) {
  EXPECT_EQ(error_with("KEEL_GEMM", "packd"),
            "environment: KEEL_GEMM: 'packd' is not a value it takes (packed, backend, openblas)");
  EXPECT_EQ(error_with("KEEL_BF16_GEMM", "Native"),  // case matters, as it does to the reader
            "environment: KEEL_BF16_GEMM: 'Native' is not a value it takes (native, portable)");
  EXPECT_NE(error_with("KEEL_THREADS", "2").find("KEEL_THREADS: '2'"), std::string::npos);
  EXPECT_NE(error_with("KEEL_DENORMALS", "off").find("(keep, flush)"), std::string::npos);
  EXPECT_NE(error_with("KEEL_TN_PANELS", "as_is").find("(transposed, as-is)"), std::string::npos);
}

TEST(EnvSettings, EveryValueItTakesAndNoValuePass) {
  EXPECT_EQ(error_with(nullptr, nullptr), "");
  ASSERT_EQ(env_settings().size(), 5u);
  for (const EnvSetting& s : env_settings()) {
    const std::string name(s.name);
    EXPECT_EQ(name.rfind("KEEL_", 0), 0u) << name;
    EXPECT_FALSE(s.effect.empty()) << name;
    EXPECT_EQ(error_with(name.c_str(), ""), "") << name;  // set empty: as unset
    for (std::string_view v : s.values) EXPECT_EQ(error_with(name.c_str(), std::string(v).c_str()), "") << name << "=" << v;
    EXPECT_NE(error_with(name.c_str(), "no-such-value"), "") << name;
  }
  EXPECT_EQ(error_with("KEEL_NOT_A_SETTING", "x"), "");  // only the listed ones are checked
}

TEST(EnvSettings, ReadsOnlyAValueItTakes) {
  const char* found = std::getenv("KEEL_TN_PANELS");
  const std::string saved = found != nullptr ? found : "";
  ::setenv("KEEL_TN_PANELS", "as-is", 1);
  EXPECT_EQ(env_setting("KEEL_TN_PANELS"), "as-is");
  ::setenv("KEEL_TN_PANELS", "sideways", 1);
  EXPECT_EQ(env_setting("KEEL_TN_PANELS"), "");
  ::unsetenv("KEEL_TN_PANELS");
  EXPECT_EQ(env_setting("KEEL_TN_PANELS"), "");
  EXPECT_EQ(env_setting("KEEL_NOT_A_SETTING"), "");
  if (found != nullptr) ::setenv("KEEL_TN_PANELS", saved.c_str(), 1);
}

}  // namespace
}  // namespace keel
