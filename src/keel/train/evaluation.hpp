#pragma once
// Periodic evaluation on the validation split: every eval_every steps and at the last step.
#include <cstdint>
#include <limits>

#include "keel/data/shards.hpp"
#include "keel/dist/communicator.hpp"
#include "keel/nn/model.hpp"
#include "keel/train/run_config.hpp"
#include "keel/train/step.hpp"

namespace keel::train {

// Mean next-token cross-entropy over fixed, evenly spaced windows of `val`: every evaluation of
// every run sees the same validation tokens. With comm, rank r evaluates batches r, r+N, … and
// the sums are combined in rank order (the same value on every rank).
double evaluate(nn::TransformerModel& model, const data::TokenDataset& val, const RunConfig& config,
                int64_t step = -1, dist::Communicator* comm = nullptr);

class Evaluation {
 public:
  Evaluation(nn::TransformerModel& model, const data::TokenDataset& val, const RunConfig& config,
             dist::Communicator* comm = nullptr)
      : model_(model), val_(val), config_(config), comm_(comm) {}
  // Evaluates when the step is due: sets step.evaluated and step.val_loss.
  void maybe_run(StepContext& step);
  double last() const { return last_; }  // NaN before the first evaluation

 private:
  nn::TransformerModel& model_;
  const data::TokenDataset& val_;
  const RunConfig& config_;
  dist::Communicator* comm_;
  double last_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace keel::train
