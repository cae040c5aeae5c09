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
#include "keel/train/spike_guard.hpp"
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

// Appends the run's events (spikes, skips, rollbacks, damaged checkpoints, aborts) to
// RUN_DIR/events.jsonl, one JSON object per line. Never truncated: metrics.jsonl is rewritten
// after a rollback or a resume, this file keeps what happened.
class EventLog {
 public:
  EventLog(const fs::path& path, bool fresh) : path_(path) {
    if (fresh) io::write_file_atomic(path.string(), "");
    out_.open(path, std::ios::app);
    if (!out_) throw Error(path.string(), "", "cannot open for writing");
  }
  void write(const json& event) {
    out_ << event.dump() << "\n";
    out_.flush();
  }

 private:
  fs::path path_;
  std::ofstream out_;
};

// The layer a parameter belongs to, from its HF name ("model.layers.3.…", "transformer.h.3.…"),
// or -1 for embeddings, the final norm and the head.
int64_t layer_of(const std::string& name) {
  size_t pos = 0;
  std::string prev;
  while (pos <= name.size()) {
    size_t dot = name.find('.', pos);
    if (dot == std::string::npos) dot = name.size();
    const std::string part = name.substr(pos, dot - pos);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) && (prev == "layers" || prev == "h")) {
      return std::stoll(part);
    }
    prev = part;
    pos = dot + 1;
  }
  return -1;
}

// Deliberate damage for the fault-injection tests: flips bytes in the middle of the weights.
void damage_checkpoint(const std::string& dir) {
  std::fstream f(fs::path(dir) / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return;
  f.seekg(0, std::ios::end);
  const auto size = static_cast<int64_t>(f.tellg());
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t at = size / 2 + i;
    char c = 0;
    f.seekg(at);
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x5a));
  }
}

bool contains(const std::vector<int64_t>& steps, int64_t step) {
  return std::find(steps.begin(), steps.end(), step) != steps.end();
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
  auto set_optimizer_steps = [&](int64_t n) {
    if (muon) muon->set_steps_taken(n);
    else adamw->set_steps_taken(n);
  };

  data::TokenDataset train_set = data::TokenDataset::open(c.dataset, "train");
  data::TokenDataset val_set = data::TokenDataset::open(c.dataset, "val");
  if (train_set.vocab_size_hint() > spec.vocab_size) {
    throw Error(c.source, "data.dataset", "token ids reach " + std::to_string(train_set.vocab_size_hint() - 1) +
                                              " but the model's vocab_size is " + std::to_string(spec.vocab_size));
  }
  WindowSampler sampler(train_set, c.seq_len, c.seed);

  EventLog events(fs::path(run_dir) / kEventsFile, !resuming);
  SpikeGuard guard(c.spikes);
  int64_t skips_used = 0, rollbacks_used = 0;
  auto guard_state = [&] {
    json g = guard.state();
    g["skips"] = skips_used;
    g["rollbacks"] = rollbacks_used;
    return g;
  };
  TrainState state;
  const fs::path metrics_path = fs::path(run_dir) / kMetricsFile;
  std::ofstream metrics;
  auto reopen_metrics_at = [&](int64_t step) {
    if (metrics.is_open()) metrics.close();
    truncate_metrics(metrics_path, step);
    metrics.open(metrics_path, std::ios::app);
  };
  const bool tty = options.progress && ::isatty(::fileno(options.progress));
  auto say = [&](const std::string& text) {
    if (!options.progress) return;
    std::fprintf(options.progress, "%s%s\n", tty ? "\r\033[K" : "", text.c_str());
    std::fflush(options.progress);
  };

  // Loads the newest intact checkpoint at or before max_step. A damaged one is recorded, moved
  // aside as checkpoints/corrupt_step_N (kept for inspection, never loaded again) and the next
  // older one is tried. Returns nullopt when none is left; throws what is not damage.
  std::optional<CheckpointCorrupt> newest_damage;  // of the last search, for the error message
  auto load_newest_intact = [&](int64_t max_step, int64_t at_step) -> std::optional<TrainState> {
    auto all = complete_checkpoints(run_dir);
    newest_damage.reset();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      const int64_t ckpt_step = std::stoll(fs::path(*it).filename().string().substr(5));
      if (ckpt_step > max_step) continue;
      try {
        TrainState loaded = load_checkpoint(*it, model, opt_state, config_hash);
        set_optimizer_steps(opt_state.steps);
        return loaded;
      } catch (const CheckpointCorrupt& e) {
        if (!newest_damage) newest_damage = e;
        const fs::path aside = fs::path(*it).parent_path() / ("corrupt_" + fs::path(*it).filename().string());
        std::error_code ec;
        fs::remove_all(aside, ec);
        fs::rename(*it, aside, ec);
        events.write({{"step", at_step}, {"type", "checkpoint_corrupt"}, {"checkpoint", *it}, {"reason", e.what()}});
        say("keel: checkpoint " + *it + " is damaged (" + e.reason() + "); trying an older one");
      }
    }
    return std::nullopt;
  };

  if (resuming) {
    if (!latest_complete_checkpoint(run_dir)) throw Error(run_dir, "", "no complete checkpoint to resume from");
    auto loaded = load_newest_intact(std::numeric_limits<int64_t>::max(), 0);
    if (!loaded && newest_damage) throw *newest_damage;
    if (!loaded) throw Error(run_dir, "", "no intact checkpoint to resume from");
    state = *loaded;
    guard.restore(state.guard);
    if (state.guard.is_object()) {
      skips_used = state.guard.value("skips", int64_t{0});
      rollbacks_used = state.guard.value("rollbacks", int64_t{0});
    }
    reopen_metrics_at(state.step);
  } else {
    io::write_file_atomic(metrics_path.string(), "");
    metrics.open(metrics_path, std::ios::app);
  }
  std::unique_ptr<TensorBoardWriter> tb;
  if (options.tensorboard) tb = std::make_unique<TensorBoardWriter>((fs::path(run_dir) / "tensorboard").string());

  const int64_t heads = spec.attention.num_heads, layers = spec.num_layers;
  std::vector<int32_t> tokens, targets;
  std::vector<float> step_max(static_cast<size_t>(layers * heads));
  const int64_t experts = spec.moe.enabled ? spec.moe.num_experts : 0;
  std::vector<double> step_load(static_cast<size_t>(layers * experts)), step_entropy(static_cast<size_t>(layers)),
      step_act(static_cast<size_t>(layers));
  // The update-to-weight ratio needs the weights before the update; the copy also lets a step
  // whose update made a parameter non-finite be undone under the skip policy.
  std::vector<float> before(static_cast<size_t>(store.size()));
  std::vector<int64_t> param_layer;
  for (const nn::ParamInfo& p : store.entries()) param_layer.push_back(layer_of(p.name));
  double last_loss = std::numeric_limits<double>::quiet_NaN(), last_val = std::numeric_limits<double>::quiet_NaN();
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = state.step;
  // Faults (tests of the recovery paths). A poisoned step poisons the data it draws in the
  // uninterrupted run, the cursor range [from, to): a rollback that skips it never meets it
  // again, a replay would. Damage to a checkpoint happens once.
  std::vector<std::pair<int64_t, int64_t>> poisoned;
  {
    TrainState sim;
    for (int64_t s = 1; s <= c.steps; ++s) {
      const int64_t drawn = accumulation_at(c.ramp, c.grad_accum, sim.tokens) * c.sequences;
      if (contains(c.poison_steps, s)) poisoned.emplace_back(sim.sequences, sim.sequences + drawn);
      sim.sequences += drawn;
      sim.tokens += drawn * c.seq_len;
    }
  }
  auto is_poisoned = [&](int64_t cursor) {
    for (auto [from, to] : poisoned) {
      if (cursor >= from && cursor < to) return true;
    }
    return false;
  };
  std::vector<int64_t> damage_pending = c.corrupt_checkpoint_steps;
  auto checkpoint = [&] {
    opt_state.steps = optimizer_steps();
    state.guard = guard_state();
    save_checkpoint(run_dir, state, model, opt_state, config_hash, c.checkpoint_keep);
    if (auto it = std::find(damage_pending.begin(), damage_pending.end(), state.step); it != damage_pending.end()) {
      damage_pending.erase(it);
      if (auto latest = latest_complete_checkpoint(run_dir)) damage_checkpoint(*latest);
    }
  };
  // Rollback needs a checkpoint to return to from the very first step on.
  if (!resuming && c.spikes.policy == SpikePolicy::Rollback) checkpoint();
  json pending_events = json::array();  // shown on the next metrics line written

  while (state.step < c.steps) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t step = state.step + 1;
    const int64_t accum = accumulation_at(c.ramp, c.grad_accum, state.tokens);
    const int64_t predicted = accum * c.sequences * c.seq_len;
    store.zero_grad();
    std::fill(step_max.begin(), step_max.end(), -std::numeric_limits<float>::infinity());
    std::fill(step_load.begin(), step_load.end(), 0.0);
    std::fill(step_entropy.begin(), step_entropy.end(), 0.0);
    std::fill(step_act.begin(), step_act.end(), 0.0);
    double ce = 0, z = 0;
    for (int64_t a = 0; a < accum; ++a) {
      sampler.fill(state.sequences, c.sequences, tokens, targets);
      if (is_poisoned(state.sequences)) {
        // A poisoned batch: uniformly random tokens, the same for a given (seed, cursor).
        for (size_t i = 0; i < tokens.size(); ++i) {
          const uint64_t at = static_cast<uint64_t>(state.sequences * c.seq_len) + i;
          tokens[i] = static_cast<int32_t>(uniform_int_at(c.seed, 0xBAD0DA7Aull, 2 * at, static_cast<uint64_t>(spec.vocab_size)));
          targets[i] = static_cast<int32_t>(uniform_int_at(c.seed, 0xBAD0DA7Aull, 2 * at + 1, static_cast<uint64_t>(spec.vocab_size)));
        }
      }
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
      for (size_t i = 0; i < step_act.size(); ++i) step_act[i] += model.activation_mean_square()[i] / static_cast<double>(accum);
    }
    if (contains(c.nan_grad_steps, step) && store.size() > 0) store.grads()[static_cast<size_t>(store.size() / 2)] = std::nanf("");
    const double loss = (ce + spec.z_loss * z) / static_cast<double>(predicted);
    const double grad_norm = optim::global_grad_norm(store.grads());  // before clipping
    const double lr = lr_at(c.schedule, step, state.tokens);

    // Spike handling (spike_guard.hpp): decide before the update touches anything.
    json step_events = json::array();
    SpikePolicy action = SpikePolicy::Warn;
    bool spiked = false;
    std::string abort_reason;
    auto decide = [&](const SpikeVerdict& v) {
      spiked = true;
      const bool nonfinite = v.signal.rfind("nonfinite", 0) == 0;
      action = c.spikes.policy;
      if (action == SpikePolicy::Warn && nonfinite) {
        action = SpikePolicy::Abort;
        abort_reason = "a non-finite value cannot be trained through (spikes.policy = warn)";
      } else if (action == SpikePolicy::Skip && skips_used >= c.spikes.max_skips) {
        action = SpikePolicy::Abort;
        abort_reason = "spikes.max_skips (" + std::to_string(c.spikes.max_skips) + ") updates already skipped";
      } else if (action == SpikePolicy::Rollback && rollbacks_used >= c.spikes.max_rollbacks) {
        action = SpikePolicy::Abort;
        abort_reason = "spikes.max_rollbacks (" + std::to_string(c.spikes.max_rollbacks) + ") rollbacks already done";
      } else if (action == SpikePolicy::Abort) {
        abort_reason = "spikes.policy = abort";
      }
      json e = {{"step", step}, {"type", "spike"}, {"signal", v.signal}, {"action", to_string(action)}};
      e["value"] = std::isfinite(v.value) ? json(v.value) : json(nullptr);  // JSON has no NaN or Inf
      if (v.threshold > 0) e["threshold"] = v.threshold;
      events.write(e);
      step_events.push_back(e);
      char text[256];
      std::snprintf(text, sizeof text, "keel: spike at step %lld: %s = %.6g%s; %s", static_cast<long long>(step),
                    v.signal.c_str(), v.value,
                    v.threshold > 0 ? (" above " + std::to_string(v.threshold)).c_str() : "", to_string(action));
      say(text);
    };
    auto abort_run = [&](const std::string& signal) {
      events.write({{"step", step}, {"type", "abort"}, {"signal", signal}, {"reason", abort_reason}});
      throw Error(run_dir, "loss", "training diverged at step " + std::to_string(step) + " (" + signal + "): " +
                                       abort_reason + "; lower optimizer.lr, raise schedule.warmup_steps, or see "
                                       "[spikes] in docs/training.md");
    };
    auto rollback = [&](const std::string& signal) {
      const int64_t cursor = state.sequences;  // after the offending batches
      auto restored = load_newest_intact(state.step, step);
      if (!restored) {
        abort_reason = newest_damage ? "no intact checkpoint to roll back to (" + std::string(newest_damage->what()) + ")"
                                     : "no checkpoint to roll back to";
        abort_run(signal);
      }
      ++rollbacks_used;
      const int64_t from_sequences = restored->sequences;
      state = *restored;
      state.sequences = cursor;  // PaLM §5.1: skip the batches seen between the checkpoint and the spike
      guard.restore(state.guard);
      json e = {{"step", step}, {"type", "rollback"}, {"to_step", state.step},
                {"skipped_sequences", json::array({from_sequences, cursor})}};
      events.write(e);
      for (auto& se : step_events) pending_events.push_back(se);
      pending_events.push_back(e);
      reopen_metrics_at(state.step);
      model.update_router_bias(0.0f);  // drop the routing counts of the abandoned step
      say("keel: rolled back to step " + std::to_string(state.step) + ", skipping sequences " +
          std::to_string(from_sequences) + ".." + std::to_string(cursor));
    };

    if (SpikeVerdict v = guard.check(loss, grad_norm); v.spike) decide(v);
    if (spiked && action == SpikePolicy::Abort) abort_run(step_events.back()["signal"]);
    if (spiked && action == SpikePolicy::Rollback) {
      rollback(step_events.back()["signal"]);
      continue;
    }
    bool skipped = spiked && action == SpikePolicy::Skip;
    double update_ratio = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> layer_ratio(static_cast<size_t>(layers), std::numeric_limits<double>::quiet_NaN());
    int64_t clipped_heads = 0;
    if (!skipped) {
      if (c.clip > 0) optim::clip_grad_norm(store.grads(), c.clip);
      std::copy(store.values().begin(), store.values().end(), before.begin());
      optimizer_step(static_cast<float>(lr));
      // ‖ΔW‖/‖W‖ over the hidden matrices, overall and per layer, from this update alone.
      std::vector<double> du(static_cast<size_t>(layers) + 1, 0.0), w(static_cast<size_t>(layers) + 1, 0.0);
      bool finite = true;
      const auto& entries = store.entries();
      for (size_t pi = 0; pi < entries.size(); ++pi) {
        const nn::ParamInfo& p = entries[pi];
        const float* now = store.values().data() + p.offset;
        const float* old = before.data() + p.offset;
        double d2 = 0, w2 = 0, bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : d2, w2, bad)
        for (int64_t i = 0; i < p.numel; ++i) {
          const double d = static_cast<double>(now[i]) - old[i];
          d2 += d * d;
          w2 += static_cast<double>(old[i]) * old[i];
          bad += std::isfinite(now[i]) ? 0.0 : 1.0;
        }
        if (bad > 0) finite = false;
        if (!p.matrix) continue;
        const size_t slot = param_layer[pi] >= 0 && param_layer[pi] < layers ? static_cast<size_t>(param_layer[pi])
                                                                             : static_cast<size_t>(layers);
        du[slot] += d2;
        w[slot] += w2;
      }
      double du_all = 0, w_all = 0;
      for (int64_t l = 0; l <= layers; ++l) {
        du_all += du[static_cast<size_t>(l)];
        w_all += w[static_cast<size_t>(l)];
        if (l < layers && w[static_cast<size_t>(l)] > 0) {
          layer_ratio[static_cast<size_t>(l)] = std::sqrt(du[static_cast<size_t>(l)] / w[static_cast<size_t>(l)]);
        }
      }
      if (w_all > 0) update_ratio = std::sqrt(du_all / w_all);
      if (!finite) {
        decide({true, "nonfinite_param", std::numeric_limits<double>::quiet_NaN(), 0});
        if (action == SpikePolicy::Abort) abort_run("nonfinite_param");
        if (action == SpikePolicy::Rollback) {
          rollback("nonfinite_param");
          continue;
        }
        // Skip: put the weights back. The moments keep this step's (finite) gradient.
        std::copy(before.begin(), before.end(), store.values().begin());
        skipped = true;
        update_ratio = std::numeric_limits<double>::quiet_NaN();
        std::fill(layer_ratio.begin(), layer_ratio.end(), std::numeric_limits<double>::quiet_NaN());
      }
    }
    if (!skipped) {
      // Auxiliary-loss-free balancing (DeepSeek-V3 §2.1.2): after the update, from this step's routing.
      if (experts > 0) model.update_router_bias(static_cast<float>(c.router_bias_update_speed));
      // QK-Clip (Kimi K2 Algorithm 1): after the update, from this step's per-head max logits.
      if (c.qk_clip_tau > 0) {
        clipped_heads = optim::qk_clip(store, spec, step_max, {static_cast<float>(c.qk_clip_tau)}).clipped_heads;
      }
      guard.accept(loss, grad_norm);
    } else {
      ++skips_used;
      model.update_router_bias(0.0f);  // the skipped step's routing steers nothing
      events.write({{"step", step}, {"type", "skip"}});
    }
    state.step = step;
    state.tokens += predicted;
    last_loss = ce / static_cast<double>(predicted);

    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = static_cast<double>(predicted) / seconds;
    float max_logit = -std::numeric_limits<float>::infinity();
    json per_head = json::array();
    for (int64_t l = 0; l < layers; ++l) {
      json row = json::array();
      for (int64_t h = 0; h < heads; ++h) {
        const float v = step_max[static_cast<size_t>(l * heads + h)];
        max_logit = std::max(max_logit, v);
        row.push_back(v);
      }
      per_head.push_back(row);
    }
    auto number_or_null = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
    json act = json::array(), ratios = json::array();
    for (int64_t l = 0; l < layers; ++l) {
      act.push_back(number_or_null(std::sqrt(step_act[static_cast<size_t>(l)])));
      ratios.push_back(number_or_null(layer_ratio[static_cast<size_t>(l)]));
    }
    json line = {{"step", step},       {"tokens", state.tokens},      {"loss", number_or_null(loss)},
                 {"ce", number_or_null(last_loss)}, {"lr", lr},        {"grad_norm", number_or_null(grad_norm)},
                 {"tokens_per_s", tps}, {"batch_sequences", accum * c.sequences},
                 {"max_logit", max_logit}, {"max_logit_per_head", per_head},
                 {"update_rms_ratio", number_or_null(update_ratio)}, {"update_rms_ratio_per_layer", ratios},
                 {"activation_rms", act}};
    if (skipped) line["skipped"] = true;
    for (auto& e : step_events) pending_events.push_back(e);
    if (!pending_events.empty()) {
      line["events"] = pending_events;
      pending_events = json::array();
    }
    if (c.qk_clip_tau > 0) line["qk_clip_heads"] = clipped_heads;
    if (experts > 0) {
      // Per layer; dense layers (first_k_dense_replace, mlp_only_layers) are null.
      json load = json::array(), entropy = json::array();
      for (int64_t l = 0; l < layers; ++l) {
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
      line["val_loss"] = number_or_null(last_val);
    }
    metrics << line.dump() << "\n";
    metrics.flush();
    if (tb) {
      tb->scalar("train/loss", loss, step);
      tb->scalar("train/lr", lr, step);
      tb->scalar("train/grad_norm", grad_norm, step);
      tb->scalar("train/max_logit", max_logit, step);
      if (std::isfinite(update_ratio)) tb->scalar("train/update_rms_ratio", update_ratio, step);
      if (eval_now) tb->scalar("val/loss", last_val, step);
      tb->flush();
    }

    if (options.progress && (tty || step % c.log_every == 0 || step == c.steps || eval_now)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      const double eta = elapsed / static_cast<double>(std::max<int64_t>(step - first_step, 1)) * static_cast<double>(c.steps - step);
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
