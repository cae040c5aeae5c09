#pragma once
// The training loop of `keel train --config RUN.toml`: batches drawn deterministically from a
// prepared dataset, gradient accumulation (and the batch ramp through it), global grad-norm
// clipping, AdamW under a schedule, periodic evaluation, metrics.jsonl, live progress, and
// checkpoints from which `--resume` continues bit for bit. The run is assembled from parts: the
// step's stages (step_loop.hpp), the optimizer (optimizer_factory.hpp), spike recovery
// (spike_recovery.hpp) and a checkpoint of named state objects (checkpoint.hpp, run_state.hpp).
#include <cstdint>
#include <cstdio>
#include <string>

#include "keel/dist/communicator.hpp"
#include "keel/train/run_config.hpp"

namespace keel::train {

struct TrainResult {
  int64_t steps = 0;
  int64_t tokens = 0;
  double final_loss = 0;
  double final_val_loss = 0;
  std::string run_dir;
  std::string checkpoint;   // newest complete checkpoint
};

struct TrainOptions {
  bool resume = false;      // continue RUN_DIR from its newest complete checkpoint
  bool tensorboard = false; // also write TensorBoard event files into RUN_DIR/tensorboard
  FILE* progress = stdout;  // progress lines; a terminal gets one live line
  // The processes of a data-parallel run (docs/distributed.md); null: this process alone.
  dist::Communicator* comm = nullptr;
};

// Starts the run described by `config` (a fresh run folder: an existing run with checkpoints is
// an error that points at --resume).
TrainResult train(const RunConfig& config, const TrainOptions& options);

// Continues the run in run_dir: reads its run.toml (overrides may extend run.steps, e.g.
// run.steps=2000) and resumes from its newest complete checkpoint.
TrainResult resume(const std::string& run_dir, const std::vector<std::string>& overrides, TrainOptions options);

}  // namespace keel::train
