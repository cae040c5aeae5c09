#include "keel/train/checkpointing.hpp"

namespace keel::train {

void Checkpointing::save(const TrainState& state) {
  const std::string dir = checkpoint_.save(run_dir_, state.step, keep_);
  if (faults_ && checkpoint_.leads()) faults_->after_checkpoint(state.step, dir);
}

void Checkpointing::after_step(const TrainState& state) {
  if (every_ > 0 && state.step % every_ == 0 && state.step != last_step_) save(state);
}

}  // namespace keel::train
