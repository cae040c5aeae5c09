#pragma once
// AdamW with decoupled weight decay (Loshchilov & Hutter, ICLR 2019), step for step what
// torch.optim.AdamW computes: p ← p·(1 − lr·wd), then the bias-corrected Adam update.
// Decay applies to the parameters the store marks (matrices), not to norms, biases, embeddings.
#include <cstddef>
#include <cstdint>
#include <span>

#include "keel/core/arena.hpp"
#include "keel/nn/parameters.hpp"
#include "keel/optim/optimizer.hpp"

namespace keel::optim {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

class AdamW : public Optimizer {
 public:
  // Owns every parameter of the store.
  AdamW(const nn::ParameterStore& store, AdamWConfig config);
  // Owns, updates and keeps moments for only these slices (ZeRO-1).
  AdamW(AdamWConfig config, Ownership ownership);
  std::string name() const override { return "adamw"; }
  // One update of every parameter from the store's gradients (times grad_scale) at learning rate lr.
  void step(nn::ParameterStore& store, float lr, float grad_scale = 1.0f) override;
  // One update of only the owned slices listed (indices into ownership().slices()), as when Muon
  // hands AdamW the embeddings, LM head, norms and biases. Counts as one step.
  void step(nn::ParameterStore& store, float lr, float grad_scale, std::span<const size_t> slices);
  int64_t steps_taken() const override { return step_; }
  const AdamWConfig& config() const { return config_; }
  FloatBuffer& first_moment() { return m_; }
  FloatBuffer& second_moment() { return v_; }
  void set_steps_taken(int64_t s) override { step_ = s; }
  // exp_avg (m) and exp_avg_sq (v), store-shaped.
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  std::span<float> state(const std::string& state_name, const nn::ParamInfo& p) override;
  const Ownership& ownership() const override { return ownership_; }
  std::span<float> state(const std::string& state_name, const OwnedSlice& slice) override;

 private:
  void update(nn::ParameterStore& store, const OwnedSlice& s, float lr, float grad_scale, float step_size,
              float inv_sqrt_bias2);
  FloatBuffer& buffer(const std::string& state_name);

  AdamWConfig config_;
  Ownership ownership_;
  FloatBuffer m_, v_;
  int64_t step_ = 0;
};

}  // namespace keel::optim
