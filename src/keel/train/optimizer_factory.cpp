#include "keel/train/optimizer_factory.hpp"

#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/muon.hpp"

namespace keel::train {

namespace {

optim::AdamWConfig adamw_config(const RunConfig& c) {
  return {static_cast<float>(c.beta1), static_cast<float>(c.beta2), static_cast<float>(c.eps),
          static_cast<float>(c.weight_decay)};
}

optim::MuonConfig muon_config(const RunConfig& c) {
  optim::MuonConfig mc;
  mc.momentum = static_cast<float>(c.momentum);
  mc.scaling = optim::parse_muon_scaling(c.muon_scaling, c.source);
  mc.weight_decay = static_cast<float>(c.weight_decay);
  mc.adamw = adamw_config(c);
  mc.force_adamw = c.adamw_patterns;
  mc.force_muon = c.muon_patterns;
  return mc;
}

}  // namespace

std::unique_ptr<optim::Optimizer> make_optimizer(const RunConfig& c, const nn::ParameterStore& store,
                                                 const optim::Ownership* ownership) {
  if (c.optimizer == "muon") {
    if (ownership) return std::make_unique<optim::Muon>(store, muon_config(c), *ownership);
    return std::make_unique<optim::Muon>(store, muon_config(c));
  }
  if (ownership) return std::make_unique<optim::AdamW>(adamw_config(c), *ownership);
  return std::make_unique<optim::AdamW>(store, adamw_config(c));
}

std::unique_ptr<optim::Optimizer> make_optimizer(const RunConfig& c, const nn::TransformerModel& model,
                                                 const optim::Ownership* ownership) {
  if (c.optimizer == "muon" && !arch::family_row(model.spec()).supports.muon) {
    throw Error(c.source, "optimizer.name",
                "Muon is not supported for model_type '" + model.spec().model_type + "'; use adamw");
  }
  return make_optimizer(c, model.parameters(), ownership);
}

std::vector<size_t> whole_matrices(const RunConfig& c, const nn::ParameterStore& store) {
  if (c.optimizer != "muon") return {};
  return optim::Muon::route(store, muon_config(c));
}

}  // namespace keel::train
