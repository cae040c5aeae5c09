#include "keel/train/spike_guard.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace keel::train {

SpikePolicy parse_spike_policy(const std::string& name) {
  if (name == "warn") return SpikePolicy::Warn;
  if (name == "skip") return SpikePolicy::Skip;
  if (name == "rollback") return SpikePolicy::Rollback;
  if (name == "abort") return SpikePolicy::Abort;
  throw std::invalid_argument("unknown policy '" + name + "'; supported: warn, skip, rollback, abort");
}

const char* to_string(SpikePolicy policy) {
  switch (policy) {
    case SpikePolicy::Warn: return "warn";
    case SpikePolicy::Skip: return "skip";
    case SpikePolicy::Rollback: return "rollback";
    case SpikePolicy::Abort: return "abort";
  }
  return "?";
}

GradNormSignal parse_grad_norm_signal(const std::string& name) {
  if (name == "with_loss") return GradNormSignal::WithLoss;
  if (name == "alone") return GradNormSignal::Alone;
  if (name == "off") return GradNormSignal::Off;
  throw std::invalid_argument("unknown grad_norm signal '" + name + "'; supported: with_loss, alone, off");
}

const char* to_string(GradNormSignal signal) {
  switch (signal) {
    case GradNormSignal::WithLoss: return "with_loss";
    case GradNormSignal::Alone: return "alone";
    case GradNormSignal::Off: return "off";
  }
  return "?";
}

namespace {

double median_of(std::vector<double>& v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lower + upper);
}

}  // namespace

RobustStats robust_stats(std::vector<double> values) {
  if (values.empty()) return {};
  const double median = median_of(values);
  for (double& v : values) v = std::abs(v - median);
  // 1.4826 = 1/Φ⁻¹(3/4): MAD·1.4826 estimates σ for normally distributed values.
  return {median, 1.4826 * median_of(values)};
}

RobustStats window_stats(const std::deque<double>& values) {
  // Early in training the loss falls fast: a plain median/MAD of the window would sit far above
  // the current level and count the trend as noise. So the level is the median of the newest
  // quarter of the window, and the noise comes from successive differences, which cancel a slow
  // trend (for independent noise of σ, a difference has σ·√2).
  const size_t recent = std::min(values.size(), std::max<size_t>(5, values.size() / 4));
  const double level = robust_stats({values.end() - static_cast<std::ptrdiff_t>(recent), values.end()}).median;
  std::vector<double> diffs;
  for (size_t i = 1; i < values.size(); ++i) diffs.push_back(values[i] - values[i - 1]);
  return {level, robust_stats(std::move(diffs)).deviation / std::sqrt(2.0)};
}

SpikeVerdict SpikeGuard::check(double loss, double grad_norm) const {
  if (!std::isfinite(loss)) return {true, "nonfinite_loss", loss, 0};
  if (!std::isfinite(grad_norm)) return {true, "nonfinite_grad", grad_norm, 0};
  if (static_cast<int64_t>(loss_.size()) < config_.min_history) return {};
  // A floor under the deviation: a window of near-identical values (MAD ≈ 0) would otherwise
  // call every tiny wobble a spike. 1% of the loss; 10% of the grad norm (on the log scale),
  // which moves more from step to step than its successive differences suggest.
  const RobustStats l = window_stats(loss_);
  const double loss_noise = std::max(l.deviation, 0.01 * std::abs(l.median));
  const double loss_limit = l.median + config_.threshold * loss_noise;
  if (loss > loss_limit) return {true, "loss", loss, loss_limit};
  if (config_.grad_norm == GradNormSignal::Off) return {};
  if (config_.grad_norm == GradNormSignal::WithLoss && loss <= l.median + 0.5 * config_.threshold * loss_noise) return {};
  const RobustStats g = window_stats(log_grad_);
  const double log_limit = g.median + config_.threshold * std::max(g.deviation, 0.1);
  if (grad_norm > 0 && std::log(grad_norm) > log_limit) return {true, "grad_norm", grad_norm, std::exp(log_limit)};
  return {};
}

void SpikeGuard::accept(double loss, double grad_norm) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return;
  loss_.push_back(loss);
  log_grad_.push_back(std::log(std::max(grad_norm, 1e-30)));
  while (static_cast<int64_t>(loss_.size()) > config_.window) {
    loss_.pop_front();
    log_grad_.pop_front();
  }
}

std::vector<ReplayedSpike> replay_spike_guard(const SpikeConfig& config, const std::vector<int64_t>& steps,
                                              const std::vector<double>& loss, const std::vector<double>& grad_norm) {
  SpikeGuard guard(config);
  std::vector<ReplayedSpike> out;
  for (size_t i = 0; i < steps.size() && i < loss.size() && i < grad_norm.size(); ++i) {
    const SpikeVerdict v = guard.check(loss[i], grad_norm[i]);
    if (v.spike) out.push_back({steps[i], v});
    guard.accept(loss[i], grad_norm[i]);
  }
  return out;
}

nlohmann::json SpikeGuard::state() const {
  return {{"loss", std::vector<double>(loss_.begin(), loss_.end())},
          {"log_grad_norm", std::vector<double>(log_grad_.begin(), log_grad_.end())}};
}

void SpikeGuard::restore(const nlohmann::json& state) {
  loss_.clear();
  log_grad_.clear();
  // An older checkpoint without a window (or a damaged one) starts an empty window.
  if (!state.is_object()) return;
  const auto l = state.find("loss"), g = state.find("log_grad_norm");
  if (l == state.end() || g == state.end() || !l->is_array() || !g->is_array() || l->size() != g->size()) return;
  for (size_t i = 0; i < l->size(); ++i) {
    if (!(*l)[i].is_number() || !(*g)[i].is_number()) {
      loss_.clear();
      log_grad_.clear();
      return;
    }
    loss_.push_back((*l)[i].get<double>());
    log_grad_.push_back((*g)[i].get<double>());
  }
  while (static_cast<int64_t>(loss_.size()) > config_.window) {
    loss_.pop_front();
    log_grad_.pop_front();
  }
}

}  // namespace keel::train
