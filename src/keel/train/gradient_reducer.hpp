#pragma once
// The gradient reduction stage, between backward and clipping: where data parallelism will sum
// the gradients, loss sums, token counts and monitors of the processes (in a fixed order, so
// results do not depend on timing) before anything looks at them. One process has nothing to do.
#include "keel/nn/parameters.hpp"
#include "keel/train/step.hpp"

namespace keel::train {

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // Makes store.grads(), step.ce_sum, step.z_sum, step.predicted and step.monitors those of the
  // whole (global) batch.
  virtual void reduce(nn::ParameterStore& store, StepContext& step) = 0;
};

class SingleProcessReducer : public GradientReducer {
 public:
  void reduce(nn::ParameterStore& /*store*/, StepContext& /*step*/) override {}
};

}  // namespace keel::train
