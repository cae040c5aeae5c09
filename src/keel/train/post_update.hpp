#pragma once
// Post-update hooks: what runs after the optimizer's step, from what this step observed.
//   RouterBiasHook  auxiliary-loss-free balancing (DeepSeek-V3 §2.1.2): the MoE correction biases
//                   move by γ·sign(mean load − load), from this step's routing
//   QkClipHook      QK-Clip (Kimi K2 Algorithm 1): rescales W_q/W_k of the heads whose max logit
//                   this step went above tau
#include <cstdint>

#include "keel/arch/model_spec.hpp"
#include "keel/dist/communicator.hpp"
#include "keel/nn/model.hpp"
#include "keel/train/step.hpp"

namespace keel::train {

class PostUpdateHook {
 public:
  virtual ~PostUpdateHook() = default;
  // The step's update was applied.
  virtual void after_update(StepContext& step) = 0;
  // The step's update was dropped (spikes.policy = skip).
  virtual void after_skip(StepContext& step) { (void)step; }
  // The step was abandoned by a rollback.
  virtual void after_rollback() {}
};

class RouterBiasHook : public PostUpdateHook {
 public:
  // comm: data parallel, the expert loads are summed over the ranks before the biases move.
  RouterBiasHook(nn::TransformerModel& model, float speed, dist::Communicator* comm = nullptr)
      : model_(model), speed_(speed), comm_(comm) {}
  void after_update(StepContext& step) override;
  // A dropped or abandoned step's routing steers nothing: its counts are discarded.
  void after_skip(StepContext& step) override;
  void after_rollback() override;

 private:
  nn::TransformerModel& model_;
  float speed_;
  dist::Communicator* comm_;
};

// Reports the heads it clipped as the metrics line's qk_clip_heads.
class QkClipHook : public PostUpdateHook {
 public:
  QkClipHook(nn::ParameterStore& store, const arch::ModelSpec& spec, float tau) : store_(store), spec_(spec), tau_(tau) {}
  void after_update(StepContext& step) override;
  void after_skip(StepContext& step) override;

 private:
  nn::ParameterStore& store_;
  const arch::ModelSpec& spec_;
  float tau_;
};

}  // namespace keel::train
