#pragma once
// The training step as a sequence of named stages, and the loop over steps:
//   batch            BatchSource::plan / draw                    batch.hpp
//   forward/backward forward_backward                            forward_backward.hpp
//   (faults)         FaultPlan::after_backward                   faults.hpp
//   reduction        GradientReducer::reduce                     gradient_reducer.hpp
//   (measure)        loss, pre-clip gradient norm, lr
//   spike decision   SpikeRecovery::before_update                spike_recovery.hpp
//   clipping         clip_gradients                              update.hpp
//   update           UpdateStage::apply (+ after_nonfinite_update, undo)
//   post-update      PostUpdateHook (router bias, QK-Clip)       post_update.hpp
//   evaluation       Evaluation::maybe_run                       evaluation.hpp
//   metrics          MetricsSink (metrics.jsonl, TensorBoard, progress)  metrics.hpp, progress.hpp
//   checkpoint       Checkpointing::after_step                   checkpointing.hpp
// A part left null (or a list left empty) is a stage the run does without: `keel train --model
// --tokens` has no spike decision, evaluation or checkpoints.
#include <cstdint>
#include <functional>
#include <vector>

#include "keel/nn/model.hpp"
#include "keel/train/batch.hpp"
#include "keel/train/checkpoint.hpp"
#include "keel/train/checkpointing.hpp"
#include "keel/train/evaluation.hpp"
#include "keel/train/faults.hpp"
#include "keel/train/forward_backward.hpp"
#include "keel/train/gradient_reducer.hpp"
#include "keel/train/metrics.hpp"
#include "keel/train/post_update.hpp"
#include "keel/train/spike_recovery.hpp"
#include "keel/train/step.hpp"
#include "keel/train/update.hpp"

namespace keel::train {

struct TrainerParts {
  nn::TransformerModel* model = nullptr;
  BatchSource* batches = nullptr;
  GradientReducer* reducer = nullptr;
  UpdateStage* update = nullptr;
  std::function<double(int64_t step, int64_t tokens)> lr_at;  // a pure function of the step
  double clip = 0;                       // global grad-norm threshold; 0 = off
  FaultPlan* faults = nullptr;
  SpikeRecovery* spikes = nullptr;       // null: every update is applied
  Checkpoint* checkpoint = nullptr;      // what a rollback loads (needed with spikes)
  std::vector<PostUpdateHook*> hooks;    // in order
  Evaluation* evaluation = nullptr;
  std::vector<MetricsSink*> metrics;
  Checkpointing* checkpointing = nullptr;
};

// Takes steps until state.step reaches last_step. Returns the mean cross-entropy of the last step
// taken (NaN when none was).
double run_steps(TrainerParts& parts, TrainState& state, int64_t last_step);

}  // namespace keel::train
