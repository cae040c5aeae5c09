#include "keel/train/run_state.hpp"

namespace keel::train {

namespace {
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
}  // namespace

void ModelState::save(CheckpointWriter& out) const {
  const nn::ParameterStore& store = model_.parameters();
  out.file(kModelFile, {{"format", "pt"}});
  for (const nn::ParamInfo& p : store.entries()) out.tensor(kModelFile, p.name, p.shape, store.values().data() + p.offset);
  out.state()["model_config_hash"] = config_hash_;
}

void ModelState::check(const CheckpointReader& in) const {
  if (!in.state().contains("model_config_hash")) {
    throw CheckpointCorrupt(in.state_path(), "", "corrupt checkpoint state: missing fields");
  }
  if (in.state()["model_config_hash"] != config_hash_) {
    throw Error(in.state_path(), "model_config_hash",
                "the checkpoint was written for another model config (config.json differs)");
  }
}

void ModelState::load(CheckpointReader& in) {
  nn::ParameterStore& store = model_.parameters();
  for (const nn::ParamInfo& p : store.entries()) in.tensor(kModelFile, p.name, p.shape, store.values().data() + p.offset);
}

void OptimizerState::save(CheckpointWriter& out) const {
  out.file(kOptimizerFile);
  // Per parameter, every state in turn: the order of today's files.
  const std::vector<std::string> names = optimizer_.state_names();
  for (const nn::ParamInfo& p : store_.entries()) {
    for (const std::string& s : names) out.tensor(kOptimizerFile, s + "." + p.name, p.shape, optimizer_.state(s, p).data());
  }
  out.state()["optimizer"] = optimizer_.name();
  out.state()["optimizer_steps"] = optimizer_.steps_taken();
}

void OptimizerState::check(const CheckpointReader& in) const {
  const std::string held = in.state().value("optimizer", std::string("adamw"));
  if (held != optimizer_.name()) {
    throw Error(in.state_path(), "optimizer", "the checkpoint holds " + held + " state but the run uses " + optimizer_.name());
  }
}

void OptimizerState::load(CheckpointReader& in) {
  const std::vector<std::string> names = optimizer_.state_names();
  for (const nn::ParamInfo& p : store_.entries()) {
    for (const std::string& s : names) in.tensor(kOptimizerFile, s + "." + p.name, p.shape, optimizer_.state(s, p).data());
  }
  optimizer_.set_steps_taken(in.state().value("optimizer_steps", int64_t{0}));
}

void TrainStateRecord::save(CheckpointWriter& out) const {
  out.state()["step"] = state_.step;
  out.state()["tokens"] = state_.tokens;
  out.state()["sequences"] = state_.sequences;
}

void TrainStateRecord::check(const CheckpointReader& in) const {
  if (!in.state().contains("step") || !in.state()["step"].is_number_integer()) {
    throw CheckpointCorrupt(in.state_path(), "", "corrupt checkpoint state: missing fields");
  }
}

void TrainStateRecord::load(CheckpointReader& in) {
  state_ = {in.state()["step"].get<int64_t>(), in.state().value("tokens", int64_t{0}),
            in.state().value("sequences", int64_t{0})};
}

}  // namespace keel::train
