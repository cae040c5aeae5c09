#pragma once
// The gradient reduction stage, between backward and clipping: where data parallelism sums the
// gradients, loss sums and monitors of the processes (in a fixed order, so results do not depend
// on timing) before anything looks at them (data_parallel.hpp). One process has nothing to do.
#include "keel/nn/parameters.hpp"
#include "keel/optim/grad_clip.hpp"
#include "keel/train/step.hpp"

namespace keel::train {

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // A step's backward is about to start: nothing of it has been reduced yet.
  virtual void begin_step() {}
  // The last micro-batch's backward has finished this layer (blocks from the last to the first):
  // its gradients are final and may start on their way while the layers below are computed.
  virtual void layer_ready(nn::ParameterStore& /*store*/, int64_t /*layer*/) {}
  // Whether layer_ready wants calls (false: forward_backward need not report layers).
  virtual bool overlaps() const { return false; }
  // Makes the gradients this process updates, step.ce_sum, step.z_sum and step.monitors those of
  // the whole (global) batch.
  virtual void reduce(nn::ParameterStore& store, StepContext& step) = 0;
  // The global gradient norm, after reduce().
  virtual double grad_norm(const nn::ParameterStore& store) { return optim::global_grad_norm(store.grads()); }
};

class SingleProcessReducer : public GradientReducer {
 public:
  void reduce(nn::ParameterStore& /*store*/, StepContext& /*step*/) override {}
};

}  // namespace keel::train
