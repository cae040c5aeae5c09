#pragma once
// Typed access to the fields of a JSON config object. Every failure is a keel::Error naming the
// file, the field and what was expected, so a user can fix the config without reading code.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace keel::arch {

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& object, std::string source, std::string prefix = "");

  // Present and not null.
  bool has(const std::string& field) const;

  int64_t required_int(const std::string& field, int64_t min, int64_t max) const;
  int64_t optional_int(const std::string& field, int64_t fallback, int64_t min, int64_t max) const;
  double optional_number(const std::string& field, double fallback, double min, double max,
                         bool min_exclusive = false) const;
  bool optional_bool(const std::string& field, bool fallback) const;
  std::string optional_string(const std::string& field, const std::string& fallback) const;

  [[noreturn]] void fail(const std::string& field, const std::string& reason) const;
  const std::string& source() const { return source_; }
  const nlohmann::json& object() const { return object_; }

 private:
  int64_t as_int(const std::string& field, const nlohmann::json& value, int64_t min, int64_t max) const;
  const nlohmann::json& object_;
  std::string source_;
  std::string prefix_;
};

}  // namespace keel::arch
