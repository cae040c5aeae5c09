#pragma once
// The run folder's layout lives in io/run_dir.hpp (report/ reads it without reaching train/); its
// names stay visible here for the trainer and checkpoints.
#include "keel/io/run_dir.hpp"

namespace keel::train {

using io::checkpoint_dir_name;
using io::complete_checkpoints;
using io::kCheckpointsDir;
using io::kCommitMarker;
using io::kEventsFile;
using io::kMetricsFile;
using io::kModelConfigFile;
using io::kRunConfigFile;
using io::latest_complete_checkpoint;

}  // namespace keel::train
