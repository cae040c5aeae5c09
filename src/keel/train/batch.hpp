#pragma once
// The batch stage: the micro-batches of a step. A run over a prepared dataset draws windows at
// positions that are a pure function of (seed, sequence index), so the data order survives any
// interruption given only the cursor; `keel train --model --tokens` cycles through a token file.
#include <cstdint>
#include <string>
#include <vector>

#include "keel/data/shards.hpp"
#include "keel/train/checkpoint.hpp"
#include "keel/train/faults.hpp"
#include "keel/train/step.hpp"

namespace keel::train {

struct MicroBatch {
  std::vector<int32_t> tokens, targets;  // (sequences, seq_len); target -1 predicts nothing
  int64_t sequences = 0, seq_len = 0;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Sizes the next step: step.micro_batches, step.sequences and step.predicted.
  virtual void plan(const TrainState& state, StepContext& step) = 0;
  // Fills micro-batch `index` of the planned step; moves the data cursor past it.
  virtual void draw(int64_t index, TrainState& state, MicroBatch& out) = 0;
};

// Draws training windows: sequence k of the run starts at a position that is a pure function of
// (seed, k), so the data order survives any interruption given only the cursor k.
class WindowSampler {
 public:
  // source: the file named in errors (the dataset).
  WindowSampler(const data::TokenDataset& ds, int64_t seq_len, uint64_t seed, const std::string& source);
  // Fills tokens/targets (sequences, seq_len) with windows k0, k0+1, ...
  void fill(int64_t k0, int64_t sequences, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) const;

 private:
  const data::TokenDataset& ds_;
  int64_t seq_len_;
  uint64_t seed_;
};

// Micro-batches of `sequences` windows each; gradient accumulation (and the batch ramp through
// it) sets how many a step takes. Poisoned cursors (faults) get random tokens instead.
// Data parallel over `world` ranks: a step is world × accumulation micro-batches of the one data
// order, rank r taking the r-th contiguous run of them, so N ranks see exactly the windows one
// process sees at N times the accumulation; step.sequences and step.predicted are the global ones.
class DatasetBatches : public BatchSource {
 public:
  DatasetBatches(const data::TokenDataset& ds, const RunConfig& config, const FaultPlan* faults, int rank = 0,
                 int world = 1);
  void plan(const TrainState& state, StepContext& step) override;
  void draw(int64_t index, TrainState& state, MicroBatch& out) override;

 private:
  WindowSampler sampler_;
  const RunConfig& config_;
  const FaultPlan* faults_;
  int rank_, world_;
  int64_t step_start_ = 0, local_micro_batches_ = 0;  // the planned step's cursor and this rank's share
};

// The lines of a token file, `per_step` a step (all when 0), cycling back to the first line
// when the next window would run past the end; micro-batches of at most 16 right-padded lines.
class TokenFileBatches : public BatchSource {
 public:
  TokenFileBatches(const std::vector<std::vector<int32_t>>& lines, int64_t per_step, std::string path);
  void plan(const TrainState& state, StepContext& step) override;
  void draw(int64_t index, TrainState& state, MicroBatch& out) override;

  static constexpr size_t kLinesPerBatch = 16;

 private:
  const std::vector<std::vector<int32_t>>& lines_;
  size_t per_step_;
  std::string path_;
  size_t cursor_ = 0, begin_ = 0;
};

}  // namespace keel::train
