#include "keel/train/spike_recovery.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "keel/core/error.hpp"
#include "keel/train/run_dir.hpp"

namespace keel::train {

namespace fs = std::filesystem;
using nlohmann::json;

SpikeDecision decide_spike(const SpikeConfig& config, const SpikeVerdict& verdict, int64_t skips_used,
                           int64_t rollbacks_used) {
  const bool nonfinite = verdict.signal.rfind("nonfinite", 0) == 0;
  SpikeDecision d{config.policy, ""};
  if (d.action == SpikePolicy::Warn && nonfinite) {
    d = {SpikePolicy::Abort, "a non-finite value cannot be trained through (spikes.policy = warn)"};
  } else if (d.action == SpikePolicy::Skip && skips_used >= config.max_skips) {
    d = {SpikePolicy::Abort, "spikes.max_skips (" + std::to_string(config.max_skips) + ") updates already skipped"};
  } else if (d.action == SpikePolicy::Rollback && rollbacks_used >= config.max_rollbacks) {
    d = {SpikePolicy::Abort,
         "spikes.max_rollbacks (" + std::to_string(config.max_rollbacks) + ") rollbacks already done"};
  } else if (d.action == SpikePolicy::Abort) {
    d.abort_reason = "spikes.policy = abort";
  }
  return d;
}

json spike_event(int64_t step, const SpikeVerdict& verdict, SpikePolicy action) {
  json e = {{"step", step}, {"type", "spike"}, {"signal", verdict.signal}, {"action", to_string(action)}};
  e["value"] = std::isfinite(verdict.value) ? json(verdict.value) : json(nullptr);  // JSON has no NaN or Inf
  if (verdict.threshold > 0) e["threshold"] = verdict.threshold;
  return e;
}

std::string spike_message(int64_t step, const SpikeVerdict& verdict, SpikePolicy action) {
  char text[256];
  std::snprintf(text, sizeof text, "keel: spike at step %lld: %s = %.6g%s; %s", static_cast<long long>(step),
                verdict.signal.c_str(), verdict.value,
                verdict.threshold > 0 ? (" above " + std::to_string(verdict.threshold)).c_str() : "",
                to_string(action));
  return text;
}

IntactCheckpoint load_newest_intact(const std::string& run_dir, Checkpoint& checkpoint, int64_t max_step,
                                    int64_t at_step, EventLog& events, const Say& say) {
  IntactCheckpoint found;
  const auto all = complete_checkpoints(run_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (checkpoint_step(*it) > max_step) continue;
    try {
      checkpoint.load(*it);
      found.loaded = *it;
      return found;
    } catch (const CheckpointCorrupt& e) {
      if (!found.newest_damage) found.newest_damage = e;
      const fs::path aside = fs::path(*it).parent_path() / ("corrupt_" + fs::path(*it).filename().string());
      std::error_code ec;
      if (checkpoint.leads()) {  // every rank failed it together (Checkpoint::load); one moves it aside
        fs::remove_all(aside, ec);
        fs::rename(*it, aside, ec);
      }
      events.write({{"step", at_step}, {"type", "checkpoint_corrupt"}, {"checkpoint", *it}, {"reason", e.what()}});
      say("keel: checkpoint " + *it + " is damaged (" + e.reason() + "); trying an older one");
    }
  }
  return found;
}

SpikeRecovery::SpikeRecovery(const SpikeConfig& config, std::string run_dir, EventLog& events, Say say)
    : config_(config), guard_(config), run_dir_(std::move(run_dir)), events_(events), say_(std::move(say)) {}

StepFate SpikeRecovery::before_update(StepContext& step, TrainState& state, Checkpoint& checkpoint) {
  // A rolled-back step's events show on the first line written after it.
  step.events = std::move(pending_);
  pending_ = json::array();
  if (SpikeVerdict v = guard_.check(step.loss, step.grad_norm); v.spike) return respond(v, step, state, checkpoint);
  return StepFate::Apply;
}

StepFate SpikeRecovery::after_nonfinite_update(StepContext& step, TrainState& state, Checkpoint& checkpoint) {
  const SpikeVerdict v{true, "nonfinite_param", std::numeric_limits<double>::quiet_NaN(), 0};
  const StepFate fate = respond(v, step, state, checkpoint);
  return fate == StepFate::Apply ? StepFate::Skip : fate;  // warn aborts on non-finite values
}

StepFate SpikeRecovery::respond(const SpikeVerdict& verdict, StepContext& step, TrainState& state,
                                Checkpoint& checkpoint) {
  const SpikeDecision d = record_spike(step.step, verdict, step.events);
  switch (d.action) {
    case SpikePolicy::Abort:
      abort_run(step.step, verdict.signal, d.abort_reason);
    case SpikePolicy::Rollback:
      rollback(step.step, verdict.signal, state, checkpoint, step.events);
      pending_ = std::move(step.events);
      step.events = json::array();
      return StepFate::RolledBack;
    case SpikePolicy::Skip:
      return StepFate::Skip;
    case SpikePolicy::Warn:
      return StepFate::Apply;
  }
  return StepFate::Apply;
}

void SpikeRecovery::finish(const StepContext& step) {
  if (step.fate == StepFate::Apply) {
    guard_.accept(step.loss, step.grad_norm);
  } else if (step.fate == StepFate::Skip) {
    ++skips_;
    events_.write({{"step", step.step}, {"type", "skip"}});
  }
}

SpikeDecision SpikeRecovery::record_spike(int64_t step, const SpikeVerdict& verdict, json& step_events) {
  const SpikeDecision d = decide_spike(config_, verdict, skips_, rollbacks_);
  const json e = spike_event(step, verdict, d.action);
  events_.write(e);
  step_events.push_back(e);
  say_(spike_message(step, verdict, d.action));
  return d;
}

void SpikeRecovery::abort_run(int64_t step, const std::string& signal, const std::string& reason) {
  events_.write({{"step", step}, {"type", "abort"}, {"signal", signal}, {"reason", reason}});
  Error e(run_dir_, "loss", "training diverged at step " + std::to_string(step) + " (" + signal + "): " + reason +
                                "; lower optimizer.lr, raise schedule.warmup_steps, or see [spikes] in "
                                "docs/training.md");
  e.set_everywhere();  // decided from the global loss and gradient norm: every rank stops here
  throw e;
}

SpikeRecovery::Rollback SpikeRecovery::rollback(int64_t step, const std::string& signal, TrainState& state,
                                                Checkpoint& checkpoint, json& step_events) {
  const int64_t cursor = state.sequences;  // after the offending batches
  // The budgets are the run's: loading this object's older state must not give them back.
  const int64_t skips = skips_, rollbacks = rollbacks_;
  IntactCheckpoint found = load_newest_intact(run_dir_, checkpoint, state.step, step, events_, say_);
  skips_ = skips;
  rollbacks_ = rollbacks;
  if (!found.loaded) {
    abort_run(step, signal,
              found.newest_damage ? "no intact checkpoint to roll back to (" + std::string(found.newest_damage->what()) + ")"
                                  : "no checkpoint to roll back to");
  }
  ++rollbacks_;
  const Rollback r{state.step, state.sequences, cursor};
  state.sequences = cursor;  // PaLM §5.1: skip the batches seen between the checkpoint and the spike
  const json e = {{"step", step}, {"type", "rollback"}, {"to_step", r.to_step},
                  {"skipped_sequences", json::array({r.from_sequences, r.to_sequences})}};
  events_.write(e);
  step_events.push_back(e);
  say_("keel: rolled back to step " + std::to_string(r.to_step) + ", skipping sequences " +
       std::to_string(r.from_sequences) + ".." + std::to_string(r.to_sequences));
  return r;
}

void SpikeRecovery::save(CheckpointWriter& out) const {
  json g = guard_.state();
  g["skips"] = skips_;
  g["rollbacks"] = rollbacks_;
  out.state()["spike_guard"] = g;
}

void SpikeRecovery::load(CheckpointReader& in) {
  const json g = in.state().value("spike_guard", json());
  guard_.restore(g);
  // A checkpoint without counters (older runs) leaves the budgets as they are.
  if (g.is_object()) {
    skips_ = g.value("skips", int64_t{0});
    rollbacks_ = g.value("rollbacks", int64_t{0});
  }
}

}  // namespace keel::train
