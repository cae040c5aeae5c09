#include "keel/train/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace keel::train {

Progress::Progress(FILE* out, int64_t total_steps, int64_t log_every)
    : out_(out), tty_(out && ::isatty(::fileno(out))), total_steps_(total_steps), log_every_(log_every),
      start_(std::chrono::steady_clock::now()) {}

void Progress::say(const std::string& text) const {
  if (!out_) return;
  std::fprintf(out_, "%s%s\n", tty_ ? "\r\033[K" : "", text.c_str());
  std::fflush(out_);
}

void Progress::begin(const TrainState& state) {
  first_step_ = state.step;
  start_ = std::chrono::steady_clock::now();
}

void Progress::write(const StepContext& step, const TrainState& /*state*/) {
  if (step.evaluated) last_val_ = step.val_loss;
  const int64_t s = step.step;
  if (!out_ || !(tty_ || s % log_every_ == 0 || s == total_steps_ || step.evaluated)) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = elapsed / static_cast<double>(std::max<int64_t>(s - first_step_, 1)) * static_cast<double>(total_steps_ - s);
  char val_text[32] = "-";
  if (std::isfinite(last_val_)) std::snprintf(val_text, sizeof val_text, "%.4f", last_val_);
  std::fprintf(out_, "%sstep %lld/%lld  loss %.4f  val %s  lr %.3g  gnorm %.3f  %.0f tok/s  max_logit %.2f  ETA %s%s",
               tty_ ? "\r\033[K" : "", static_cast<long long>(s), static_cast<long long>(total_steps_), step.loss,
               val_text, step.lr, step.grad_norm, static_cast<double>(step.predicted) / step.seconds,
               step_max_logit(step), format_duration(eta).c_str(), tty_ ? "" : "\n");
  std::fflush(out_);
}

void Progress::finish() {
  if (tty_) std::fprintf(out_, "\n");
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

}  // namespace keel::train
