#include "keel/arch/config_reader.hpp"

#include <cmath>

#include "keel/core/error.hpp"

namespace keel::arch {

namespace {
std::string type_name(const nlohmann::json& v) {
  if (v.is_number_float()) return "a non-integer number";
  if (v.is_number()) return "an integer";
  return std::string("a ") + v.type_name();
}
}  // namespace

ConfigReader::ConfigReader(const nlohmann::json& object, std::string source, std::string prefix)
    : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

void ConfigReader::fail(const std::string& field, const std::string& reason) const {
  throw Error(source_, prefix_ + field, reason);
}

bool ConfigReader::has(const std::string& field) const {
  auto it = object_.find(field);
  return it != object_.end() && !it->is_null();
}

int64_t ConfigReader::as_int(const std::string& field, const nlohmann::json& v, int64_t min,
                             int64_t max) const {
  int64_t value = 0;
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) fail(field, "must be at most " + std::to_string(max) + ", got " + v.dump());
    value = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    value = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 9e15) {
    // 4096.0 is an integer written as a float; accept it as HF's json loader would.
    value = static_cast<int64_t>(v.get<double>());
  } else {
    fail(field, "expected an integer, got " + type_name(v) + " (" + v.dump() + ")");
  }
  if (value < min) {
    fail(field, min == 1 ? "must be positive, got " + std::to_string(value)
                         : "must be at least " + std::to_string(min) + ", got " + std::to_string(value));
  }
  if (value > max) fail(field, "must be at most " + std::to_string(max) + ", got " + std::to_string(value));
  return value;
}

int64_t ConfigReader::required_int(const std::string& field, int64_t min, int64_t max) const {
  auto it = object_.find(field);
  if (it == object_.end()) fail(field, "is required but missing");
  if (it->is_null()) fail(field, "is required but null");
  return as_int(field, *it, min, max);
}

int64_t ConfigReader::optional_int(const std::string& field, int64_t fallback, int64_t min,
                                   int64_t max) const {
  if (!has(field)) return fallback;
  return as_int(field, object_.at(field), min, max);
}

double ConfigReader::optional_number(const std::string& field, double fallback, double min,
                                     double max, bool min_exclusive) const {
  if (!has(field)) return fallback;
  const auto& v = object_.at(field);
  if (!v.is_number()) fail(field, "expected a number, got " + type_name(v) + " (" + v.dump() + ")");
  double value = v.get<double>();
  if (!std::isfinite(value)) fail(field, "must be finite");
  if (min_exclusive ? !(value > min) : !(value >= min)) {
    fail(field, std::string("must be ") + (min_exclusive ? "greater than " : "at least ") +
                    nlohmann::json(min).dump() + ", got " + v.dump());
  }
  if (value > max) fail(field, "must be at most " + nlohmann::json(max).dump() + ", got " + v.dump());
  return value;
}

bool ConfigReader::optional_bool(const std::string& field, bool fallback) const {
  if (!has(field)) return fallback;
  const auto& v = object_.at(field);
  if (!v.is_boolean()) fail(field, "expected true or false, got " + type_name(v) + " (" + v.dump() + ")");
  return v.get<bool>();
}

std::string ConfigReader::optional_string(const std::string& field, const std::string& fallback) const {
  if (!has(field)) return fallback;
  const auto& v = object_.at(field);
  if (!v.is_string()) fail(field, "expected a string, got " + type_name(v) + " (" + v.dump() + ")");
  return v.get<std::string>();
}

}  // namespace keel::arch
