#include "keel/train/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "keel/arch/config_file.hpp"
#include "keel/core/error.hpp"
#include "keel/core/rng.hpp"
#include "keel/data/shards.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/nn/model.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/grad_clip.hpp"
#include "keel/optim/muon.hpp"
#include "keel/optim/qk_clip.hpp"
#include "keel/train/checkpoint.hpp"
#include "keel/train/run_dir.hpp"
#include "keel/train/tensorboard.hpp"

namespace keel::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kDataStream = 0xDA7A5EEDull;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path, "", "cannot open");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Draws training windows: sequence k of the run starts at a position that is a pure function of
// (seed, k), so the data order survives any interruption given only the cursor k.
class WindowSampler {
 public:
  WindowSampler(const data::TokenDataset& ds, int64_t seq_len, uint64_t seed)
      : ds_(ds), seq_len_(seq_len), seed_(seed) {
    if (ds.size() < seq_len + 1) {
      throw Error("", "batch.seq_len", "the dataset holds " + std::to_string(ds.size()) + " tokens, fewer than seq_len + 1");
    }
  }
  // Fills tokens/targets (sequences, seq_len) with windows k0, k0+1, ...
  void fill(int64_t k0, int64_t sequences, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) const {
    tokens.resize(static_cast<size_t>(sequences * seq_len_));
    targets.resize(tokens.size());
    std::vector<int32_t> window(static_cast<size_t>(seq_len_ + 1));
    const uint64_t span = static_cast<uint64_t>(ds_.size() - seq_len_);
    for (int64_t i = 0; i < sequences; ++i) {
      const int64_t start = static_cast<int64_t>(uniform_int_at(seed_, kDataStream, static_cast<uint64_t>(k0 + i), span));
      ds_.read(start, seq_len_ + 1, window.data());
      std::copy(window.begin(), window.end() - 1, tokens.begin() + i * seq_len_);
      std::copy(window.begin() + 1, window.end(), targets.begin() + i * seq_len_);
    }
  }

 private:
  const data::TokenDataset& ds_;
  int64_t seq_len_;
  uint64_t seed_;
};

double evaluate(nn::TransformerModel& model, const data::TokenDataset& val, const RunConfig& c) {
  // Fixed, evenly spaced windows: every evaluation of every run sees the same validation tokens.
  const int64_t n = c.eval_batches * c.sequences;
  const int64_t span = val.size() - c.seq_len - 1;
  if (span < 0) throw Error("", "batch.seq_len", "the validation split is shorter than seq_len + 1");
  std::vector<int32_t> tokens(static_cast<size_t>(c.sequences * c.seq_len)), targets(tokens.size()),
      window(static_cast<size_t>(c.seq_len + 1));
  double ce = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < c.eval_batches; ++b) {
    for (int64_t i = 0; i < c.sequences; ++i) {
      const int64_t k = b * c.sequences + i;
      const int64_t start = n > 1 ? span * k / (n - 1) : 0;
      val.read(start, c.seq_len + 1, window.data());
      std::copy(window.begin(), window.end() - 1, tokens.begin() + i * c.seq_len);
      std::copy(window.begin() + 1, window.end(), targets.begin() + i * c.seq_len);
    }
    auto r = model.forward_loss(tokens.data(), targets.data(), c.sequences, c.seq_len);
    ce += r.ce_sum;
    count += r.count;
  }
  return count ? ce / static_cast<double>(count) : 0.0;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

// Keeps only the metrics lines up to `step` (a resumed run rewrites what follows).
void truncate_metrics(const fs::path& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("step")) continue;  // a torn last line from a kill
    if (j["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  io::write_file_atomic(path.string(), kept);
}

TrainResult run_loop(const RunConfig& c, const std::string& run_dir, const json& model_config, bool resuming,
                     const TrainOptions& options) {
  const std::string config_text = model_config.dump();
  const std::string config_hash = content_hash(config_text.data(), config_text.size());
  arch::ModelSpec spec = arch::spec_from_config(model_config, (fs::path(run_dir) / kModelConfigFile).string());
  if (c.seq_len > spec.max_position_embeddings) {
    throw Error(c.source, "batch.seq_len", "exceeds the model's max_position_embeddings (" +
                                               std::to_string(spec.max_position_embeddings) + ")");
  }
  nn::TransformerModel model(spec);
  model.set_precision(c.precision);  // bf16: mixed precision over fp32 master weights
  model.initialize(c.seed);
  auto& store = model.parameters();
  const optim::AdamWConfig adam_cfg{static_cast<float>(c.beta1), static_cast<float>(c.beta2), static_cast<float>(c.eps),
                                    static_cast<float>(c.weight_decay)};
  // One of the two optimizers; the checkpoint sees either as named store-shaped buffers.
  std::unique_ptr<optim::AdamW> adamw;
  std::unique_ptr<optim::Muon> muon;
  OptimizerState opt_state;
  opt_state.name = c.optimizer;
  if (c.optimizer == "muon") {
    optim::MuonConfig mc;
    mc.momentum = static_cast<float>(c.momentum);
    mc.scaling = optim::parse_muon_scaling(c.muon_scaling);
    mc.weight_decay = static_cast<float>(c.weight_decay);
    mc.adamw = adam_cfg;
    mc.force_adamw = c.adamw_patterns;
    mc.force_muon = c.muon_patterns;
    muon = std::make_unique<optim::Muon>(store, mc);
    opt_state.buffers = {{"momentum", &muon->momentum_buffer()},
                         {"exp_avg", &muon->adamw().first_moment()},
                         {"exp_avg_sq", &muon->adamw().second_moment()}};
  } else {
    adamw = std::make_unique<optim::AdamW>(store, adam_cfg);
    opt_state.buffers = {{"exp_avg", &adamw->first_moment()}, {"exp_avg_sq", &adamw->second_moment()}};
  }
  auto optimizer_step = [&](float lr) {
    if (muon) muon->step(store, lr);
    else adamw->step(store, lr);
  };
  auto optimizer_steps = [&] { return muon ? muon->steps_taken() : adamw->steps_taken(); };

  data::TokenDataset train_set = data::TokenDataset::open(c.dataset, "train");
  data::TokenDataset val_set = data::TokenDataset::open(c.dataset, "val");
  if (train_set.vocab_size_hint() > spec.vocab_size) {
    throw Error(c.source, "data.dataset", "token ids reach " + std::to_string(train_set.vocab_size_hint() - 1) +
                                              " but the model's vocab_size is " + std::to_string(spec.vocab_size));
  }
  WindowSampler sampler(train_set, c.seq_len, c.seed);

  TrainState state;
  const fs::path metrics_path = fs::path(run_dir) / kMetricsFile;
  if (resuming) {
    auto latest = latest_complete_checkpoint(run_dir);
    if (!latest) throw Error(run_dir, "", "no complete checkpoint to resume from");
    state = load_checkpoint(*latest, model, opt_state, config_hash);
    if (muon) muon->set_steps_taken(opt_state.steps);
    else adamw->set_steps_taken(opt_state.steps);
    truncate_metrics(metrics_path, state.step);
  } else {
    io::write_file_atomic(metrics_path.string(), "");
  }
  std::ofstream metrics(metrics_path, std::ios::app);
  std::unique_ptr<TensorBoardWriter> tb;
  if (options.tensorboard) tb = std::make_unique<TensorBoardWriter>((fs::path(run_dir) / "tensorboard").string());

  const bool tty = options.progress && ::isatty(::fileno(options.progress));
  const int64_t heads = spec.attention.num_heads;
  std::vector<int32_t> tokens, targets;
  std::vector<float> step_max(static_cast<size_t>(spec.num_layers * heads));
  const int64_t experts = spec.moe.enabled ? spec.moe.num_experts : 0;
  std::vector<double> step_load(static_cast<size_t>(spec.num_layers * experts)), step_entropy(static_cast<size_t>(spec.num_layers));
  double last_loss = std::numeric_limits<double>::quiet_NaN(), last_val = std::numeric_limits<double>::quiet_NaN();
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = state.step;
  auto checkpoint = [&] {
    opt_state.steps = optimizer_steps();
    save_checkpoint(run_dir, state, model, opt_state, config_hash, c.checkpoint_keep);
  };

  while (state.step < c.steps) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t step = state.step + 1;
    const int64_t accum = accumulation_at(c.ramp, c.grad_accum, state.tokens);
    const int64_t predicted = accum * c.sequences * c.seq_len;
    store.zero_grad();
    std::fill(step_max.begin(), step_max.end(), -std::numeric_limits<float>::infinity());
    std::fill(step_load.begin(), step_load.end(), 0.0);
    std::fill(step_entropy.begin(), step_entropy.end(), 0.0);
    double ce = 0, z = 0;
    for (int64_t a = 0; a < accum; ++a) {
      sampler.fill(state.sequences, c.sequences, tokens, targets);
      state.sequences += c.sequences;
      auto r = model.forward_backward(tokens.data(), targets.data(), c.sequences, c.seq_len,
                                      1.0f / static_cast<float>(predicted));
      ce += r.ce_sum;
      z += r.z_sum;
      const auto& ml = model.max_logits();
      for (size_t i = 0; i < step_max.size(); ++i) step_max[i] = std::max(step_max[i], ml[i]);
      // Micro-batches hold equal token counts, so the mean of their shares is the step's share.
      for (size_t i = 0; i < step_load.size(); ++i) step_load[i] += model.expert_load()[i] / static_cast<double>(accum);
      if (experts > 0) {
        for (size_t i = 0; i < step_entropy.size(); ++i) step_entropy[i] += model.router_entropy()[i] / static_cast<double>(accum);
      }
    }
    const double loss = (ce + spec.z_loss * z) / static_cast<double>(predicted);
    if (!std::isfinite(loss)) {
      throw Error(run_dir, "loss", "became non-finite at step " + std::to_string(step) +
                                       "; lower optimizer.lr or raise schedule.warmup_steps");
    }
    const double grad_norm = c.clip > 0 ? optim::clip_grad_norm(store.grads(), c.clip) : optim::global_grad_norm(store.grads());
    const double lr = lr_at(c.schedule, step, state.tokens);
    optimizer_step(static_cast<float>(lr));
    // Auxiliary-loss-free balancing (DeepSeek-V3 §2.1.2): after the update, from this step's routing.
    if (experts > 0) model.update_router_bias(static_cast<float>(c.router_bias_update_speed));
    // QK-Clip (Kimi K2 Algorithm 1): after the update, from this step's per-head max logits.
    int64_t clipped_heads = 0;
    if (c.qk_clip_tau > 0) {
      clipped_heads = optim::qk_clip(store, spec, step_max, {static_cast<float>(c.qk_clip_tau)}).clipped_heads;
    }
    state.step = step;
    state.tokens += predicted;
    last_loss = ce / static_cast<double>(predicted);

    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = static_cast<double>(predicted) / seconds;
    float max_logit = -std::numeric_limits<float>::infinity();
    json per_head = json::array();
    for (int64_t l = 0; l < spec.num_layers; ++l) {
      json row = json::array();
      for (int64_t h = 0; h < heads; ++h) {
        const float v = step_max[static_cast<size_t>(l * heads + h)];
        max_logit = std::max(max_logit, v);
        row.push_back(v);
      }
      per_head.push_back(row);
    }
    json line = {{"step", step},       {"tokens", state.tokens},      {"loss", loss},
                 {"ce", last_loss},    {"lr", lr},                    {"grad_norm", grad_norm},
                 {"tokens_per_s", tps}, {"batch_sequences", accum * c.sequences},
                 {"max_logit", max_logit}, {"max_logit_per_head", per_head}};
    if (c.qk_clip_tau > 0) line["qk_clip_heads"] = clipped_heads;
    if (experts > 0) {
      // Per layer; dense layers (first_k_dense_replace, mlp_only_layers) are null.
      json load = json::array(), entropy = json::array();
      for (int64_t l = 0; l < spec.num_layers; ++l) {
        if (!spec.is_moe_layer(l)) {
          load.push_back(nullptr);
          entropy.push_back(nullptr);
          continue;
        }
        json row = json::array();
        for (int64_t e = 0; e < experts; ++e) row.push_back(step_load[static_cast<size_t>(l * experts + e)]);
        load.push_back(row);
        entropy.push_back(step_entropy[static_cast<size_t>(l)]);
      }
      line["expert_load"] = load;
      line["router_entropy"] = entropy;
    }
    const bool eval_now = (c.eval_every > 0 && step % c.eval_every == 0) || step == c.steps;
    if (eval_now) {
      last_val = evaluate(model, val_set, c);
      line["val_loss"] = last_val;
    }
    metrics << line.dump() << "\n";
    metrics.flush();
    if (tb) {
      tb->scalar("train/loss", loss, step);
      tb->scalar("train/lr", lr, step);
      tb->scalar("train/grad_norm", grad_norm, step);
      tb->scalar("train/max_logit", max_logit, step);
      if (eval_now) tb->scalar("val/loss", last_val, step);
      tb->flush();
    }

    if (options.progress && (tty || step % c.log_every == 0 || step == c.steps || eval_now)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      const double eta = elapsed / static_cast<double>(step - first_step) * static_cast<double>(c.steps - step);
      char val_text[32] = "-";
      if (std::isfinite(last_val)) std::snprintf(val_text, sizeof val_text, "%.4f", last_val);
      std::fprintf(options.progress,
                   "%sstep %lld/%lld  loss %.4f  val %s  lr %.3g  gnorm %.3f  %.0f tok/s  max_logit %.2f  ETA %s%s",
                   tty ? "\r\033[K" : "", static_cast<long long>(step), static_cast<long long>(c.steps), loss, val_text,
                   lr, grad_norm, tps, max_logit, format_duration(eta).c_str(), tty ? "" : "\n");
      std::fflush(options.progress);
    }
    if (c.checkpoint_every > 0 && step % c.checkpoint_every == 0 && step != c.steps) checkpoint();
  }
  if (tty) std::fprintf(options.progress, "\n");
  checkpoint();
  return {state.step, state.tokens, last_loss, last_val, run_dir, latest_complete_checkpoint(run_dir).value_or("")};
}

json load_model_config(const RunConfig& c) {
  arch::LoadedConfig cfg = arch::read_config_file(c.model_config);
  arch::apply_overrides(cfg.json, c.model_set, cfg.path);
  arch::spec_from_config(cfg.json, cfg.path);  // validate now, naming the original file
  return cfg.json;
}

}  // namespace

TrainResult train(const RunConfig& config, const TrainOptions& options) {
  const std::string run_dir = config.out;
  if (latest_complete_checkpoint(run_dir)) {
    throw Error(run_dir, "run.out", "already holds a run with checkpoints; continue it with `keel train --resume " +
                                        run_dir + "` or choose another run.out");
  }
  json model_config = load_model_config(config);
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw Error(run_dir, "run.out", "cannot create the run folder: " + ec.message());
  io::write_file_atomic((fs::path(run_dir) / kRunConfigFile).string(), to_toml(config));
  io::write_file_atomic((fs::path(run_dir) / kModelConfigFile).string(), model_config.dump(2) + "\n");
  return run_loop(config, run_dir, model_config, false, options);
}

TrainResult resume(const std::string& run_dir, const std::vector<std::string>& overrides, TrainOptions options) {
  const fs::path toml_path = fs::path(run_dir) / kRunConfigFile;
  if (!fs::exists(toml_path)) throw Error(run_dir, "", "not a run folder (no run.toml)");
  RunConfig c = load_run_config(toml_path.string(), overrides);
  c.out = run_dir;
  const std::string cfg_path = (fs::path(run_dir) / kModelConfigFile).string();
  json model_config = arch::parse_config_text(read_text(cfg_path), cfg_path);
  if (!overrides.empty()) io::write_file_atomic(toml_path.string(), to_toml(c));
  options.resume = true;
  return run_loop(c, run_dir, model_config, true, options);
}

}  // namespace keel::train
