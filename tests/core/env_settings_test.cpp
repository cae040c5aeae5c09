// The KEEL_* environment settings: a value keel does not take is named with the values it does,
// and only a taken value is read.
#include "keel/core/env_settings.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
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
            "environment: KEEL_GEMM: 'packd' is not a value it takes (auto, packed, backend, openblas)");
  EXPECT_EQ(error_with("KEEL_BF16_GEMM", "Native"),  // case matters, as it does to the reader
            "environment: KEEL_BF16_GEMM: 'Native' is not a value it takes (auto, native, portable)");
  EXPECT_NE(error_with("KEEL_THREADS", "2").find("KEEL_THREADS: '2'"), std::string::npos);
  EXPECT_NE(error_with("KEEL_DENORMALS", "off").find("(keep, flush)"), std::string::npos);
  EXPECT_NE(error_with("KEEL_TN_PANELS", "as_is").find("(auto, transposed, as-is)"), std::string::npos);
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

// docs/usage.md's table lists every setting with exactly the values it takes.
TEST(EnvSettings, UsageDocListsEverySettingAndItsValues) {
  std::ifstream in(std::string(KEEL_SOURCE_DIR) + "/docs/usage.md");
  ASSERT_TRUE(in) << "docs/usage.md";
  std::map<std::string, std::string> rows;  // name -> its row's values cell
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `KEEL_", 0) != 0) continue;
    const size_t name_end = line.find('`', 3);
    const size_t cell = line.find('|', name_end);
    rows[line.substr(3, name_end - 3)] = line.substr(cell + 1, line.find('|', cell + 1) - cell - 1);
  }
  EXPECT_EQ(rows.size(), env_settings().size());
  for (const EnvSetting& s : env_settings()) {
    const auto row = rows.find(std::string(s.name));
    ASSERT_NE(row, rows.end()) << s.name << " is not in docs/usage.md's table";
    std::string expected;
    for (size_t i = 0; i < s.values.size(); ++i) expected += (i ? ", `" : " `") + std::string(s.values[i]) + "`";
    EXPECT_EQ(row->second, expected + " ") << s.name;
  }
}

}  // namespace
}  // namespace keel
