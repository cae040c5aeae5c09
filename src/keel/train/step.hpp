#pragma once
// What one training step carries from stage to stage (step_loop.hpp): its batch sizes, the
// model's observations over all its micro-batches, loss, gradient norm, learning rate, what the
// spike decision made of it, the update's size, and what the metrics line reports.
#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::train {

// The model's per-step observations, gathered over the micro-batches by the forward/backward
// stage (and, across processes, by the gradient reducer).
struct StepMonitors {
  std::vector<float> max_logit;        // (layers, heads): the max over the micro-batches
  std::vector<double> expert_load;     // (layers, experts): mean share of the routed tokens
  std::vector<double> router_entropy;  // (layers): mean
  std::vector<double> activation_ms;   // (layers): mean of the residual stream's mean square
};

// What happens to a step after the spike decision.
enum class StepFate {
  Apply,       // the update is applied
  Skip,        // the update is dropped (spikes.policy = skip); the data cursor moved on
  RolledBack,  // the run went back to a checkpoint; this step is abandoned
};

struct StepContext {
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

  int64_t step = 0;            // the step being taken (state.step + 1)
  int64_t micro_batches = 0;   // gradient accumulation
  int64_t sequences = 0;       // sequences over all micro-batches
  int64_t predicted = 0;       // predicted tokens over all micro-batches: the gradient is of their mean
  std::chrono::steady_clock::time_point start;
  double seconds = 0;          // the step's time up to its metrics (evaluation not included)

  double ce_sum = 0, z_sum = 0;  // summed over the predicted tokens
  double loss = kNaN;            // (ce + z_loss·z) / predicted: the objective
  double grad_norm = kNaN;       // before clipping
  float grad_scale = 1.0f;       // the clip's factor, applied as the optimizer reads the gradients
  double lr = 0;
  StepMonitors monitors;

  StepFate fate = StepFate::Apply;
  nlohmann::json events = nlohmann::json::array();  // spike events to show on this step's line
  double update_ratio = kNaN;                       // ‖ΔW‖/‖W‖ over the hidden matrices
  std::vector<double> layer_ratio;                  // per layer (NaN when not measured)

  bool evaluated = false;
  double val_loss = kNaN;
  nlohmann::json extra = nlohmann::json::object();  // more metrics-line fields from hooks (qk_clip_heads)

  double ce() const { return ce_sum / static_cast<double>(predicted); }
  bool skipped() const { return fate == StepFate::Skip; }
};

}  // namespace keel::train
