#include "keel/train/post_update.hpp"

#include "keel/optim/qk_clip.hpp"

namespace keel::train {

void RouterBiasHook::after_update(StepContext& /*step*/) {
  if (comm_ && comm_->size() > 1) {
    // DeepSeek-V3's rule needs the global load: sum the integer counts (exact in doubles).
    std::vector<std::vector<int64_t>*> counts = model_.pending_router_counts();
    std::vector<double> flat;
    for (const auto* c : counts) flat.insert(flat.end(), c->begin(), c->end());
    comm_->sum(flat);
    size_t k = 0;
    for (auto* c : counts) {
      for (int64_t& x : *c) x = static_cast<int64_t>(flat[k++]);
    }
  }
  model_.update_router_bias(speed_);
}

void RouterBiasHook::after_skip(StepContext& /*step*/) { model_.update_router_bias(0.0f); }

void RouterBiasHook::after_rollback() { model_.update_router_bias(0.0f); }

void QkClipHook::after_update(StepContext& step) {
  step.extra["qk_clip_heads"] = optim::qk_clip(store_, spec_, step.monitors.max_logit, {tau_}).clipped_heads;
}

void QkClipHook::after_skip(StepContext& step) { step.extra["qk_clip_heads"] = 0; }

}  // namespace keel::train
