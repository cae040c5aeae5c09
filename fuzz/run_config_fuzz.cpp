// libFuzzer target for the TOML files a user hands keel: any bytes, taken as a run config
// (`keel train --config`), as the [spikes] section alone (`keel spikes`) and as a sweep file
// (`keel compare`), must either parse into a typed config whose TOML rendering parses back, or
// throw keel::Error; never crash or hang.
#include <cstdint>
#include <string>

#include "keel/core/error.hpp"
#include "keel/train/run_config.hpp"
#include "keel/train/sweep.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const keel::train::RunConfig c = keel::train::parse_run_config(text, "fuzz.toml");
    (void)keel::train::parse_run_config(keel::train::to_toml(c), "fuzz-roundtrip.toml");
  } catch (const keel::Error&) {
  }
  try {
    (void)keel::train::parse_spike_config(text, "fuzz-spikes.toml", {"spikes.grad_norm=alone"});
  } catch (const keel::Error&) {
  }
  try {
    (void)keel::train::parse_sweep(text, "fuzz-sweep.toml");
  } catch (const keel::Error&) {
  }
  return 0;
}
