#pragma once
// The layout of a training run's folder, in one place:
//
//   RUN_DIR/run.toml                      the resolved run config (after --set overrides)
//   RUN_DIR/config.json                   the model's HF config.json (with any "keel" object)
//   RUN_DIR/metrics.jsonl                 one JSON object per step; evaluation lines carry val_loss
//   RUN_DIR/events.jsonl                  spikes, skips, rollbacks, damaged checkpoints, aborts
//                                         (append-only; metrics.jsonl is rewritten on rollback/resume)
//   RUN_DIR/checkpoints/step_NNNNNNNN/    one checkpoint:
//       model.safetensors                 parameters under HF names (F32)
//       optimizer.safetensors             optimizer state by parameter name
//       state.json                        step, tokens, data cursor, RNG, schedule, per-tensor checksums
//       COMMIT                            written last; a checkpoint without it is incomplete
#include <optional>
#include <string>
#include <vector>

namespace keel::io {

inline constexpr const char* kRunConfigFile = "run.toml";
inline constexpr const char* kModelConfigFile = "config.json";
inline constexpr const char* kMetricsFile = "metrics.jsonl";
inline constexpr const char* kEventsFile = "events.jsonl";
inline constexpr const char* kCheckpointsDir = "checkpoints";
inline constexpr const char* kCommitMarker = "COMMIT";

std::string checkpoint_dir_name(int64_t step);  // "step_00000100"

// Complete checkpoints (COMMIT present) of a run, oldest first.
std::vector<std::string> complete_checkpoints(const std::string& run_dir);
// The newest complete checkpoint's folder, or nullopt when there is none.
std::optional<std::string> latest_complete_checkpoint(const std::string& run_dir);

}  // namespace keel::io
