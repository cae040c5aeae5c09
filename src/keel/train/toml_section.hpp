#pragma once
// Typed reads from one TOML table: a [section] of a run config, the [sweep] table or one
// [[variant]] of a sweep file. Every key asked for is remembered, so finish() can name a key
// nobody asked for, with the list of known keys. Errors are keel::Error(source, "<name>.<key>",
// reason); the reasons ("expected an integer", "must be at least 1, got 0", ...) are the ones the
// docs and tests quote.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <toml++/toml.h>

namespace keel::train {

// TEXT parsed as TOML; keel::Error(source, "", "not valid TOML at line N: ...") otherwise. The
// one parse of run configs, their [spikes] section alone and sweep files.
toml::table parse_toml(const std::string& text, const std::string& source);

class TomlSection {
 public:
  // `table` may be null (an absent section): every key is then absent. `name` prefixes the key in
  // errors ("optimizer", "variant.a"); `source` is the file.
  TomlSection(const toml::table* table, std::string name, std::string source);

  // Absent keys give nullopt; a present key of another type is an error.
  std::optional<std::string> string(const std::string& key);
  std::optional<bool> boolean(const std::string& key);
  // An integer of at least `min`.
  std::optional<int64_t> integer(const std::string& key, int64_t min = std::numeric_limits<int64_t>::min());
  // An integer or a float.
  std::optional<double> number(const std::string& key);
  // An array whose items are all strings; absent: empty.
  std::vector<std::string> strings(const std::string& key);
  // Any array (items checked by the caller); absent: null.
  const toml::array* array(const std::string& key);

  // The same with a fallback for an absent key.
  std::string string_or(const std::string& key, const std::string& fallback) { return string(key).value_or(fallback); }
  int64_t integer_or(const std::string& key, int64_t fallback, int64_t min = 1);
  double non_negative(const std::string& key, double fallback);  // "must be non-negative"

  // Every key of the table was asked for; else "unknown key; known keys: a, b, c".
  void finish() const;
  [[noreturn]] void fail(const std::string& key, const std::string& reason) const;

  const std::string& name() const { return name_; }

 private:
  const toml::node* find(const std::string& key);

  const toml::table* table_;
  std::string name_, source_;
  std::vector<std::string> known_;  // in the order asked
};

}  // namespace keel::train
