#include "keel/train/post_update.hpp"

#include "keel/optim/qk_clip.hpp"

namespace keel::train {

void RouterBiasHook::after_update(StepContext& /*step*/) { model_.update_router_bias(speed_); }

void RouterBiasHook::after_skip(StepContext& /*step*/) { model_.update_router_bias(0.0f); }

void RouterBiasHook::after_rollback() { model_.update_router_bias(0.0f); }

void QkClipHook::after_update(StepContext& step) {
  step.extra["qk_clip_heads"] = optim::qk_clip(store_, spec_, step.monitors.max_logit, {tau_}).clipped_heads;
}

void QkClipHook::after_skip(StepContext& step) { step.extra["qk_clip_heads"] = 0; }

}  // namespace keel::train
