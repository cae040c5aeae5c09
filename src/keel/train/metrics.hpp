#pragma once
// The metrics stage: what each step reports. metrics.jsonl gets one JSON object per step (keys in
// docs/training.md), TensorBoard a few scalars, the terminal a progress line (progress.hpp).
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "keel/arch/model_spec.hpp"
#include "keel/core/files.hpp"
#include "keel/train/checkpoint.hpp"
#include "keel/train/step.hpp"
#include "keel/train/tensorboard.hpp"

namespace keel::train {

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // Before the first step of this process (state: where the run starts or resumes).
  virtual void begin(const TrainState& state) { (void)state; }
  // After a step that was not rolled back (state.step is that step).
  virtual void write(const StepContext& step, const TrainState& state) = 0;
  // After a rollback to `step`: what was reported past it is forgotten.
  virtual void rewind(int64_t step) { (void)step; }
  virtual void finish() {}
};

// The largest of the step's per-head max logits (-inf without attention heads).
float step_max_logit(const StepContext& step);
// The metrics.jsonl object of a step.
nlohmann::json metrics_line(const StepContext& step, const TrainState& state, const arch::ModelSpec& spec);

// RUN_DIR/metrics.jsonl.
class MetricsFile : public MetricsSink {
 public:
  // fresh: start an empty file; otherwise call rewind(step) with the step the run resumes at.
  MetricsFile(std::string path, const arch::ModelSpec& spec, bool fresh);
  void write(const StepContext& step, const TrainState& state) override;
  // Keeps only the lines up to `step` (a resumed or rolled-back run rewrites what follows).
  void rewind(int64_t step) override;

 private:
  std::string path_;
  const arch::ModelSpec& spec_;
  AppendFile out_;
};

// RUN_DIR/tensorboard: train/loss, train/lr, train/grad_norm, train/max_logit,
// train/update_rms_ratio (when measured) and val/loss (when evaluated).
class TensorBoardMetrics : public MetricsSink {
 public:
  explicit TensorBoardMetrics(const std::string& dir) : writer_(dir) {}
  void write(const StepContext& step, const TrainState& state) override;

 private:
  TensorBoardWriter writer_;
};

// Keeps only the metrics lines of `path` up to `step`; a torn last line from a kill is dropped.
void truncate_metrics(const std::string& path, int64_t step);

}  // namespace keel::train
