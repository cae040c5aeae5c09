// libFuzzer target for the config loader: any bytes, taken as config.json text, must either
// produce a spec whose accounting and description succeed, or throw keel::Error; never crash,
// hang or overflow.
#include <cstdint>
#include <string>

#include "keel/arch/accounting.hpp"
#include "keel/arch/config_file.hpp"
#include "keel/arch/describe.hpp"
#include "keel/arch/model_spec.hpp"
#include "keel/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const nlohmann::json json = keel::arch::parse_config_text(text, "fuzz");
    const keel::arch::ModelSpec spec = keel::arch::spec_from_config(json, "fuzz");
    const keel::arch::Accounting acc = keel::arch::account(spec, 128);
    const nlohmann::json description = keel::arch::describe(spec, acc);
    (void)description.dump();
  } catch (const keel::Error&) {
    // Rejected config: the expected outcome for most mutations.
  }
  return 0;
}
