#pragma once
// RUN_DIR/sweep_status.json: what `keel compare` recorded when a variant's `keel train` exited,
// read by the supervisor (train/supervisor.hpp, to skip or resume) and the sweep report.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

namespace keel::io {

// What a variant's run folder holds, from the markers keel compare writes and the checkpoints.
enum class VariantState { NotStarted, Partial, Finished, Diverged, Failed };
const char* variant_state_name(VariantState s);

// Written atomically when a child exits (not on a signal).
struct VariantStatus {
  VariantState state = VariantState::NotStarted;
  int exit_code = 0;
  int64_t steps_done = 0;           // metrics lines with a step
  std::optional<int64_t> diverged_step;
  std::string message;              // the child's last error line
};
inline constexpr const char* kSweepStatusFile = "sweep_status.json";

// The recorded status, or what the folder shows when there is no marker (NotStarted / Partial).
VariantStatus read_variant_status(const std::string& run_dir);
void write_variant_status(const std::string& run_dir, const VariantStatus& s);

// What the metrics of a run folder say: steps with a line, the last loss and validation loss,
// and the first step whose loss is not finite (null, "NaN" or "Infinity"). No file: nothing.
struct MetricsGlance {
  int64_t steps = 0;
  double last_loss = NAN, last_val = NAN;
  std::optional<int64_t> first_nonfinite;
};
MetricsGlance glance_metrics(const std::string& run_dir);

}  // namespace keel::io
