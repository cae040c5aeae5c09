// Typed reads from one TOML table: see toml_section.hpp.
#include "keel/train/toml_section.hpp"

#include <algorithm>

#include "keel/core/error.hpp"

namespace keel::train {

toml::table parse_toml(const std::string& text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& err) {
    throw Error(source, "", "not valid TOML at line " + std::to_string(err.source().begin.line) + ": " +
                                std::string(err.description()));
  }
}


TomlSection::TomlSection(const toml::table* table, std::string name, std::string source)
    : table_(table), name_(std::move(name)), source_(std::move(source)) {}

const toml::node* TomlSection::find(const std::string& key) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.push_back(key);
  return table_ ? table_->get(key) : nullptr;
}

std::optional<std::string> TomlSection::string(const std::string& key) {
  const toml::node* n = find(key);
  if (!n) return std::nullopt;
  if (!n->is_string()) fail(key, "expected a string");
  return *n->value<std::string>();
}

std::optional<bool> TomlSection::boolean(const std::string& key) {
  const toml::node* n = find(key);
  if (!n) return std::nullopt;
  if (!n->is_boolean()) fail(key, "expected true or false");
  return *n->value<bool>();
}

std::optional<int64_t> TomlSection::integer(const std::string& key, int64_t min) {
  const toml::node* n = find(key);
  if (!n) return std::nullopt;
  if (!n->is_integer()) fail(key, "expected an integer");
  const int64_t v = *n->value<int64_t>();
  if (v < min) fail(key, "must be at least " + std::to_string(min) + ", got " + std::to_string(v));
  return v;
}

std::optional<double> TomlSection::number(const std::string& key) {
  const toml::node* n = find(key);
  if (!n) return std::nullopt;
  if (!n->is_number()) fail(key, "expected a number");
  return *n->value<double>();
}

std::vector<std::string> TomlSection::strings(const std::string& key) {
  std::vector<std::string> out;
  const toml::node* n = find(key);
  if (!n) return out;
  if (!n->is_array()) fail(key, "expected an array of strings");
  for (const auto& item : *n->as_array()) {
    if (!item.is_string()) fail(key, "expected an array of strings");
    out.push_back(*item.value<std::string>());
  }
  return out;
}

const toml::array* TomlSection::array(const std::string& key) {
  const toml::node* n = find(key);
  if (!n) return nullptr;
  if (!n->is_array()) fail(key, "expected an array");
  return n->as_array();
}

int64_t TomlSection::integer_or(const std::string& key, int64_t fallback, int64_t min) {
  return integer(key, min).value_or(fallback);
}

double TomlSection::non_negative(const std::string& key, double fallback) {
  const double v = number(key).value_or(fallback);
  if (!(v >= 0)) fail(key, "must be non-negative");
  return v;
}

void TomlSection::finish() const {
  if (!table_) return;
  for (const auto& [key, value] : *table_) {
    const std::string k(key.str());
    if (std::find(known_.begin(), known_.end(), k) != known_.end()) continue;
    std::string known;
    for (const auto& name : known_) known += (known.empty() ? "" : ", ") + name;
    fail(k, "unknown key; known keys: " + (known.empty() ? std::string("none") : known));
  }
}

void TomlSection::fail(const std::string& key, const std::string& reason) const {
  throw Error(source_, name_ + "." + key, reason);
}

}  // namespace keel::train
