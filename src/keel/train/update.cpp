#include "keel/train/update.hpp"
#include "keel/core/fixed_order_sum.hpp"

#include <algorithm>
#include <cmath>

#include "keel/core/error.hpp"
#include "keel/optim/grad_clip.hpp"

namespace keel::train {

void clip_gradients(StepContext& step, double max_norm) {
  step.grad_scale = max_norm > 0 ? optim::clip_scale(step.grad_norm, max_norm) : 1.0f;
}

UpdateStage::UpdateStage(nn::ParameterStore& store, optim::Optimizer& optimizer, int64_t layers, bool measure)
    : store_(store), optimizer_(optimizer), layers_(layers), measure_(measure) {
  if (!measure_) return;
  before_.resize(static_cast<size_t>(store.size()));
  // The layer of each parameter by its role (-1: embeddings, final norm, head).
  for (const nn::ParamInfo& p : store.entries()) param_layer_.push_back(p.layer());
}

bool UpdateStage::apply(StepContext& step) {
  if (measure_) std::copy(store_.values().begin(), store_.values().end(), before_.begin());
  optimizer_.step(store_, static_cast<float>(step.lr), step.grad_scale);
  return measure_ ? measure(step) : true;
}

bool UpdateStage::measure(StepContext& step) const {
  // ‖ΔW‖/‖W‖ over the hidden matrices, overall and per layer, from this update alone.
  const size_t layers = static_cast<size_t>(layers_);
  std::vector<double> du(layers + 1, 0.0), w(layers + 1, 0.0);
  bool finite = true;
  const auto& entries = store_.entries();
  for (size_t pi = 0; pi < entries.size(); ++pi) {
    const nn::ParamInfo& p = entries[pi];
    const float* now = store_.values().data() + p.offset;
    const float* old = before_.data() + p.offset;
    const auto [d2, w2, bad] = fixed_order_sum<3>(p.numel, [now, old](int64_t i0, int64_t i1) {
      std::array<double, 3> s{};
      for (int64_t i = i0; i < i1; ++i) {
        const double d = static_cast<double>(now[i]) - old[i];
        s[0] += d * d;
        s[1] += static_cast<double>(old[i]) * old[i];
        s[2] += std::isfinite(now[i]) ? 0.0 : 1.0;
      }
      return s;
    });
    if (bad > 0) finite = false;
    if (!p.matrix) continue;
    const size_t slot = param_layer_[pi] >= 0 && param_layer_[pi] < layers_ ? static_cast<size_t>(param_layer_[pi]) : layers;
    du[slot] += d2;
    w[slot] += w2;
  }
  double du_all = 0, w_all = 0;
  for (size_t l = 0; l <= layers; ++l) {
    du_all += du[l];
    w_all += w[l];
    if (l < layers && w[l] > 0) step.layer_ratio[l] = std::sqrt(du[l] / w[l]);
  }
  if (w_all > 0) step.update_ratio = std::sqrt(du_all / w_all);
  return finite;
}

void UpdateStage::undo(StepContext& step) {
  KEEL_CHECK(measure_);
  std::copy(before_.begin(), before_.end(), store_.values().begin());
  step.update_ratio = StepContext::kNaN;
  std::fill(step.layer_ratio.begin(), step.layer_ratio.end(), StepContext::kNaN);
}

}  // namespace keel::train
