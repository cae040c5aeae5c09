// libFuzzer target for the run files `keel plot` and `keel compare` read back: any bytes, taken
// as metrics.jsonl and as events.jsonl, must either parse (and then render every chart) or throw
// keel::Error naming the line; never crash, hang or overflow.
#include <cstdint>
#include <string>

#include "keel/core/error.hpp"
#include "keel/report/run_plots.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const keel::report::RunMetrics m = keel::report::parse_metrics(text, "fuzz/metrics.jsonl");
    (void)keel::report::render_run_plots(m, keel::report::PlotSettings{});
  } catch (const keel::Error&) {
  }
  try {
    (void)keel::report::parse_events(text, "fuzz/events.jsonl");
  } catch (const keel::Error&) {
  }
  return 0;
}
