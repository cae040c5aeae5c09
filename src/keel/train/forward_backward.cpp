#include "keel/train/forward_backward.hpp"

#include <algorithm>
#include <limits>

#include "keel/train/faults.hpp"

namespace keel::train {

namespace {

void reset_monitors(const arch::ModelSpec& spec, StepMonitors& m) {
  const int64_t layers = spec.num_layers;
  const int64_t experts = spec.moe.enabled ? spec.moe.num_experts : 0;
  m.max_logit.assign(static_cast<size_t>(layers * spec.attention.num_heads), -std::numeric_limits<float>::infinity());
  m.expert_load.assign(static_cast<size_t>(layers * experts), 0.0);
  m.router_entropy.assign(static_cast<size_t>(layers), 0.0);
  m.activation_ms.assign(static_cast<size_t>(layers), 0.0);
}

// Folds one micro-batch's observations into the step's: max of the max logits; micro-batches
// hold equal token counts, so the mean of their shares is the step's share.
void observe(const nn::TransformerModel& model, int64_t micro_batches, StepMonitors& m) {
  const bool moe = model.spec().moe.enabled && model.spec().moe.num_experts > 0;
  const auto& ml = model.max_logits();
  for (size_t i = 0; i < m.max_logit.size(); ++i) m.max_logit[i] = std::max(m.max_logit[i], ml[i]);
  const double n = static_cast<double>(micro_batches);
  for (size_t i = 0; i < m.expert_load.size(); ++i) m.expert_load[i] += model.expert_load()[i] / n;
  if (moe) {
    for (size_t i = 0; i < m.router_entropy.size(); ++i) m.router_entropy[i] += model.router_entropy()[i] / n;
  }
  for (size_t i = 0; i < m.activation_ms.size(); ++i) m.activation_ms[i] += model.activation_mean_square()[i] / n;
}

}  // namespace

void forward_backward(nn::TransformerModel& model, BatchSource& batches, TrainState& state, StepContext& step,
                      const LayerDone& layer_done) {
  model.parameters().zero_grad();
  reset_monitors(model.spec(), step.monitors);
  step.ce_sum = step.z_sum = 0;
  MicroBatch mb;
  for (int64_t a = 0; a < step.micro_batches; ++a) {
    batches.draw(a, state, mb);
    const bool last = a + 1 == step.micro_batches;
    model.set_block_backward_hook(last ? layer_done : LayerDone{});
    auto r = model.forward_backward(mb.tokens.data(), mb.targets.data(), mb.sequences, mb.seq_len,
                                    1.0f / static_cast<float>(step.predicted));
    model.set_block_backward_hook({});
    step.ce_sum += r.ce_sum;
    step.z_sum += r.z_sum;
    observe(model, step.micro_batches, step.monitors);
    if (a == 0) crash_point("forward", step.step);
  }
}

double step_loss(const nn::TransformerModel& model, const StepContext& step) {
  return (step.ce_sum + model.spec().z_loss * step.z_sum) / static_cast<double>(step.predicted);
}

}  // namespace keel::train
