#include "keel/core/stage_timer.hpp"
#include "keel/optim/adamw.hpp"

#include <cmath>

#include "keel/core/error.hpp"

namespace keel::optim {

AdamW::AdamW(const nn::ParameterStore& store, AdamWConfig config) : AdamW(config, Ownership::everything(store)) {}

AdamW::AdamW(AdamWConfig config, Ownership ownership)
    : config_(config),
      ownership_(std::move(ownership)),
      m_(static_cast<size_t>(ownership_.state_floats())),
      v_(static_cast<size_t>(ownership_.state_floats())) {}

void AdamW::step(nn::ParameterStore& store, float lr, float grad_scale) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Optimizer);
  ++step_;
  const double bias1 = 1.0 - std::pow(static_cast<double>(config_.beta1), static_cast<double>(step_));
  const double bias2 = 1.0 - std::pow(static_cast<double>(config_.beta2), static_cast<double>(step_));
  const float step_size = static_cast<float>(lr / bias1);
  const float inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  for (const OwnedSlice& sl : ownership_.slices()) update(store, sl, lr, grad_scale, step_size, inv_sqrt_bias2);
}

void AdamW::step(nn::ParameterStore& store, float lr, float grad_scale, std::span<const size_t> slices) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Optimizer);
  ++step_;
  const double bias1 = 1.0 - std::pow(static_cast<double>(config_.beta1), static_cast<double>(step_));
  const double bias2 = 1.0 - std::pow(static_cast<double>(config_.beta2), static_cast<double>(step_));
  const float step_size = static_cast<float>(lr / bias1);
  const float inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  for (size_t i : slices) update(store, ownership_.slices().at(i), lr, grad_scale, step_size, inv_sqrt_bias2);
}

FloatBuffer& AdamW::buffer(const std::string& state_name) {
  if (state_name == "exp_avg") return m_;
  if (state_name == "exp_avg_sq") return v_;
  throw Error("adamw", "state", "no state named '" + state_name + "'; AdamW holds exp_avg, exp_avg_sq");
}

std::span<float> AdamW::state(const std::string& state_name, const nn::ParamInfo& p) {
  FloatBuffer& b = buffer(state_name);
  KEEL_CHECK(ownership_.is_everything());
  return {b.data() + p.offset, static_cast<size_t>(p.numel)};
}

std::span<float> AdamW::state(const std::string& state_name, const OwnedSlice& slice) {
  FloatBuffer& b = buffer(state_name);
  return {b.data() + slice.state_offset, static_cast<size_t>(slice.numel())};
}

void AdamW::update(nn::ParameterStore& store, const OwnedSlice& s, float lr, float grad_scale, float step_size,
                   float inv_sqrt_bias2) {
  const nn::ParamInfo& p = store.entries().at(s.entry);
  if (p.buffer) return;  // e.g. MoE's correction bias: moved by its own rule, not by gradients
  const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  const float decay = p.weight_decay ? 1.0f - lr * config_.weight_decay : 1.0f;
  float* w = store.values().data() + p.offset + s.begin;
  const float* g = store.grads().data() + p.offset + s.begin;
  float* mp = m_.data() + s.state_offset;
  float* vp = v_.data() + s.state_offset;
  const int64_t n = s.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;  // the clipped gradient (exact when grad_scale is 1)
    w[i] *= decay;
    mp[i] = b1 * mp[i] + (1.0f - b1) * gi;
    vp[i] = b2 * vp[i] + (1.0f - b2) * gi * gi;
    const float denom = std::sqrt(vp[i]) * inv_sqrt_bias2 + eps;
    w[i] -= step_size * mp[i] / denom;
  }
}

}  // namespace keel::optim
