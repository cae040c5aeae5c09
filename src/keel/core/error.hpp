#pragma once
// Errors in keel: a keel::Error names where the bad input came from (file), what part of it
// (field) and why it is wrong (reason). Library code throws it; only the CLI prints and exits.
// Broken internal invariants are not user errors: KEEL_CHECK aborts with file:line.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace keel {

class Error : public std::runtime_error {
 public:
  Error(std::string file, std::string field, std::string reason)
      : std::runtime_error(format(file, field, reason)),
        file_(std::move(file)),
        field_(std::move(field)),
        reason_(std::move(reason)) {}

  const std::string& file() const { return file_; }
  const std::string& field() const { return field_; }
  const std::string& reason() const { return reason_; }
  // Raised the same on every process of a data-parallel run (they agreed on it): only rank 0
  // needs to print it, and no process is left waiting.
  bool everywhere() const { return everywhere_; }
  void set_everywhere() { everywhere_ = true; }

 private:
  static std::string format(const std::string& file, const std::string& field,
                            const std::string& reason) {
    std::string out = file.empty() ? std::string("<input>") : file;
    if (!field.empty()) out += ": field '" + field + "'";
    out += ": " + reason;
    return out;
  }
  std::string file_, field_, reason_;
  bool everywhere_ = false;
};

[[noreturn]] inline void check_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "keel: internal check failed: %s at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace keel

#define KEEL_CHECK(cond) \
  do {                   \
    if (!(cond)) ::keel::check_failed(#cond, __FILE__, __LINE__); \
  } while (0)
