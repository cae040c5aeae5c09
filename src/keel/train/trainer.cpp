#include "keel/train/trainer.hpp"

#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>

#include "keel/arch/config_file.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/data/shards.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/io/run_lock.hpp"
#include "keel/nn/model.hpp"
#include "keel/train/checkpoint.hpp"
#include "keel/train/optimizer_factory.hpp"
#include "keel/train/progress.hpp"
#include "keel/train/run_dir.hpp"
#include "keel/train/run_state.hpp"
#include "keel/train/step_loop.hpp"

namespace keel::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Identifies the model config, so a checkpoint never loads into another model.
std::string config_hash(const json& model_config) {
  const std::string text = model_config.dump();
  return content_hash(text.data(), text.size());
}

arch::ModelSpec run_spec(const RunConfig& c, const std::string& run_dir, const json& model_config) {
  arch::ModelSpec spec = arch::spec_from_config(model_config, (fs::path(run_dir) / kModelConfigFile).string());
  if (c.seq_len > spec.max_position_embeddings) {
    throw Error(c.source, "batch.seq_len", "exceeds the model's max_position_embeddings (" +
                                               std::to_string(spec.max_position_embeddings) + ")");
  }
  return spec;
}

std::unique_ptr<nn::TransformerModel> make_model(const arch::ModelSpec& spec, const RunConfig& c, bool resuming) {
  auto model = std::make_unique<nn::TransformerModel>(spec);
  model->set_precision(c.precision);  // bf16: mixed precision over fp32 master weights
  model->initialize(c.seed);
  // A resumed run's weights come from its checkpoint; the folder it started from may be gone.
  if (!resuming && !c.init_from.empty()) io::load_weights(io::HfWeights::open_dir(c.init_from), *model);
  return model;
}

data::TokenDataset open_train_set(const RunConfig& c, const arch::ModelSpec& spec) {
  data::TokenDataset train_set = data::TokenDataset::open(c.dataset, "train");
  if (train_set.vocab_size_hint() > spec.vocab_size) {
    throw Error(c.source, "data.dataset", "token ids reach " + std::to_string(train_set.vocab_size_hint() - 1) +
                                              " but the model's vocab_size is " + std::to_string(spec.vocab_size));
  }
  return train_set;
}

// One `keel train --config` run: its parts, built in the order they need each other, and the
// checkpoint they make up.
class ConfiguredRun {
 public:
  ConfiguredRun(const RunConfig& c, const std::string& run_dir, const json& model_config, bool resuming,
                const TrainOptions& options);
  TrainResult run();

 private:
  void resume_from_newest_intact();
  TrainerParts parts();

  const RunConfig& c_;
  const std::string run_dir_;
  const bool resuming_;
  const std::string config_hash_;
  const arch::ModelSpec spec_;
  std::unique_ptr<nn::TransformerModel> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  data::TokenDataset train_set_, val_set_;
  FaultPlan faults_;
  DatasetBatches batches_;
  SingleProcessReducer reducer_;
  UpdateStage update_;
  RouterBiasHook router_bias_;
  QkClipHook qk_clip_;
  EventLog events_;
  Progress progress_;
  SpikeRecovery spikes_;
  TrainState state_;
  ModelState model_state_;
  OptimizerState optimizer_state_;
  TrainStateRecord train_record_;
  Checkpoint checkpoint_;
  Checkpointing checkpointing_;
  Evaluation evaluation_;
  MetricsFile metrics_;
  std::unique_ptr<TensorBoardMetrics> tensorboard_;
};

ConfiguredRun::ConfiguredRun(const RunConfig& c, const std::string& run_dir, const json& model_config, bool resuming,
                             const TrainOptions& options)
    : c_(c),
      run_dir_(run_dir),
      resuming_(resuming),
      config_hash_(config_hash(model_config)),
      spec_(run_spec(c, run_dir, model_config)),
      model_(make_model(spec_, c, resuming)),
      optimizer_(make_optimizer(c, *model_)),
      train_set_(open_train_set(c, spec_)),
      val_set_(data::TokenDataset::open(c.dataset, "val")),
      faults_(c, spec_.vocab_size),
      batches_(train_set_, c, &faults_),
      update_(model_->parameters(), *optimizer_, spec_.num_layers, /*measure=*/true),
      router_bias_(*model_, static_cast<float>(c.router_bias_update_speed)),
      qk_clip_(model_->parameters(), spec_, static_cast<float>(c.qk_clip_tau)),
      events_((fs::path(run_dir) / kEventsFile).string(), !resuming),
      progress_(options.progress, c.steps, c.log_every),
      spikes_(c.spikes, run_dir, events_, [this](const std::string& text) { progress_.say(text); }),
      model_state_(*model_, config_hash_),
      optimizer_state_(*optimizer_, model_->parameters()),
      train_record_(state_),
      checkpointing_(checkpoint_, run_dir, c.checkpoint_every, c.checkpoint_keep, c.steps, &faults_),
      evaluation_(*model_, val_set_, c),
      metrics_((fs::path(run_dir) / kMetricsFile).string(), spec_, !resuming) {
  checkpoint_.add("model", model_state_);
  checkpoint_.add("optimizer", optimizer_state_);
  checkpoint_.add("train", train_record_);
  checkpoint_.add("spike_guard", spikes_);
  if (resuming_) resume_from_newest_intact();
  if (options.tensorboard) tensorboard_ = std::make_unique<TensorBoardMetrics>((fs::path(run_dir) / "tensorboard").string());
}

void ConfiguredRun::resume_from_newest_intact() {
  if (!latest_complete_checkpoint(run_dir_)) throw Error(run_dir_, "", "no complete checkpoint to resume from");
  IntactCheckpoint found = load_newest_intact(run_dir_, checkpoint_, std::numeric_limits<int64_t>::max(), 0, events_,
                                              [this](const std::string& text) { progress_.say(text); });
  if (!found.loaded && found.newest_damage) throw *found.newest_damage;
  if (!found.loaded) throw Error(run_dir_, "", "no intact checkpoint to resume from");
  metrics_.rewind(state_.step);
}

TrainerParts ConfiguredRun::parts() {
  TrainerParts p;
  p.model = model_.get();
  p.batches = &batches_;
  p.reducer = &reducer_;
  p.update = &update_;
  p.lr_at = [this](int64_t step, int64_t tokens) { return lr_at(c_.schedule, step, tokens); };
  p.clip = c_.clip;
  p.faults = &faults_;
  p.spikes = &spikes_;
  p.checkpoint = &checkpoint_;
  p.hooks.push_back(&router_bias_);  // DeepSeek-V3 §2.1.2, from this step's routing
  if (c_.qk_clip_tau > 0) p.hooks.push_back(&qk_clip_);  // Kimi K2 Algorithm 1, from this step's max logits
  p.evaluation = &evaluation_;
  p.metrics = {&metrics_};
  if (tensorboard_) p.metrics.push_back(tensorboard_.get());
  p.metrics.push_back(&progress_);
  p.checkpointing = &checkpointing_;
  return p;
}

TrainResult ConfiguredRun::run() {
  // Rollback needs a checkpoint to return to from the very first step on.
  if (!resuming_ && c_.spikes.policy == SpikePolicy::Rollback) checkpointing_.save(state_);
  TrainerParts p = parts();
  const double last_loss = run_steps(p, state_, c_.steps);
  checkpointing_.save(state_);
  return {state_.step, state_.tokens, last_loss, evaluation_.last(), run_dir_,
          latest_complete_checkpoint(run_dir_).value_or("")};
}

TrainResult run_loop(const RunConfig& c, const std::string& run_dir, const json& model_config, bool resuming,
                     const TrainOptions& options) {
  ConfiguredRun run(c, run_dir, model_config, resuming, options);
  return run.run();
}

json load_model_config(const RunConfig& c) {
  arch::LoadedConfig cfg = arch::read_config_file(c.model_config_path());
  arch::apply_overrides(cfg.json, c.model_set, cfg.path);
  const arch::ModelSpec spec = arch::spec_from_config(cfg.json, cfg.path);  // validate now, naming the original file
  nn::check_trainable(spec);
  if (!c.init_from.empty()) {
    // Every tensor named, shaped and typed as the config predicts, before the run folder exists.
    const io::HfWeights weights = io::HfWeights::open_dir(c.init_from);
    io::match_weights(weights, spec).throw_if_bad(weights);
  }
  return cfg.json;
}

// Opens both splits, so every shard's data checksum is verified before the run folder is touched
// (the trainer opens them again; TokenDataset verifies a file once per process).
void verify_run_data(const RunConfig& c) {
  data::TokenDataset::open(c.dataset, "train");
  data::TokenDataset::open(c.dataset, "val");
}

}  // namespace

TrainResult train(const RunConfig& config, const TrainOptions& options) {
  const std::string run_dir = config.out;
  auto refuse_existing = [&] {
    if (latest_complete_checkpoint(run_dir)) {
      throw Error(run_dir, "run.out", "already holds a run with checkpoints; continue it with `keel train --resume " +
                                          run_dir + "` or choose another run.out");
    }
  };
  refuse_existing();
  json model_config = load_model_config(config);
  verify_run_data(config);
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw Error(run_dir, "run.out", "cannot create the run folder: " + ec.message());
  const io::FolderLock lock = io::FolderLock::acquire(run_dir, io::kRunLockFile, "keel train");
  refuse_existing();  // again under the lock: another trainer may have finished in between
  write_file_atomic((fs::path(run_dir) / kRunConfigFile).string(), to_toml(config));
  write_file_atomic((fs::path(run_dir) / kModelConfigFile).string(), model_config.dump(2) + "\n");
  return run_loop(config, run_dir, model_config, false, options);
}

TrainResult resume(const std::string& run_dir, const std::vector<std::string>& overrides, TrainOptions options) {
  const fs::path toml_path = fs::path(run_dir) / kRunConfigFile;
  if (!fs::exists(toml_path)) throw Error(run_dir, "", "not a run folder (no run.toml)");
  RunConfig c = load_run_config(toml_path.string(), overrides);
  c.out = run_dir;
  const std::string cfg_path = (fs::path(run_dir) / kModelConfigFile).string();
  json model_config = arch::parse_config_text(read_file(cfg_path, "the run's model config"), cfg_path);
  verify_run_data(c);
  const io::FolderLock lock = io::FolderLock::acquire(run_dir, io::kRunLockFile, "keel train --resume");
  if (!overrides.empty()) write_file_atomic(toml_path.string(), to_toml(c));
  options.resume = true;
  return run_loop(c, run_dir, model_config, true, options);
}

}  // namespace keel::train
