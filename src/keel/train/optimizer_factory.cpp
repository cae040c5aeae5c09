#include "keel/train/optimizer_factory.hpp"

#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/muon.hpp"

namespace keel::train {

std::unique_ptr<optim::Optimizer> make_optimizer(const RunConfig& c, const nn::ParameterStore& store) {
  const optim::AdamWConfig adam_cfg{static_cast<float>(c.beta1), static_cast<float>(c.beta2), static_cast<float>(c.eps),
                                    static_cast<float>(c.weight_decay)};
  if (c.optimizer == "muon") {
    optim::MuonConfig mc;
    mc.momentum = static_cast<float>(c.momentum);
    mc.scaling = optim::parse_muon_scaling(c.muon_scaling, c.source);
    mc.weight_decay = static_cast<float>(c.weight_decay);
    mc.adamw = adam_cfg;
    mc.force_adamw = c.adamw_patterns;
    mc.force_muon = c.muon_patterns;
    return std::make_unique<optim::Muon>(store, mc);
  }
  return std::make_unique<optim::AdamW>(store, adam_cfg);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const RunConfig& c, const nn::TransformerModel& model) {
  if (c.optimizer == "muon" && !arch::family_row(model.spec()).supports.muon) {
    throw Error(c.source, "optimizer.name",
                "Muon is not supported for model_type '" + model.spec().model_type + "'; use adamw");
  }
  return make_optimizer(c, model.parameters());
}

}  // namespace keel::train
