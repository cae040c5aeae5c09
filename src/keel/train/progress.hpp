#pragma once
// Live progress of a run: one line every log_every steps (a terminal gets one live line,
// rewritten every step) and the news of the run (spikes, rollbacks, damaged checkpoints).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "keel/train/metrics.hpp"

namespace keel::train {

class Progress : public MetricsSink {
 public:
  // out may be null (silent).
  Progress(FILE* out, int64_t total_steps, int64_t log_every);
  // One line of news; a terminal's live line is cleared first.
  void say(const std::string& text) const;

  void begin(const TrainState& state) override;
  void write(const StepContext& step, const TrainState& state) override;
  void finish() override;

 private:
  FILE* out_;
  bool tty_;
  int64_t total_steps_, log_every_;
  int64_t first_step_ = 0;
  std::chrono::steady_clock::time_point start_;
  double last_val_ = std::numeric_limits<double>::quiet_NaN();
};

// "1h05m", "3m07s"; "?" for a negative or unknown duration.
std::string format_duration(double seconds);

}  // namespace keel::train
