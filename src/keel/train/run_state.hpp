#pragma once
// The parts of a training run that a checkpoint (checkpoint.hpp) holds, each a Stateful under
// its name. On disk (unchanged since the first checkpoints):
//   "model"       model.safetensors: every parameter under its HF name; state.json:
//                 model_config_hash (a checkpoint never loads into another model)
//   "optimizer"   optimizer.safetensors: "<state>.<parameter name>" (exp_avg.…, exp_avg_sq.…,
//                 momentum.…); state.json: optimizer (its name), optimizer_steps
//   "train"       state.json: step, tokens, sequences (the data cursor)
//   "spike_guard" state.json: spike_guard (spike_recovery.hpp)
#include <string>

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
  OptimizerState(optim::Optimizer& optimizer, const nn::ParameterStore& store) : optimizer_(optimizer), store_(store) {}
  void save(CheckpointWriter& out) const override;
  void check(const CheckpointReader& in) const override;
  void load(CheckpointReader& in) override;

 private:
  optim::Optimizer& optimizer_;
  const nn::ParameterStore& store_;
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
