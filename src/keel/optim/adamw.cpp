#include "keel/optim/adamw.hpp"

#include <cmath>

#include "keel/core/error.hpp"

namespace keel::optim {

AdamW::AdamW(const nn::ParameterStore& store, AdamWConfig config)
    : config_(config), m_(static_cast<size_t>(store.size())), v_(static_cast<size_t>(store.size())) {}

void AdamW::step(nn::ParameterStore& store, float lr) {
  ++step_;
  const double bias1 = 1.0 - std::pow(static_cast<double>(config_.beta1), static_cast<double>(step_));
  const double bias2 = 1.0 - std::pow(static_cast<double>(config_.beta2), static_cast<double>(step_));
  const float step_size = static_cast<float>(lr / bias1);
  const float inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  for (const nn::ParamInfo& p : store.entries()) update(store, p, lr, step_size, inv_sqrt_bias2);
}

void AdamW::step(nn::ParameterStore& store, float lr, std::span<const size_t> entries) {
  ++step_;
  const double bias1 = 1.0 - std::pow(static_cast<double>(config_.beta1), static_cast<double>(step_));
  const double bias2 = 1.0 - std::pow(static_cast<double>(config_.beta2), static_cast<double>(step_));
  const float step_size = static_cast<float>(lr / bias1);
  const float inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  for (size_t e : entries) update(store, store.entries().at(e), lr, step_size, inv_sqrt_bias2);
}

std::span<float> AdamW::state(const std::string& state_name, const nn::ParamInfo& p) {
  FloatBuffer* buffer = state_name == "exp_avg" ? &m_ : state_name == "exp_avg_sq" ? &v_ : nullptr;
  if (!buffer) throw Error("adamw", "state", "no state named '" + state_name + "'; AdamW holds exp_avg, exp_avg_sq");
  return {buffer->data() + p.offset, static_cast<size_t>(p.numel)};
}

void AdamW::update(nn::ParameterStore& store, const nn::ParamInfo& p, float lr, float step_size,
                   float inv_sqrt_bias2) {
  if (p.buffer) return;  // e.g. MoE's correction bias: moved by its own rule, not by gradients
  const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  const float decay = p.weight_decay ? 1.0f - lr * config_.weight_decay : 1.0f;
  float* w = store.values().data() + p.offset;
  const float* g = store.grads().data() + p.offset;
  float* mp = m_.data() + p.offset;
  float* vp = v_.data() + p.offset;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < p.numel; ++i) {
    w[i] *= decay;
    mp[i] = b1 * mp[i] + (1.0f - b1) * g[i];
    vp[i] = b2 * vp[i] + (1.0f - b2) * g[i] * g[i];
    const float denom = std::sqrt(vp[i]) * inv_sqrt_bias2 + eps;
    w[i] -= step_size * mp[i] / denom;
  }
}

}  // namespace keel::optim
