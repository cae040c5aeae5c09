#include "keel/train/run_state.hpp"

#include <algorithm>
#include <cstdio>

#include "keel/dist/shard_plan.hpp"

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

namespace {

// The name and shape a slice of parameter p is stored under.
std::string slice_name(const std::string& state, const nn::ParamInfo& p, int64_t begin, int64_t end) {
  std::string name = state;
  name += '.';
  name += p.name;
  if (begin != 0 || end != p.numel) {
    name += '@';
    name += std::to_string(begin);
  }
  return name;
}

std::vector<int64_t> slice_shape(const nn::ParamInfo& p, int64_t begin, int64_t end) {
  if (begin == 0 && end == p.numel) return p.shape;
  return {end - begin};
}

}  // namespace

std::string OptimizerState::file_of_rank(int rank) {
  if (rank == 0) return kOptimizerFile;
  char buf[64];
  std::snprintf(buf, sizeof buf, "optimizer.rank-%05d.safetensors", rank);
  return buf;
}

void OptimizerState::save(CheckpointWriter& out) const {
  const std::string file = file_of_rank(rank_);
  out.file(file);
  // Per owned slice, every state in turn: one process writes today's files (every parameter whole).
  const std::vector<std::string> names = optimizer_.state_names();
  for (const optim::OwnedSlice& sl : optimizer_.ownership().slices()) {
    const nn::ParamInfo& p = store_.entries().at(sl.entry);
    for (const std::string& s : names) {
      out.tensor(file, slice_name(s, p, sl.begin, sl.end), slice_shape(p, sl.begin, sl.end),
                 optimizer_.state(s, sl).data());
    }
  }
  out.state()["optimizer"] = optimizer_.name();
  out.state()["optimizer_steps"] = optimizer_.steps_taken();
  out.state()["optimizer_world"] = world_;
  if (world_ > 1) {
    // The matrices the plan kept whole: a resume recomputes this plan from them even if the run's
    // Muon routing (optimizer.muon_patterns, adamw_patterns) has changed since.
    nlohmann::json whole = nlohmann::json::array();
    for (size_t e : whole_) whole.push_back(store_.entries().at(e).name);
    out.state()["optimizer_whole_matrices"] = whole;
  }
}

void OptimizerState::check(const CheckpointReader& in) const {
  const std::string held = in.state().value("optimizer", std::string("adamw"));
  if (held != optimizer_.name()) {
    throw Error(in.state_path(), "optimizer", "the checkpoint holds " + held + " state but the run uses " + optimizer_.name());
  }
  const auto& w = in.state().value("optimizer_world", nlohmann::json(1));
  if (!w.is_number_integer() || w.get<int64_t>() < 1 || w.get<int64_t>() > 1 << 16) {
    throw CheckpointCorrupt(in.state_path(), "optimizer_world", "corrupt checkpoint state: not a world size");
  }
}

std::vector<size_t> OptimizerState::whole_at_save(const CheckpointReader& in) const {
  if (!in.state().contains("optimizer_whole_matrices")) return whole_;
  const nlohmann::json& names = in.state()["optimizer_whole_matrices"];
  if (!names.is_array()) throw CheckpointCorrupt(in.state_path(), "optimizer_whole_matrices", "corrupt checkpoint state: not a list");
  std::vector<size_t> out;
  for (const nlohmann::json& n : names) {
    const auto& entries = store_.entries();
    auto it = std::find_if(entries.begin(), entries.end(), [&](const nn::ParamInfo& p) { return n.is_string() && p.name == n; });
    if (it == entries.end()) {
      throw CheckpointCorrupt(in.state_path(), "optimizer_whole_matrices", "names a matrix the model does not have: " + n.dump());
    }
    out.push_back(static_cast<size_t>(it - entries.begin()));
  }
  return out;
}

void OptimizerState::load(CheckpointReader& in) {
  const int old_world = static_cast<int>(in.state().value("optimizer_world", int64_t{1}));
  // Who held what when the checkpoint was written: every parameter whole on one process, else the
  // shard plan of that world size (a pure function of the store and the Muon matrices).
  std::vector<dist::Piece> old_pieces;
  if (old_world == 1) {
    for (size_t e = 0; e < store_.entries().size(); ++e) old_pieces.push_back({e, 0, store_.entries()[e].numel, 0});
  } else {
    old_pieces = dist::plan_shards(store_, old_world, whole_at_save(in)).pieces;
  }
  std::vector<std::vector<size_t>> by_entry(store_.entries().size());
  for (size_t i = 0; i < old_pieces.size(); ++i) by_entry[old_pieces[i].entry].push_back(i);
  const std::vector<std::string> names = optimizer_.state_names();
  std::vector<float> scratch;
  for (const optim::OwnedSlice& sl : optimizer_.ownership().slices()) {
    const nn::ParamInfo& p = store_.entries().at(sl.entry);
    for (const std::string& s : names) {
      std::span<float> dst = optimizer_.state(s, sl);
      for (size_t i : by_entry[sl.entry]) {
        const dist::Piece& old = old_pieces[i];
        const int64_t b = std::max(old.begin, sl.begin), e = std::min(old.end, sl.end);
        if (b >= e) continue;
        const std::string file = file_of_rank(old.owner), name = slice_name(s, p, old.begin, old.end);
        if (old.begin == sl.begin && old.end == sl.end) {
          in.tensor(file, name, slice_shape(p, old.begin, old.end), dst.data());
          continue;
        }
        scratch.resize(static_cast<size_t>(old.numel()));
        in.tensor(file, name, slice_shape(p, old.begin, old.end), scratch.data());
        std::copy(scratch.begin() + (b - old.begin), scratch.begin() + (e - old.begin), dst.begin() + (b - sl.begin));
      }
    }
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
