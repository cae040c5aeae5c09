#pragma once
// Loss-spike detection and the recovery policies of `[spikes]` (docs/training.md, "Spikes").
//
// A spike is a step whose loss lies more than `threshold` robust deviations above the current
// level of a rolling window of accepted steps, or any non-finite loss, gradient or parameter.
// The pre-clip gradient norm counts too, judged the same way, but by default only on a step
// whose loss is also raised (more than threshold/2 deviations): alone, a gradient-norm outlier
// is common in healthy runs (2-30x its level for one step at high learning rates in keel's
// studies, with the loss unmoved, the update clipped), and a warning that fires on healthy runs
// teaches users to ignore it (docs/training.md has the measured false-alarm rates). Level: the median of the newest quarter of the window.
// Robust deviation: 1.4826·MAD of successive differences, /√2 (MAD·1.4826 estimates σ for
// normal noise; differences cancel the falling trend of early training), so neither a trend nor
// a few earlier spikes in the window hide the next one. The gradient norm is judged on a log
// scale: its spikes are multiplicative. Policies (PaLM §5.1 for
// rollback + data skip; OLMo 2 §3 for the spike score's "k σ above a rolling window" idea):
//   warn      record the event, apply the update (a non-finite step aborts: it cannot be applied)
//   skip      drop the step's update, keep the data cursor moving (at most max_skips times)
//   rollback  reload the newest intact checkpoint and skip the data window between it and the
//             spike (at most max_rollbacks times)
//   abort     stop the run with an error; the checkpoints written so far stay intact
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::train {

enum class SpikePolicy { Warn, Skip, Rollback, Abort };
SpikePolicy parse_spike_policy(const std::string& name);  // std::invalid_argument with the choices
const char* to_string(SpikePolicy policy);

// How the gradient norm takes part (spikes.grad_norm):
//   with_loss  a gradient-norm outlier is a spike when the step's loss is raised too (default)
//   alone      a gradient-norm outlier is a spike by itself (keel before 2026-12)
//   off        only the loss and non-finite values count
enum class GradNormSignal { WithLoss, Alone, Off };
GradNormSignal parse_grad_norm_signal(const std::string& name);  // std::invalid_argument
const char* to_string(GradNormSignal signal);

struct SpikeConfig {
  SpikePolicy policy = SpikePolicy::Warn;
  int64_t window = 100;        // accepted steps the median and MAD are taken over
  double threshold = 6.0;      // k: robust deviations above the median that make a spike
  int64_t min_history = 20;    // no finite spike is called before this many accepted steps
  int64_t max_skips = 10;      // skip policy: updates dropped over the run before aborting
  int64_t max_rollbacks = 3;   // rollback policy: rollbacks over the run before aborting
  GradNormSignal grad_norm = GradNormSignal::WithLoss;
};

// What one check found.
struct SpikeVerdict {
  bool spike = false;
  std::string signal;     // "loss", "grad_norm", "nonfinite_loss", "nonfinite_grad", "nonfinite_param"
  double value = 0;       // the offending value (loss, or grad norm in its own units)
  double threshold = 0;   // the value above which it counted as a spike (same units)
};

class SpikeGuard {
 public:
  explicit SpikeGuard(const SpikeConfig& config) : config_(config) {}

  // Judges a step before its update: non-finite loss or grad norm first, then the window.
  SpikeVerdict check(double loss, double grad_norm) const;
  // Adds an applied step to the window (spikes the policy let through under `warn` included:
  // the window describes what the model actually trained on).
  void accept(double loss, double grad_norm);
  size_t history() const { return loss_.size(); }

  // The window, for the checkpoint: a resumed or rolled-back run judges exactly as before.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);

 private:
  SpikeConfig config_;
  std::deque<double> loss_, log_grad_;
};

// Median and robust deviation (1.4826·MAD) of a sample. Exposed for tests.
struct RobustStats {
  double median = 0, deviation = 0;
};
RobustStats robust_stats(std::vector<double> values);
// The level and noise of a window as check() uses them (see the file comment).
RobustStats window_stats(const std::deque<double>& values);

// What the guard would have called on a finished run's steps, every step accepted (as under
// `warn`): `keel spikes` replays a run's metrics.jsonl with other settings. Non-finite values are
// spikes and join no window, as in training.
struct ReplayedSpike {
  int64_t step = 0;
  SpikeVerdict verdict;
};
std::vector<ReplayedSpike> replay_spike_guard(const SpikeConfig& config, const std::vector<int64_t>& steps,
                                              const std::vector<double>& loss, const std::vector<double>& grad_norm);

}  // namespace keel::train
