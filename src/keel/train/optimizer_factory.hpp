#pragma once
// The optimizer a run config's [optimizer] section asks for.
#include <memory>
#include <vector>

#include "keel/nn/model.hpp"
#include "keel/nn/parameters.hpp"
#include "keel/optim/optimizer.hpp"
#include "keel/optim/ownership.hpp"
#include "keel/train/run_config.hpp"

namespace keel::train {

// optimizer = "muon": Muon on the hidden matrices with its AdamW group (betas, eps, weight decay,
// momentum, scaling, forced patterns from the config); otherwise AdamW on everything.
// ownership: only those slices (ZeRO-1; dist/shard_plan.hpp); null: every parameter.
std::unique_ptr<optim::Optimizer> make_optimizer(const RunConfig& config, const nn::ParameterStore& store,
                                                 const optim::Ownership* ownership = nullptr);
// The same for a model, refusing Muon (naming the run config's optimizer.name) for a family
// whose row does not support it.
std::unique_ptr<optim::Optimizer> make_optimizer(const RunConfig& config, const nn::TransformerModel& model,
                                                 const optim::Ownership* ownership = nullptr);
// The matrices the config's optimizer must see whole (Muon's; none for AdamW), store indices.
std::vector<size_t> whole_matrices(const RunConfig& config, const nn::ParameterStore& store);

}  // namespace keel::train
