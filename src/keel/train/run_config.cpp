#include "keel/train/run_config.hpp"

#include <set>
#include <sstream>
#include <stdexcept>

#include <toml++/toml.h>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/nn/packed_activations.hpp"
#include "keel/train/toml_section.hpp"

namespace keel::train {

namespace {

void apply_override(toml::table& root, const std::string& item, const std::string& source) {
  auto eq = item.find('=');
  auto dot = item.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    throw Error(source, item, "an override must look like section.key=value");
  }
  const std::string section = item.substr(0, dot), key = item.substr(dot + 1, eq - dot - 1),
                    text = item.substr(eq + 1);
  if (section.empty() || key.empty()) throw Error(source, item, "an override must look like section.key=value");
  toml::node* sec = root.get(section);
  if (!sec) {
    root.insert(section, toml::table{});
    sec = root.get(section);
  }
  if (!sec->is_table()) throw Error(source, section, "is not a section");
  // Parse the value as TOML ("x = <text>"); anything that does not parse is a bare string.
  try {
    toml::table parsed = toml::parse("x = " + text);
    sec->as_table()->insert_or_assign(key, *parsed.get("x"));
  } catch (const toml::parse_error&) {
    sec->as_table()->insert_or_assign(key, text);
  }
}

// Every top-level key must be a known [section]: a misspelt section would otherwise be ignored.
void check_sections(const toml::table& root, const std::string& source) {
  static const std::set<std::string> sections = {"run", "model", "data", "batch", "optimizer", "schedule", "eval", "checkpoint", "spikes", "faults", "dist"};
  for (const auto& [key, value] : root) {
    if (!sections.contains(std::string(key.str()))) {
      throw Error(source, std::string(key.str()),
                  "unknown section; supported: run, model, data, batch, optimizer, schedule, eval, checkpoint, spikes, faults, dist");
    }
    if (!value.is_table()) throw Error(source, std::string(key.str()), "expected a [section]");
  }
}

// Each read_*_section reads its keys in a fixed order (finish() lists known keys in that order)
// and ends with finish(), so an unknown key is named before the next section is read.

// [run]: length, output folder, seed, logging, precision and activation recomputation.
void read_run_section(TomlSection run, RunConfig& c) {
  c.steps = run.integer_or("steps", c.steps);
  c.out = run.string_or("out", c.out);
  c.seed = static_cast<uint64_t>(run.integer_or("seed", 1, 0));
  c.log_every = run.integer_or("log_every", c.log_every);
  const std::string precision = run.string_or("precision", "fp32");
  const auto parsed_precision = kernels::parse_precision(precision);
  if (!parsed_precision) run.fail("precision", "unknown precision '" + precision + "'; supported: fp32, bf16");
  c.precision = *parsed_precision;
  const std::string recompute = run.string_or("recompute", "none");
  const auto parsed_recompute = nn::parse_recompute(recompute);
  if (!parsed_recompute) {
    run.fail("recompute", "unknown recompute '" + recompute + "'; supported: none, attention, blocks");
  }
  c.recompute = *parsed_recompute;
  c.bf16_activations = run.string_or("bf16_activations", c.bf16_activations);
  if (!nn::parse_bf16_activations(c.bf16_activations)) {
    run.fail("bf16_activations", "unknown bf16_activations '" + c.bf16_activations + "'; supported: packed, fp32, all");
  }
  c.lean_blocks = run.integer_or("lean_blocks", c.lean_blocks, 0);
  run.finish();
}

// [model]: the HF config.json to train and its overrides; or a published HF model folder to start
// from (init_from), whose config.json is the default config.
void read_model_section(TomlSection model, RunConfig& c) {
  c.model_config = model.string_or("config", "");
  c.init_from = model.string_or("init_from", "");
  if (c.model_config.empty() && c.init_from.empty()) {
    model.fail("config", "is required: the HF config.json of the model to train (or model.init_from, an HF model folder)");
  }
  c.model_set = model.strings("set");
  model.finish();
}

// [data]: the prepared dataset (required) and its tokenizer.
void read_data_section(TomlSection data, RunConfig& c) {
  c.dataset = data.string_or("dataset", "");
  if (c.dataset.empty()) data.fail("dataset", "is required: a folder written by `keel data prepare`");
  c.tokenizer = data.string_or("tokenizer", "");
  data.finish();
}

// [batch]: micro-batch shape, accumulation and the optional batch-size ramp.
void read_batch_section(TomlSection batch, RunConfig& c) {
  c.sequences = batch.integer_or("sequences", c.sequences);
  c.seq_len = batch.integer_or("seq_len", c.seq_len);
  c.grad_accum = batch.integer_or("grad_accum", c.grad_accum);
  c.ramp.micro_sequences = c.sequences;
  c.ramp.start_sequences = batch.integer_or("ramp_start_sequences", 0, 0);
  c.ramp.end_sequences = batch.integer_or("ramp_end_sequences", 0, 0);
  c.ramp.ramp_tokens = batch.integer_or("ramp_tokens", 0, 0);
  if ((c.ramp.start_sequences > 0) != (c.ramp.end_sequences > 0)) {
    batch.fail("ramp_end_sequences", "a ramp needs both ramp_start_sequences and ramp_end_sequences");
  }
  if (c.ramp.start_sequences > 0 && c.ramp.start_sequences < c.sequences) {
    batch.fail("ramp_start_sequences", "must be at least one micro-batch (batch.sequences)");
  }
  batch.finish();
}

// [optimizer]: AdamW or Muon, their hyperparameters and which parameters each one updates.
void read_optimizer_section(TomlSection opt, RunConfig& c) {
  c.optimizer = opt.string_or("name", c.optimizer);
  if (c.optimizer != "adamw" && c.optimizer != "muon") {
    opt.fail("name", "unknown optimizer '" + c.optimizer + "'; supported: adamw, muon");
  }
  c.momentum = opt.non_negative("momentum", c.momentum);
  if (c.momentum >= 1) opt.fail("momentum", "must be below 1");
  c.muon_scaling = opt.string_or("muon_scaling", c.muon_scaling);
  if (c.muon_scaling != "moonlight" && c.muon_scaling != "keller_jordan" && c.muon_scaling != "update_norm") {
    opt.fail("muon_scaling", "unknown scaling '" + c.muon_scaling + "'; supported: moonlight, keller_jordan, update_norm");
  }
  c.qk_clip_tau = opt.non_negative("qk_clip_tau", c.qk_clip_tau);
  c.router_bias_update_speed = opt.non_negative("router_bias_update_speed", c.router_bias_update_speed);
  c.adamw_patterns = opt.strings("adamw_patterns");
  c.muon_patterns = opt.strings("muon_patterns");
  c.lr = opt.non_negative("lr", c.lr);
  c.beta1 = opt.non_negative("beta1", c.beta1);
  c.beta2 = opt.non_negative("beta2", c.beta2);
  if (c.beta1 >= 1) opt.fail("beta1", "must be below 1");
  if (c.beta2 >= 1) opt.fail("beta2", "must be below 1");
  c.eps = opt.non_negative("eps", c.eps);
  c.weight_decay = opt.non_negative("weight_decay", c.weight_decay);
  c.clip = opt.non_negative("clip", c.clip);
  opt.finish();
}

// schedule.tails: the constant-LR stretches after the cosine, each {until_tokens, lr}.
std::vector<LrTail> read_schedule_tails(TomlSection& sched) {
  std::vector<LrTail> tails;
  if (const toml::array* items = sched.array("tails")) {
    for (const auto& item : *items) {
      const toml::table* t = item.as_table();
      if (!t || !t->get("until_tokens") || !t->get("lr") || !t->get("until_tokens")->is_integer() ||
          !t->get("lr")->is_number()) {
        sched.fail("tails", "each tail is {until_tokens = <int>, lr = <number>}");
      }
      tails.push_back({*t->get("until_tokens")->value<int64_t>(), *t->get("lr")->value<double>()});
    }
  }
  return tails;
}

// [schedule]: the LR curve. Read after [run] and [optimizer]: it peaks at optimizer.lr and spans
// run.steps.
void read_schedule_section(TomlSection sched, RunConfig& c) {
  ScheduleConfig& s = c.schedule;
  try {
    s.kind = parse_schedule_kind(sched.string_or("kind", "constant"));
  } catch (const std::invalid_argument& e) {
    sched.fail("kind", e.what());
  }
  s.peak_lr = c.lr;
  s.total_steps = c.steps;
  s.final_lr = sched.non_negative("final_lr", 0.1 * c.lr);
  s.warmup_steps = sched.integer_or("warmup_steps", 0, 0);
  s.hold_tokens = sched.integer_or("hold_tokens", 0, 0);
  s.decay_tokens = sched.integer_or("decay_tokens", 0, 0);
  s.decay_steps = sched.integer_or("decay_steps", 0, 0);
  try {
    s.decay_shape = parse_decay_shape(sched.string_or("decay_shape", "linear"));
  } catch (const std::invalid_argument& e) {
    sched.fail("decay_shape", e.what());
  }
  s.tails = read_schedule_tails(sched);
  if (s.kind == ScheduleKind::WarmupHoldCosine && s.decay_tokens <= 0) {
    sched.fail("decay_tokens", "warmup_hold_cosine needs decay_tokens > 0");
  }
  if (s.kind == ScheduleKind::Wsd && s.decay_steps > c.steps) sched.fail("decay_steps", "exceeds run.steps");
  sched.finish();
}

// [eval]: how often and over how many batches the validation loss is measured.
void read_eval_section(TomlSection eval, RunConfig& c) {
  c.eval_every = eval.integer_or("every", 0, 0);
  c.eval_batches = eval.integer_or("batches", c.eval_batches);
  eval.finish();
}

// [checkpoint]: how often checkpoints are written and how many are kept.
void read_checkpoint_section(TomlSection ckpt, RunConfig& c) {
  c.checkpoint_every = ckpt.integer_or("every", 0, 0);
  c.checkpoint_keep = ckpt.integer_or("keep", c.checkpoint_keep);
  ckpt.finish();
}

// [dist]: data parallelism (docs/distributed.md); the world size comes from mpirun.
void read_dist_section(TomlSection dist, RunConfig& c) {
  c.dist_overlap = dist.boolean("overlap").value_or(c.dist_overlap);
  dist.finish();
}

// [spikes]: the loss-spike guard's policy, window and limits.
void read_spikes_section(TomlSection spikes, RunConfig& c) {
  try {
    c.spikes.policy = parse_spike_policy(spikes.string_or("policy", "warn"));
  } catch (const std::invalid_argument& e) {
    spikes.fail("policy", e.what());
  }
  c.spikes.window = spikes.integer_or("window", c.spikes.window, 3);
  c.spikes.threshold = spikes.non_negative("threshold", c.spikes.threshold);
  if (c.spikes.threshold <= 0) spikes.fail("threshold", "must be positive");
  c.spikes.min_history = spikes.integer_or("min_history", c.spikes.min_history, 3);
  if (c.spikes.min_history > c.spikes.window) spikes.fail("min_history", "exceeds spikes.window (the window never fills)");
  c.spikes.max_skips = spikes.integer_or("max_skips", c.spikes.max_skips, 0);
  c.spikes.max_rollbacks = spikes.integer_or("max_rollbacks", c.spikes.max_rollbacks, 0);
  try {
    c.spikes.grad_norm = parse_grad_norm_signal(spikes.string_or("grad_norm", "with_loss"));
  } catch (const std::invalid_argument& e) {
    spikes.fail("grad_norm", e.what());
  }
  spikes.finish();
}

// One faults.<key> array: step numbers (>= 1) at which a fault is injected; absent: none.
std::vector<int64_t> read_step_list(TomlSection& faults, const char* key) {
  std::vector<int64_t> out;
  if (const toml::array* arr = faults.array(key)) {
    for (const auto& item : *arr) {
      if (!item.is_integer() || *item.value<int64_t>() < 1) faults.fail(key, "expected an array of step numbers (>= 1)");
      out.push_back(*item.value<int64_t>());
    }
  }
  return out;
}

// [faults]: injected failures, for testing the trainer's recovery paths.
void read_faults_section(TomlSection faults, RunConfig& c) {
  c.poison_steps = read_step_list(faults, "poison_steps");
  c.nan_grad_steps = read_step_list(faults, "nan_grad_steps");
  c.corrupt_checkpoint_steps = read_step_list(faults, "corrupt_checkpoint_steps");
  faults.finish();
}

// The typed RunConfig of a parsed (and overridden) TOML file. Sections are read in this order:
// later ones default from earlier ones, and the first error met is the one reported.
RunConfig type_config(const toml::table& root, const std::string& source) {
  check_sections(root, source);
  auto section = [&](const char* name) { return TomlSection(root.get_as<toml::table>(name), name, source); };
  RunConfig c;
  c.source = source;
  read_run_section(section("run"), c);
  read_model_section(section("model"), c);
  read_data_section(section("data"), c);
  read_batch_section(section("batch"), c);
  read_optimizer_section(section("optimizer"), c);
  read_schedule_section(section("schedule"), c);
  read_eval_section(section("eval"), c);
  read_checkpoint_section(section("checkpoint"), c);
  read_dist_section(section("dist"), c);
  read_spikes_section(section("spikes"), c);
  read_faults_section(section("faults"), c);
  return c;
}

}  // namespace

RunConfig parse_run_config(const std::string& text, const std::string& source, const std::vector<std::string>& overrides) {
  toml::table root = parse_toml(text, source);
  for (const auto& item : overrides) apply_override(root, item, source);
  return type_config(root, source);
}

SpikeConfig parse_spike_config(const std::string& text, const std::string& source,
                               const std::vector<std::string>& overrides) {
  toml::table root = parse_toml(text, source);
  for (const auto& item : overrides) apply_override(root, item, source);
  RunConfig c;
  read_spikes_section(TomlSection(root.get_as<toml::table>("spikes"), "spikes", source), c);
  return c.spikes;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_run_config(read_file(path, "the run config"), path, overrides);
}

std::string to_toml(const RunConfig& c) {
  toml::table root;
  root.insert("run", toml::table{{"steps", c.steps}, {"out", c.out}, {"seed", static_cast<int64_t>(c.seed)},
                                  {"log_every", c.log_every},
                                  {"precision", std::string(kernels::precision_name(c.precision))},
                                  {"recompute", std::string(nn::recompute_name(c.recompute))},
                                  {"bf16_activations", c.bf16_activations}, {"lean_blocks", c.lean_blocks}});
  toml::array sets;
  for (const auto& s : c.model_set) sets.push_back(s);
  toml::table model{{"config", c.model_config}, {"set", sets}};
  if (!c.init_from.empty()) model.insert("init_from", c.init_from);
  root.insert("model", std::move(model));
  root.insert("data", toml::table{{"dataset", c.dataset}, {"tokenizer", c.tokenizer}});
  root.insert("batch", toml::table{{"sequences", c.sequences}, {"seq_len", c.seq_len}, {"grad_accum", c.grad_accum},
                                    {"ramp_start_sequences", c.ramp.start_sequences},
                                    {"ramp_end_sequences", c.ramp.end_sequences}, {"ramp_tokens", c.ramp.ramp_tokens}});
  toml::array adamw_patterns, muon_patterns;
  for (const auto& s : c.adamw_patterns) adamw_patterns.push_back(s);
  for (const auto& s : c.muon_patterns) muon_patterns.push_back(s);
  root.insert("optimizer", toml::table{{"name", c.optimizer}, {"lr", c.lr}, {"beta1", c.beta1}, {"beta2", c.beta2},
                                        {"eps", c.eps}, {"weight_decay", c.weight_decay}, {"clip", c.clip},
                                        {"momentum", c.momentum}, {"muon_scaling", c.muon_scaling}, {"qk_clip_tau", c.qk_clip_tau},
                                        {"router_bias_update_speed", c.router_bias_update_speed},
                                        {"adamw_patterns", adamw_patterns}, {"muon_patterns", muon_patterns}});
  const char* kinds[] = {"constant", "warmup", "cosine", "warmup_hold_cosine", "wsd"};
  const char* shapes[] = {"linear", "cosine", "1-sqrt"};
  toml::array tails;
  for (const auto& t : c.schedule.tails) tails.push_back(toml::table{{"until_tokens", t.until_tokens}, {"lr", t.lr}});
  root.insert("schedule", toml::table{{"kind", kinds[static_cast<int>(c.schedule.kind)]},
                                       {"final_lr", c.schedule.final_lr},
                                       {"warmup_steps", c.schedule.warmup_steps},
                                       {"hold_tokens", c.schedule.hold_tokens},
                                       {"decay_tokens", c.schedule.decay_tokens},
                                       {"decay_steps", c.schedule.decay_steps},
                                       {"decay_shape", shapes[static_cast<int>(c.schedule.decay_shape)]},
                                       {"tails", tails}});
  root.insert("eval", toml::table{{"every", c.eval_every}, {"batches", c.eval_batches}});
  root.insert("checkpoint", toml::table{{"every", c.checkpoint_every}, {"keep", c.checkpoint_keep}});
  root.insert("dist", toml::table{{"overlap", c.dist_overlap}});
  root.insert("spikes", toml::table{{"policy", to_string(c.spikes.policy)}, {"window", c.spikes.window},
                                     {"threshold", c.spikes.threshold}, {"min_history", c.spikes.min_history},
                                     {"max_skips", c.spikes.max_skips}, {"max_rollbacks", c.spikes.max_rollbacks},
                                     {"grad_norm", to_string(c.spikes.grad_norm)}});
  auto step_array = [](const std::vector<int64_t>& steps) {
    toml::array a;
    for (int64_t s : steps) a.push_back(s);
    return a;
  };
  if (!c.poison_steps.empty() || !c.nan_grad_steps.empty() || !c.corrupt_checkpoint_steps.empty()) {
    root.insert("faults", toml::table{{"poison_steps", step_array(c.poison_steps)},
                                       {"nan_grad_steps", step_array(c.nan_grad_steps)},
                                       {"corrupt_checkpoint_steps", step_array(c.corrupt_checkpoint_steps)}});
  }
  std::ostringstream out;
  out << root << "\n";
  return out.str();
}

}  // namespace keel::train
