#pragma once
// The parts of a training run that a checkpoint (checkpoint.hpp) holds, each a Stateful under
// its name. On disk (unchanged since the first checkpoints):
//   "model"       model.safetensors: every parameter under its HF name; state.json:
//                 model_config_hash (a checkpoint never loads into another model)
//   "optimizer"   optimizer.safetensors: "<state>.<parameter name>" (exp_avg.…, exp_avg_sq.…,
//                 momentum.…); state.json: optimizer (its name), optimizer_steps, optimizer_world.
//                 Data parallel (ZeRO-1), rank r > 0 writes optimizer.rank-NNNNN.safetensors; a
//                 slice of a parameter is "<state>.<name>@<first element>" (1-D). Any world size
//                 loads any other's: the old plan is recomputed (dist/shard_plan.hpp) and each
//                 rank copies the overlap of its slices with the old ones.
//   "train"       state.json: step, tokens, sequences (the data cursor)
//   "spike_guard" state.json: spike_guard (spike_recovery.hpp)
#include <string>
#include <vector>

#include "keel/nn/model.hpp"
#include "keel/optim/optimizer.hpp"
#include "keel/train/checkpoint.hpp"

namespace keel::train {

class ModelState : public Stateful {
 public:
  ModelState(nn::TransformerModel& model, std::string model_config_hash)
      : model_(model), config_hash_(std::move(model_config_hash)) {}
  void save(CheckpointWriter& out) const override;
  void check(const CheckpointReader& in) const override;
  void load(CheckpointReader& in) override;

 private:
  nn::TransformerModel& model_;
  std::string config_hash_;
};

class OptimizerState : public Stateful {
 public:
  // rank, world: this process in a data-parallel run; whole_entries: the Muon matrices (owned
  // whole by the shard plan).
  OptimizerState(optim::Optimizer& optimizer, const nn::ParameterStore& store, int rank = 0, int world = 1,
                 std::vector<size_t> whole_entries = {})
      : optimizer_(optimizer), store_(store), rank_(rank), world_(world), whole_(std::move(whole_entries)) {}
  void save(CheckpointWriter& out) const override;
  bool every_rank() const override { return true; }
  void check(const CheckpointReader& in) const override;
  void load(CheckpointReader& in) override;

  // The file rank r's shard lives in.
  static std::string file_of_rank(int rank);

 private:
  // The Muon matrices the checkpoint's shard plan kept whole (recorded at save).
  std::vector<size_t> whole_at_save(const CheckpointReader& in) const;
  optim::Optimizer& optimizer_;
  const nn::ParameterStore& store_;
  int rank_, world_;
  std::vector<size_t> whole_;
};

class TrainStateRecord : public Stateful {
 public:
  explicit TrainStateRecord(TrainState& state) : state_(state) {}
  void save(CheckpointWriter& out) const override;
  void check(const CheckpointReader& in) const override;
  void load(CheckpointReader& in) override;

 private:
  TrainState& state_;
};

}  // namespace keel::train
