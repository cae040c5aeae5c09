#pragma once
// The clipping and update stages: global grad-norm clipping, the optimizer's step, and the size
// of the update (‖ΔW‖/‖W‖ over the hidden matrices, overall and per layer) with the check that it
// left every parameter finite.
#include <cstdint>
#include <string>
#include <vector>

#include "keel/nn/parameters.hpp"
#include "keel/optim/optimizer.hpp"
#include "keel/train/step.hpp"

namespace keel::train {

// Clips the gradients to a global norm of max_norm (0 = off), given their global norm (the
// reducer's: with ZeRO-1 each process holds only the gradients it updates): sets step.grad_scale,
// which the update stage hands the optimizer, so the gradients are scaled in the optimizer's own
// pass over them rather than in a pass of their own (the store keeps them as the backward left them).
void clip_gradients(StepContext& step, double max_norm);

class UpdateStage {
 public:
  // measure: keep a copy of the weights before each update, to measure it and to undo it.
  UpdateStage(nn::ParameterStore& store, optim::Optimizer& optimizer, int64_t layers, bool measure);
  // The optimizer's step at step.lr with step.grad_scale; with measure, fills step.update_ratio and step.layer_ratio.
  // Returns false when the update made a parameter non-finite (known only with measure).
  bool apply(StepContext& step);
  // Puts the weights back as they were before apply() (measure only). The optimizer's state
  // keeps the step: its moments saw a finite gradient.
  void undo(StepContext& step);

 private:
  bool measure(StepContext& step) const;

  nn::ParameterStore& store_;
  optim::Optimizer& optimizer_;
  int64_t layers_;
  bool measure_;
  std::vector<float> before_;
  std::vector<int64_t> param_layer_;
};

}  // namespace keel::train
