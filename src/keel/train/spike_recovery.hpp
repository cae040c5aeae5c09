#pragma once
// What a run does about a spike (spike_guard.hpp finds them): the policy decision within the
// run's budgets, the event and message it leaves, and the rollback procedure (PaLM §5.1: reload
// the newest intact checkpoint at or before the spike and skip the data window between them).
// Policies, as docs/training.md ("Spikes") describes them:
//   warn      record the event, apply the update; a non-finite step aborts (it cannot be applied)
//   skip      drop the step's update (at most spikes.max_skips times over the run)
//   rollback  go back to a checkpoint (at most spikes.max_rollbacks times)
//   abort     stop with an error; the checkpoints written so far stay intact
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "keel/train/checkpoint.hpp"
#include "keel/train/event_log.hpp"
#include "keel/train/spike_guard.hpp"
#include "keel/train/step.hpp"

namespace keel::train {

// Prints one line of news (a terminal's live progress line is cleared first).
using Say = std::function<void(const std::string&)>;

struct SpikeDecision {
  SpikePolicy action = SpikePolicy::Warn;
  std::string abort_reason;  // why the run stops; empty unless action is Abort
};

// The configured policy, turned into Abort when it cannot apply: a non-finite value under warn,
// or a skip/rollback budget already spent.
SpikeDecision decide_spike(const SpikeConfig& config, const SpikeVerdict& verdict, int64_t skips_used,
                           int64_t rollbacks_used);
// The events.jsonl object of a spike: step, type "spike", signal, action, value (null when not
// finite), threshold (when there is one).
nlohmann::json spike_event(int64_t step, const SpikeVerdict& verdict, SpikePolicy action);
// "keel: spike at step 22: loss = 9.1 above 4.2; rollback"
std::string spike_message(int64_t step, const SpikeVerdict& verdict, SpikePolicy action);

struct IntactCheckpoint {
  std::optional<std::string> loaded;            // the folder loaded, if any
  std::optional<CheckpointCorrupt> newest_damage;  // the newest damaged one met, for the error
};
// Loads the newest intact checkpoint of run_dir at or before max_step into `checkpoint`'s parts.
// A damaged one is recorded (events.jsonl "checkpoint_corrupt" at at_step, and a message), moved
// aside as checkpoints/corrupt_step_N (kept for inspection, never loaded again), and the next
// older one is tried. Throws what is not damage.
IntactCheckpoint load_newest_intact(const std::string& run_dir, Checkpoint& checkpoint, int64_t max_step,
                                    int64_t at_step, EventLog& events, const Say& say);

// The spike decision stage of a step, with its budgets; saved in checkpoints as "spike_guard"
// (the detector's window plus the skips and rollbacks used).
class SpikeRecovery : public Stateful {
 public:
  SpikeRecovery(const SpikeConfig& config, std::string run_dir, EventLog& events, Say say);

  // Before the update, from the step's loss and pre-clip gradient norm. A rollback loads into
  // `checkpoint`'s parts (state included) and returns RolledBack; an abort throws.
  StepFate before_update(StepContext& step, TrainState& state, Checkpoint& checkpoint);
  // After an update that made a parameter non-finite: Skip (the caller puts the weights back),
  // RolledBack, or an abort.
  StepFate after_nonfinite_update(StepContext& step, TrainState& state, Checkpoint& checkpoint);
  // At the end of a step that was not rolled back: an applied step joins the window, a skipped
  // one spends the skip budget.
  void finish(const StepContext& step);

  // The pieces of the stage.
  // Decides, writes the spike event (also appended to step_events) and says the message.
  SpikeDecision record_spike(int64_t step, const SpikeVerdict& verdict, nlohmann::json& step_events);
  // Writes the abort event and throws the divergence error (keel::Error on the run folder).
  [[noreturn]] void abort_run(int64_t step, const std::string& signal, const std::string& reason);
  struct Rollback {
    int64_t to_step = 0;
    int64_t from_sequences = 0, to_sequences = 0;  // the data window skipped
  };
  // The rollback at `step`: the newest intact checkpoint at or before state.step, the data cursor
  // kept where the spike left it, the rollback event written (and appended to step_events).
  Rollback rollback(int64_t step, const std::string& signal, TrainState& state, Checkpoint& checkpoint,
                    nlohmann::json& step_events);

  const SpikeGuard& guard() const { return guard_; }
  int64_t skips_used() const { return skips_; }
  int64_t rollbacks_used() const { return rollbacks_; }

  void save(CheckpointWriter& out) const override;
  void load(CheckpointReader& in) override;

 private:
  StepFate respond(const SpikeVerdict& verdict, StepContext& step, TrainState& state, Checkpoint& checkpoint);

  SpikeConfig config_;
  SpikeGuard guard_;
  std::string run_dir_;
  EventLog& events_;
  Say say_;
  int64_t skips_ = 0, rollbacks_ = 0;
  nlohmann::json pending_ = nlohmann::json::array();  // a rolled-back step's events, for the next line
};

}  // namespace keel::train
