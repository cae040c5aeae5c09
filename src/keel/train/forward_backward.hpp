#pragma once
// The forward/backward stage: the step's micro-batches through the model, accumulating the
// gradient of the step's mean objective and the model's observations of the step (max logit per
// head, expert load, router entropy, activation mean square).
#include <functional>

#include "keel/nn/model.hpp"
#include "keel/train/batch.hpp"
#include "keel/train/checkpoint.hpp"
#include "keel/train/step.hpp"

namespace keel::train {

// Called during the last micro-batch's backward as each block's gradients become final.
using LayerDone = std::function<void(int64_t layer)>;

// Zeroes the gradients, then runs the micro-batches `batches` planned for `step` (plan() first).
// Fills step.ce_sum, step.z_sum and step.monitors.
void forward_backward(nn::TransformerModel& model, BatchSource& batches, TrainState& state, StepContext& step,
                      const LayerDone& layer_done = {});

// (ce + z_loss·z) / predicted: the step's objective, once its sums are final (after reduction).
double step_loss(const nn::TransformerModel& model, const StepContext& step);

}  // namespace keel::train
