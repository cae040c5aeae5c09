#include "keel/train/trainer.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <algorithm>
#include <sstream>

#include "keel/arch/config_file.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/data/shards.hpp"
#include "keel/dist/communicator.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/io/run_lock.hpp"
#include "keel/nn/model.hpp"
#include "keel/train/checkpoint.hpp"
#include "keel/train/data_parallel.hpp"
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
  model->set_recompute(c.recompute);
  model->set_bf16_activations(*nn::parse_bf16_activations(c.bf16_activations));
  model->set_lean_top_blocks(static_cast<size_t>(c.lean_blocks));
  const dist::Communicator* comm = dist::current();
  if (comm == nullptr || comm->is_root())
    for (const std::string& note : nn::run_start_notes(*model)) std::fprintf(stderr, "keel: note: %s\n", note.c_str());
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

// The optimizer of this process: the whole one alone, this rank's ZeRO-1 shard (gathering the
// parameters after each step) in a data-parallel run.
std::unique_ptr<optim::Optimizer> make_run_optimizer(const RunConfig& c, const nn::TransformerModel& model,
                                                     dist::Communicator& comm, const dist::ShardPlan& plan) {
  if (comm.size() == 1) return make_optimizer(c, model);
  const optim::Ownership mine = plan.ownership(comm.rank());
  return std::make_unique<ShardedOptimizer>(make_optimizer(c, model, &mine), comm, plan);
}

std::unique_ptr<GradientReducer> make_reducer(const RunConfig& c, dist::Communicator& comm, const dist::ShardPlan& plan,
                                              const nn::TransformerModel& model) {
  if (comm.size() == 1) return std::make_unique<SingleProcessReducer>();
  return std::make_unique<DataParallelReducer>(comm, plan, model.parameters(), model.spec().num_layers,
                                               c.dist_overlap);
}

// Puts where a data-parallel step's communication time went on its metrics line.
class CommTimesHook : public PostUpdateHook {
 public:
  CommTimesHook(const GradientReducer& reducer, const optim::Optimizer& optimizer)
      : reducer_(dynamic_cast<const DataParallelReducer*>(&reducer)),
        optimizer_(dynamic_cast<const ShardedOptimizer*>(&optimizer)) {}
  void after_update(StepContext& step) override { report(step); }
  void after_skip(StepContext& step) override { report(step); }

 private:
  void report(StepContext& step) const {
    if (!reducer_) return;
    const double gather = optimizer_ && !step.skipped() ? optimizer_->last_gather_seconds() : 0.0;
    step.extra["comm_exposed_s"] = reducer_->times().exposed + gather;
    step.extra["comm_overlapped_s"] = reducer_->times().early;
    step.extra["comm_bytes"] = reducer_->bytes_this_step();
  }
  const DataParallelReducer* reducer_;
  const ShardedOptimizer* optimizer_;
};

// One `keel train --config` run: its parts, built in the order they need each other, and the
// checkpoint they make up. Data parallel, every rank builds the same run; rank 0 alone writes
// metrics, events, TensorBoard and progress.
class ConfiguredRun {
 public:
  ConfiguredRun(const RunConfig& c, const std::string& run_dir, const json& model_config, bool resuming,
                const TrainOptions& options);
  TrainResult run();

 private:
  void resume_from_newest_intact();
  void report_layout();
  TrainerParts parts();

  const RunConfig& c_;
  dist::Communicator& comm_;
  const std::string run_dir_;
  const bool resuming_;
  const std::string config_hash_;
  const arch::ModelSpec spec_;
  std::unique_ptr<nn::TransformerModel> model_;
  const std::vector<size_t> muon_matrices_;  // owned whole by the shard plan
  const dist::ShardPlan plan_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  data::TokenDataset train_set_, val_set_;
  FaultPlan faults_;
  DatasetBatches batches_;
  std::unique_ptr<GradientReducer> reducer_;
  UpdateStage update_;
  CommTimesHook comm_times_;
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
  std::unique_ptr<MetricsFile> metrics_;
  std::unique_ptr<TensorBoardMetrics> tensorboard_;
};

dist::Communicator& comm_of(const TrainOptions& options) {
  static dist::SingleProcess single;
  return options.comm ? *options.comm : single;
}

ConfiguredRun::ConfiguredRun(const RunConfig& c, const std::string& run_dir, const json& model_config, bool resuming,
                             const TrainOptions& options)
    : c_(c),
      comm_(comm_of(options)),
      run_dir_(run_dir),
      resuming_(resuming),
      config_hash_(config_hash(model_config)),
      spec_(run_spec(c, run_dir, model_config)),
      model_(make_model(spec_, c, resuming)),
      muon_matrices_(whole_matrices(c, model_->parameters())),
      plan_(dist::plan_shards(model_->parameters(), comm_.size(), muon_matrices_)),
      optimizer_(make_run_optimizer(c, *model_, comm_, plan_)),
      train_set_(open_train_set(c, spec_)),
      val_set_(data::TokenDataset::open(c.dataset, "val")),
      faults_(c, spec_.vocab_size, comm_.size()),
      batches_(train_set_, c, &faults_, comm_.rank(), comm_.size()),
      reducer_(make_reducer(c, comm_, plan_, *model_)),
      update_(model_->parameters(), *optimizer_, spec_.num_layers, /*measure=*/true),
      comm_times_(*reducer_, *optimizer_),
      router_bias_(*model_, static_cast<float>(c.router_bias_update_speed), &comm_),
      qk_clip_(model_->parameters(), spec_, static_cast<float>(c.qk_clip_tau)),
      events_(comm_.is_root() ? (fs::path(run_dir) / kEventsFile).string() : std::string(), !resuming),
      progress_(comm_.is_root() ? options.progress : nullptr, c.steps, c.log_every),
      spikes_(c.spikes, run_dir, events_, [this](const std::string& text) { progress_.say(text); }),
      model_state_(*model_, config_hash_),
      optimizer_state_(*optimizer_, model_->parameters(), comm_.rank(), comm_.size(), muon_matrices_),
      train_record_(state_),
      checkpointing_(checkpoint_, run_dir, c.checkpoint_every, c.checkpoint_keep, c.steps, &faults_),
      evaluation_(*model_, val_set_, c, &comm_) {
  if (comm_.is_root()) metrics_ = std::make_unique<MetricsFile>((fs::path(run_dir) / kMetricsFile).string(), spec_, !resuming);
  checkpoint_.set_comm(&comm_);
  checkpoint_.add("model", model_state_);
  checkpoint_.add("optimizer", optimizer_state_);
  checkpoint_.add("train", train_record_);
  checkpoint_.add("spike_guard", spikes_);
  if (options.tensorboard && comm_.is_root()) tensorboard_ = std::make_unique<TensorBoardMetrics>((fs::path(run_dir) / "tensorboard").string());
}

void ConfiguredRun::resume_from_newest_intact() {
  // Every rank sees the same folder and the same (collective) loads, so fails here together.
  auto everywhere = [](Error e) {
    e.set_everywhere();
    return e;
  };
  if (!latest_complete_checkpoint(run_dir_)) throw everywhere(Error(run_dir_, "", "no complete checkpoint to resume from"));
  IntactCheckpoint found = load_newest_intact(run_dir_, checkpoint_, std::numeric_limits<int64_t>::max(), 0, events_,
                                              [this](const std::string& text) { progress_.say(text); });
  if (!found.loaded && found.newest_damage) throw everywhere(*found.newest_damage);
  if (!found.loaded) throw everywhere(Error(run_dir_, "", "no intact checkpoint to resume from"));
  if (metrics_) metrics_->rewind(state_.step);
}

// Data parallel: what each rank holds (events.jsonl, and a line of progress).
void ConfiguredRun::report_layout() {
  if (comm_.size() == 1) return;
  const int64_t state_bytes = optimizer_->ownership().state_floats() *
                              static_cast<int64_t>(optimizer_->state_names().size() * sizeof(float));
  const std::vector<std::string> all = comm_.gather_strings(std::to_string(state_bytes));
  json per_rank = json::array();
  for (const std::string& b : all) per_rank.push_back(std::stoll(b));
  const int64_t global_sequences = c_.sequences * c_.grad_accum * comm_.size();
  events_.write({{"step", state_.step}, {"type", "data_parallel"}, {"world", comm_.size()},
                 {"global_batch_sequences", global_sequences}, {"optimizer_state_bytes", per_rank},
                 {"muon_matrices_per_rank", [&] {
                    json m = json::array();
                    for (int r = 0; r < comm_.size(); ++r) {
                      int64_t n = 0;
                      for (size_t i : plan_.owned[static_cast<size_t>(r)]) {
                        if (std::binary_search(muon_matrices_.begin(), muon_matrices_.end(), plan_.pieces[i].entry)) ++n;
                      }
                      m.push_back(n);
                    }
                    return m;
                  }()}});
  progress_.say("keel: data parallel over " + std::to_string(comm_.size()) + " ranks: global batch " +
                std::to_string(global_sequences) + " sequences; optimizer state " +
                std::to_string(per_rank[0].get<int64_t>()) + " bytes on rank 0 (ZeRO-1)");
}

TrainerParts ConfiguredRun::parts() {
  TrainerParts p;
  p.model = model_.get();
  p.batches = &batches_;
  p.reducer = reducer_.get();
  p.update = &update_;
  p.lr_at = [this](int64_t step, int64_t tokens) { return lr_at(c_.schedule, step, tokens); };
  p.clip = c_.clip;
  p.faults = &faults_;
  p.spikes = &spikes_;
  p.checkpoint = &checkpoint_;
  p.hooks.push_back(&router_bias_);  // DeepSeek-V3 §2.1.2, from this step's routing
  if (c_.qk_clip_tau > 0) p.hooks.push_back(&qk_clip_);  // Kimi K2 Algorithm 1, from this step's max logits
  p.hooks.push_back(&comm_times_);
  p.evaluation = &evaluation_;
  if (metrics_) p.metrics.push_back(metrics_.get());
  if (tensorboard_) p.metrics.push_back(tensorboard_.get());
  p.metrics.push_back(&progress_);
  p.checkpointing = &checkpointing_;
  return p;
}

TrainResult ConfiguredRun::run() {
  // Collective from here on: every rank has built its run (run_loop agreed on it).
  if (resuming_) resume_from_newest_intact();
  report_layout();
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
  std::optional<ConfiguredRun> run;
  dist::agree(comm_of(options), [&] { run.emplace(c, run_dir, model_config, resuming, options); });
  return run->run();
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
  dist::Communicator& comm = comm_of(options);
  const std::string run_dir = config.out;
  auto refuse_existing = [&] {
    if (latest_complete_checkpoint(run_dir)) {
      throw Error(run_dir, "run.out", "already holds a run with checkpoints; continue it with `keel train --resume " +
                                          run_dir + "` or choose another run.out");
    }
  };
  json model_config;
  dist::agree(comm, [&] {  // every rank reads and checks the same config and data
    refuse_existing();
    model_config = load_model_config(config);
    verify_run_data(config);
  });
  std::optional<io::FolderLock> lock;
  dist::agree(comm, [&] {  // rank 0 alone makes the run folder
    if (!comm.is_root()) return;
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec) throw Error(run_dir, "run.out", "cannot create the run folder: " + ec.message());
    lock.emplace(io::FolderLock::acquire(run_dir, io::kRunLockFile, "keel train"));
    refuse_existing();  // again under the lock: another trainer may have finished in between
    write_file_atomic((fs::path(run_dir) / kRunConfigFile).string(), to_toml(config));
    write_file_atomic((fs::path(run_dir) / kModelConfigFile).string(), model_config.dump(2) + "\n");
  });
  return run_loop(config, run_dir, model_config, false, options);
}

TrainResult resume(const std::string& run_dir, const std::vector<std::string>& overrides, TrainOptions options) {
  dist::Communicator& comm = comm_of(options);
  const fs::path toml_path = fs::path(run_dir) / kRunConfigFile;
  RunConfig c;
  json model_config;
  dist::agree(comm, [&] {
    if (!fs::exists(toml_path)) throw Error(run_dir, "", "not a run folder (no run.toml)");
    c = load_run_config(toml_path.string(), overrides);
    c.out = run_dir;
    const std::string cfg_path = (fs::path(run_dir) / kModelConfigFile).string();
    model_config = arch::parse_config_text(read_file(cfg_path, "the run's model config"), cfg_path);
    verify_run_data(c);
  });
  std::optional<io::FolderLock> lock;
  dist::agree(comm, [&] {
    if (!comm.is_root()) return;
    lock.emplace(io::FolderLock::acquire(run_dir, io::kRunLockFile, "keel train --resume"));
    if (!overrides.empty()) write_file_atomic(toml_path.string(), to_toml(c));
  });
  options.resume = true;
  return run_loop(c, run_dir, model_config, true, options);
}

}  // namespace keel::train
