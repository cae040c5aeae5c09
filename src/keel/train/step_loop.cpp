#include "keel/train/step_loop.hpp"

#include "keel/core/error.hpp"
#include "keel/core/thread_governor.hpp"
#include "keel/optim/grad_clip.hpp"

namespace keel::train {

namespace {

StepContext begin_step(const TrainerParts& p, const TrainState& state) {
  StepContext step;
  step.start = std::chrono::steady_clock::now();
  step.step = state.step + 1;
  step.layer_ratio.assign(static_cast<size_t>(p.model->spec().num_layers), StepContext::kNaN);
  p.batches->plan(state, step);
  return step;
}

// Spike decision (before anything is touched), clipping, update, and the check that the update
// left the parameters finite.
StepFate decide_and_update(TrainerParts& p, TrainState& state, StepContext& step) {
  if (p.spikes) {
    step.fate = p.spikes->before_update(step, state, *p.checkpoint);
    if (step.fate != StepFate::Apply) return step.fate;
  }
  clip_gradients(step, p.clip);
  if (!p.update->apply(step) && p.spikes) {
    step.fate = p.spikes->after_nonfinite_update(step, state, *p.checkpoint);
    if (step.fate == StepFate::Skip) p.update->undo(step);
  }
  return step.fate;
}

void finish_step(TrainerParts& p, TrainState& state, StepContext& step) {
  for (PostUpdateHook* h : p.hooks) {
    if (step.skipped()) h->after_skip(step);
    else h->after_update(step);
  }
  if (p.spikes) p.spikes->finish(step);
  state.step = step.step;
  state.tokens += step.predicted;
  step.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step.start).count();
  if (p.evaluation) p.evaluation->maybe_run(step);
  for (MetricsSink* m : p.metrics) m->write(step, state);
  if (p.checkpointing) p.checkpointing->after_step(state);
}

}  // namespace

double run_steps(TrainerParts& p, TrainState& state, int64_t last_step) {
  KEEL_CHECK(p.model && p.batches && p.reducer && p.update && p.lr_at && (!p.spikes || p.checkpoint));
  nn::ParameterStore& store = p.model->parameters();
  double last_ce = StepContext::kNaN;
  for (MetricsSink* m : p.metrics) m->begin(state);
  while (state.step < last_step) {
    thread_governor().step_boundary();  // the team for this step, from the load on the machine
    StepContext step = begin_step(p, state);
    p.reducer->begin_step();
    // A step whose gradients a fault will poison after backward reduces them all afterwards.
    const bool early = p.reducer->overlaps() && !(p.faults && p.faults->touches_gradients(step.step));
    forward_backward(*p.model, *p.batches, state, step,
                     early ? [&](int64_t layer) { p.reducer->layer_ready(store, layer); } : LayerDone{});
    if (p.faults) p.faults->after_backward(step.step, store);
    p.reducer->reduce(store, step);
    step.loss = step_loss(*p.model, step);
    step.grad_norm = p.reducer->grad_norm(store);  // before clipping
    step.lr = p.lr_at(step.step, state.tokens);
    if (decide_and_update(p, state, step) == StepFate::RolledBack) {
      for (PostUpdateHook* h : p.hooks) h->after_rollback();
      for (MetricsSink* m : p.metrics) m->rewind(state.step);
      continue;
    }
    finish_step(p, state, step);
    last_ce = step.ce();
  }
  for (MetricsSink* m : p.metrics) m->finish();
  return last_ce;
}

}  // namespace keel::train
