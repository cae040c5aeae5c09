#include "keel/train/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace keel::train {

namespace {

double warmup_factor(int64_t step, int64_t warmup_steps) {
  if (warmup_steps <= 0 || step >= warmup_steps) return 1.0;
  return static_cast<double>(step) / static_cast<double>(warmup_steps);
}

// progress in [0, 1] -> multiplier from 1 down to 0.
double decay(DecayShape shape, double progress) {
  progress = std::clamp(progress, 0.0, 1.0);
  switch (shape) {
    case DecayShape::Linear: return 1.0 - progress;
    case DecayShape::Cosine: return 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    case DecayShape::OneMinusSqrt: return 1.0 - std::sqrt(progress);
  }
  return 0.0;
}

double between(double peak, double final_lr, double multiplier) { return final_lr + (peak - final_lr) * multiplier; }

}  // namespace

double lr_at(const ScheduleConfig& s, int64_t step, int64_t tokens) {
  const double warm = warmup_factor(step, s.warmup_steps);
  switch (s.kind) {
    case ScheduleKind::Constant:
      return s.peak_lr;
    case ScheduleKind::Warmup:
      return s.peak_lr * warm;
    case ScheduleKind::Cosine: {
      if (step < s.warmup_steps) return s.peak_lr * warm;
      const double span = static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps));
      return between(s.peak_lr, s.final_lr, decay(DecayShape::Cosine, static_cast<double>(step - s.warmup_steps) / span));
    }
    case ScheduleKind::WarmupHoldCosine: {
      if (step < s.warmup_steps) return s.peak_lr * warm;
      if (tokens < s.hold_tokens) return s.peak_lr;
      const int64_t into = tokens - s.hold_tokens;
      if (into < s.decay_tokens) {
        return between(s.peak_lr, s.final_lr,
                       decay(DecayShape::Cosine, static_cast<double>(into) / static_cast<double>(s.decay_tokens)));
      }
      for (const LrTail& tail : s.tails) {
        if (tokens < tail.until_tokens) return tail.lr;
      }
      return s.tails.empty() ? s.final_lr : s.tails.back().lr;
    }
    case ScheduleKind::Wsd: {
      if (step < s.warmup_steps) return s.peak_lr * warm;
      const int64_t decay_start = s.total_steps - s.decay_steps;
      if (step <= decay_start || s.decay_steps <= 0) return s.peak_lr;
      return between(s.peak_lr, s.final_lr,
                     decay(s.decay_shape, static_cast<double>(step - decay_start) / static_cast<double>(s.decay_steps)));
    }
  }
  return s.peak_lr;
}

int64_t accumulation_at(const BatchRamp& r, int64_t base_accumulation, int64_t tokens) {
  if (r.start_sequences <= 0 || r.end_sequences <= 0) return base_accumulation;
  double progress = r.ramp_tokens > 0 ? std::clamp(static_cast<double>(tokens) / static_cast<double>(r.ramp_tokens), 0.0, 1.0) : 1.0;
  const double sequences = static_cast<double>(r.start_sequences) +
                           (static_cast<double>(r.end_sequences - r.start_sequences)) * progress;
  return std::max<int64_t>(1, static_cast<int64_t>(sequences) / r.micro_sequences);
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "constant") return ScheduleKind::Constant;
  if (name == "warmup") return ScheduleKind::Warmup;
  if (name == "cosine") return ScheduleKind::Cosine;
  if (name == "warmup_hold_cosine") return ScheduleKind::WarmupHoldCosine;
  if (name == "wsd") return ScheduleKind::Wsd;
  throw std::invalid_argument("unknown schedule '" + name + "'; supported: constant, warmup, cosine, warmup_hold_cosine, wsd");
}

DecayShape parse_decay_shape(const std::string& name) {
  if (name == "linear") return DecayShape::Linear;
  if (name == "cosine") return DecayShape::Cosine;
  if (name == "1-sqrt" || name == "one_minus_sqrt") return DecayShape::OneMinusSqrt;
  throw std::invalid_argument("unknown decay shape '" + name + "'; supported: linear, cosine, 1-sqrt");
}

}  // namespace keel::train
