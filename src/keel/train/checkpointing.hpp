#pragma once
// The checkpoint stage: a checkpoint every checkpoint_every steps (and one at the end, which the
// trainer writes), pruned to checkpoint_keep; damage faults applied right after a save.
#include <cstdint>
#include <string>

#include "keel/train/checkpoint.hpp"
#include "keel/train/faults.hpp"

namespace keel::train {

class Checkpointing {
 public:
  // every = 0: only when save() is called. last_step: no periodic save there (the final one follows).
  Checkpointing(const Checkpoint& checkpoint, std::string run_dir, int64_t every, int64_t keep, int64_t last_step,
                FaultPlan* faults)
      : checkpoint_(checkpoint), run_dir_(std::move(run_dir)), every_(every), keep_(keep), last_step_(last_step),
        faults_(faults) {}
  void save(const TrainState& state);
  void after_step(const TrainState& state);

 private:
  const Checkpoint& checkpoint_;
  std::string run_dir_;
  int64_t every_, keep_, last_step_;
  FaultPlan* faults_;
};

}  // namespace keel::train
