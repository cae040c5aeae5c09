#pragma once
// Data parallelism with ZeRO-1 and distributed Muon (docs/distributed.md). Every rank holds the
// whole model and runs its slice of the step's micro-batches; then
//   reduce   DataParallelReducer: gradients reduce-scattered to their owners (dist/shard_plan.hpp)
//            in fixed rank order, bucket by bucket as the backward pass finishes each block
//            (non-blocking, overlapping the blocks below); loss sums and monitors summed (max
//            logits: MAX), so clipping, the spike guard, QK-Clip and the router bias all decide
//            from global values and every rank decides the same;
//   update   ShardedOptimizer: each rank updates what it owns — AdamW's slices with their moments,
//            whole Muon matrices with Newton–Schulz run once, on the owner — then the parameters
//            are all-gathered so every rank holds the same weights again.
#include <cstdint>
#include <memory>
#include <vector>

#include "keel/dist/communicator.hpp"
#include "keel/dist/shard_plan.hpp"
#include "keel/nn/parameters.hpp"
#include "keel/optim/optimizer.hpp"
#include "keel/train/gradient_reducer.hpp"

namespace keel::train {

// Where the time of a step's communication went (seconds, this rank).
struct CommTimes {
  double exposed = 0;  // waited for in reduce() and the parameter gather: not hidden by compute
  double early = 0;    // spent packing and starting buckets during the backward pass
  int64_t bytes = 0;   // handed to collectives since begin_step (through the parameter gather)
};

class DataParallelReducer : public GradientReducer {
 public:
  // layers: the model's blocks (one bucket each, reduced as backward finishes it; the embeddings,
  // final norm and head travel last). overlap false: every bucket starts after backward.
  DataParallelReducer(dist::Communicator& comm, const dist::ShardPlan& plan, const nn::ParameterStore& store,
                      int64_t layers, bool overlap);
  ~DataParallelReducer() override;

  void begin_step() override;
  void layer_ready(nn::ParameterStore& store, int64_t layer) override;
  bool overlaps() const override { return overlap_; }
  void reduce(nn::ParameterStore& store, StepContext& step) override;
  double grad_norm(const nn::ParameterStore& store) override;

  const CommTimes& times() const { return times_; }
  // Bytes this rank has sent since begin_step().
  int64_t bytes_this_step() const { return comm_.bytes_sent() - bytes_at_begin_; }

 private:
  struct Bucket;
  void start(nn::ParameterStore& store, Bucket& b);
  void reduce_monitors(StepContext& step);

  dist::Communicator& comm_;
  const dist::ShardPlan& plan_;
  bool overlap_;
  // In the order backward finishes them: block L−1 first, …, block 0, then everything else.
  std::vector<std::unique_ptr<Bucket>> buckets_;
  CommTimes times_;
  int64_t bytes_at_begin_ = 0;
};

// The optimizer of one rank under ZeRO-1: steps `inner` (which owns plan.ownership(rank)), then
// all-gathers the updated parameters.
class ShardedOptimizer : public optim::Optimizer {
 public:
  ShardedOptimizer(std::unique_ptr<optim::Optimizer> inner, dist::Communicator& comm, const dist::ShardPlan& plan);
  std::string name() const override { return inner_->name(); }
  void step(nn::ParameterStore& store, float lr, float grad_scale = 1.0f) override;
  int64_t steps_taken() const override { return inner_->steps_taken(); }
  void set_steps_taken(int64_t steps) override { inner_->set_steps_taken(steps); }
  std::vector<std::string> state_names() const override { return inner_->state_names(); }
  std::span<float> state(const std::string& state_name, const nn::ParamInfo& p) override {
    return inner_->state(state_name, p);
  }
  const optim::Ownership& ownership() const override { return inner_->ownership(); }
  std::span<float> state(const std::string& state_name, const optim::OwnedSlice& slice) override {
    return inner_->state(state_name, slice);
  }
  optim::Optimizer& inner() { return *inner_; }
  double last_gather_seconds() const { return gather_seconds_; }

 private:
  std::unique_ptr<optim::Optimizer> inner_;
  dist::Communicator& comm_;
  const dist::ShardPlan& plan_;
  std::vector<float> mine_, all_;
  double gather_seconds_ = 0;
};

}  // namespace keel::train
