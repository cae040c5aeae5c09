#pragma once
// Deliberate faults of `[faults]` (run_config.hpp), for the tests of the recovery paths. A
// poisoned step poisons the data it draws in the uninterrupted run, the cursor range [from, to):
// a rollback that skips it never meets it again, a replay would. NaN gradients hit the listed
// steps. Damage to a checkpoint happens once.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "keel/nn/parameters.hpp"
#include "keel/train/run_config.hpp"

namespace keel::train {

class FaultPlan {
 public:
  // world: the data-parallel ranks (a step draws world × accumulation micro-batches).
  FaultPlan(const RunConfig& config, int64_t vocab_size, int world = 1);

  bool poisoned(int64_t cursor) const;
  // Uniformly random tokens and targets for the micro-batch drawn at `cursor`, the same for a
  // given (seed, cursor).
  void poison(int64_t cursor, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) const;
  // After the backward pass of `step`: a NaN in one gradient element if the step is listed.
  void after_backward(int64_t step, nn::ParameterStore& store) const;
  // Whether after_backward changes this step's gradients.
  bool touches_gradients(int64_t step) const;
  // After the checkpoint of `step` was saved into `dir`: flips bytes in its weights if listed.
  void after_checkpoint(int64_t step, const std::string& dir);

 private:
  uint64_t seed_;
  int64_t seq_len_, vocab_size_;
  std::vector<std::pair<int64_t, int64_t>> poisoned_;
  std::vector<int64_t> nan_grad_steps_, damage_pending_;
};

// Flips bytes in the middle of a checkpoint's weights.
void damage_checkpoint(const std::string& dir);

// The kill-anywhere tests' hook: with KEEL_CRASH_AT="PHASE:STEP" in the environment, the process
// sends itself SIGKILL when it reaches PHASE at STEP: "forward" (after the step's first
// micro-batch), "eval" (after the first evaluation batch), "checkpoint" (after the first tensor
// file of the step's checkpoint is written, before its state and COMMIT). Without the variable
// it costs one comparison. A malformed value is a keel::Error naming the variable.
void crash_point(const char* phase, int64_t step);

}  // namespace keel::train
