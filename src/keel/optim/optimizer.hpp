#pragma once
// The optimizer interface the trainer steps and the checkpoint saves: AdamW and Muon implement
// it; sharded versions (ZeRO-1 AdamW, distributed Muon) will too. State is addressed by name —
// (state name, parameter) -> that parameter's floats — never as "the" flat buffer of a moment,
// so an optimizer that holds only a shard of a state can still answer for what it owns.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "keel/nn/parameters.hpp"
#include "keel/optim/ownership.hpp"

namespace keel::optim {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // "adamw" or "muon": recorded in checkpoints, which refuse another optimizer's state.
  virtual std::string name() const = 0;
  // One update of every parameter from the store's gradients, each multiplied by grad_scale as
  // it is read, at learning rate lr. The scale is the clip's (train/update.hpp): folding it into
  // the optimizer's own pass over the gradients saves a read and a write of all of them, and
  // float(g · scale) is the value an in-place scaling would have stored, so the update is the same
  // bits. Every override declares the same default.
  virtual void step(nn::ParameterStore& store, float lr, float grad_scale = 1.0f) = 0;
  virtual int64_t steps_taken() const = 0;
  virtual void set_steps_taken(int64_t steps) = 0;

  // The names of its state tensors (AdamW: exp_avg, exp_avg_sq; Muon: momentum, exp_avg,
  // exp_avg_sq), in the order a checkpoint stores them for each parameter.
  virtual std::vector<std::string> state_names() const = 0;
  // State `state_name` of parameter p: p.numel floats (layout of the parameter itself).
  // Only for an optimizer that owns every parameter (one process).
  virtual std::span<float> state(const std::string& state_name, const nn::ParamInfo& p) = 0;

  // What it updates and keeps state for (ownership.hpp): everything in one process, this rank's
  // slices under ZeRO-1.
  virtual const Ownership& ownership() const = 0;
  // State `state_name` of one of its owned slices: slice.numel() floats.
  virtual std::span<float> state(const std::string& state_name, const OwnedSlice& slice) = 0;
};

}  // namespace keel::optim
