#pragma once
// The keel::Error spec_from_config throws for a bad config, for the config tests to inspect.
#include <gtest/gtest.h>

#include "keel/arch/model_spec.hpp"
#include "keel/core/error.hpp"

namespace keel::arch::testing {

inline Error spec_error(const nlohmann::json& config) {
  try {
    spec_from_config(config, "cfg.json");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected an error for " << config.dump();
  return Error("", "", "");
}

}  // namespace keel::arch::testing
