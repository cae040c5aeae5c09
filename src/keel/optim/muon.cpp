#include "keel/core/stage_timer.hpp"
#include "keel/optim/muon.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "keel/core/error.hpp"
#include "keel/optim/newton_schulz.hpp"

namespace keel::optim {
namespace {

bool glob_match(const char* p, const char* s) {
  // Iterative glob with single-star backtracking.
  const char* star = nullptr;
  const char* resume = nullptr;
  while (*s) {
    if (*p == '?' || (*p && *p != '*' && *p == *s)) {
      ++p;
      ++s;
    } else if (*p == '*') {
      star = p++;
      resume = s;
    } else if (star) {
      p = star + 1;
      s = ++resume;
    } else {
      return false;
    }
  }
  while (*p == '*') ++p;
  return *p == '\0';
}

bool any_match(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) { return name_matches(p, name); });
}

// (A, B): first dimension and the product of the rest.
std::pair<int64_t, int64_t> matrix_dims(const nn::ParamInfo& p) { return {p.shape[0], p.numel / p.shape[0]}; }

}  // namespace

bool name_matches(const std::string& pattern, const std::string& name) {
  if (pattern.find_first_of("*?") == std::string::npos) return name.find(pattern) != std::string::npos;
  return glob_match(pattern.c_str(), name.c_str());
}

std::vector<size_t> Muon::route(const nn::ParameterStore& store, const MuonConfig& config) {
  std::vector<size_t> out;
  const auto& entries = store.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    const nn::ParamInfo& p = entries[i];
    if (p.buffer) continue;  // neither group: buffers are not optimized
    bool muon = p.matrix;
    if (any_match(config.force_adamw, p.name)) {
      muon = false;
    } else if (any_match(config.force_muon, p.name)) {
      if (p.shape.size() < 2)
        throw Error("muon", "force_muon", "parameter '" + p.name + "' has fewer than two dimensions");
      muon = true;
    }
    if (muon && p.shape.size() >= 2) out.push_back(i);
  }
  return out;
}

Muon::Muon(const nn::ParameterStore& store, MuonConfig config) : Muon(store, config, Ownership::everything(store)) {}

Muon::Muon(const nn::ParameterStore& store, MuonConfig config, Ownership ownership)
    : config_(std::move(config)), adamw_opt_(config_.adamw, std::move(ownership)) {
  const Ownership& own = adamw_opt_.ownership();
  momentum_.resize(static_cast<size_t>(own.state_floats()));
  const std::vector<size_t> routed = route(store, config_);
  int64_t max_numel = 0, max_ws = 0;
  for (size_t si = 0; si < own.slices().size(); ++si) {
    const OwnedSlice& s = own.slices()[si];
    const nn::ParamInfo& p = store.entries().at(s.entry);
    if (p.buffer) continue;
    const bool muon = std::binary_search(routed.begin(), routed.end(), s.entry);
    if (!muon) {
      adamw_.push_back(s.entry);
      adamw_slices_.push_back(si);
      continue;
    }
    KEEL_CHECK(Ownership::whole(s, p));  // Newton–Schulz of a slice is not the slice of Newton–Schulz
    muon_.push_back(s.entry);
    muon_names_.push_back(p.name);
    auto [a, b] = matrix_dims(p);
    max_numel = std::max(max_numel, p.numel);
    max_ws = std::max(max_ws, newton_schulz_workspace_floats(a, b));
  }
  update_.resize(static_cast<size_t>(max_numel));
  ortho_.resize(static_cast<size_t>(max_numel));
  workspace_.resize(static_cast<size_t>(max_ws));
}

bool Muon::uses_muon(const std::string& name) const {
  return std::find(muon_names_.begin(), muon_names_.end(), name) != muon_names_.end();
}

MuonScaling parse_muon_scaling(const std::string& name, const std::string& source) {
  if (name == "moonlight") return MuonScaling::Moonlight;
  if (name == "keller_jordan") return MuonScaling::KellerJordan;
  if (name == "update_norm") return MuonScaling::UpdateNorm;
  throw Error(source, "optimizer.muon_scaling", "unknown scaling '" + name + "'; supported: moonlight, keller_jordan, update_norm");
}

std::span<float> Muon::state(const std::string& state_name, const nn::ParamInfo& p) {
  if (state_name == "momentum") return {momentum_.data() + p.offset, static_cast<size_t>(p.numel)};
  if (state_name == "exp_avg" || state_name == "exp_avg_sq") return adamw_opt_.state(state_name, p);
  throw Error("muon", "state", "no state named '" + state_name + "'; Muon holds momentum, exp_avg, exp_avg_sq");
}

std::span<float> Muon::state(const std::string& state_name, const OwnedSlice& slice) {
  if (state_name == "momentum") return {momentum_.data() + slice.state_offset, static_cast<size_t>(slice.numel())};
  if (state_name == "exp_avg" || state_name == "exp_avg_sq") return adamw_opt_.state(state_name, slice);
  throw Error("muon", "state", "no state named '" + state_name + "'; Muon holds momentum, exp_avg, exp_avg_sq");
}

float Muon::update_scale(int64_t rows, int64_t cols, const float* o) const {
  switch (config_.scaling) {
    case MuonScaling::Moonlight:
      return config_.update_rms * std::sqrt(static_cast<float>(std::max(rows, cols)));
    case MuonScaling::KellerJordan:
      return std::sqrt(std::max(1.0f, static_cast<float>(rows) / static_cast<float>(cols)));
    case MuonScaling::UpdateNorm: {
      KEEL_CHECK(o != nullptr);
      // Serial double sum: a fixed order keeps Muon steps bit-reproducible (exact resume).
      double sum_sq = 0;
      const int64_t n = rows * cols;
      for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(o[i]) * o[i];
      const double rms = std::sqrt(sum_sq / static_cast<double>(n));
      return rms > 0 ? static_cast<float>(config_.update_rms / rms) : 0.0f;
    }
  }
  return 1.0f;
}

void Muon::step(nn::ParameterStore& store, float lr, float grad_scale) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Optimizer);
  ++step_;
  double ns_seconds = 0;
  const float beta = config_.momentum;
  float* values = store.values().data();
  const float* grads = store.grads().data();
  for (size_t e : muon_) {
    const nn::ParamInfo& p = store.entries()[e];
    auto [rows, cols] = matrix_dims(p);
    float* w = values + p.offset;
    const float* g = grads + p.offset;
    float* buf = momentum_.data() + ownership().find(e)->state_offset;
    float* u = update_.data();
    if (grad_scale != 1.0f) {
      // The clipped gradient, stored first: multiplied in the loop below, g·scale would be fused
      // into its additions (an FMA rounding once), not the value a clip in place would have stored.
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < p.numel; ++i) u[i] = g[i] * grad_scale;
      g = u;
    }
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < p.numel; ++i) {
      const float gi = g[i];  // read before u[i] is written: g may be u
      buf[i] = beta * buf[i] + gi;
      u[i] = config_.nesterov ? gi + beta * buf[i] : buf[i];
    }
    const auto t0 = std::chrono::steady_clock::now();
    newton_schulz5(u, ortho_.data(), rows, cols, workspace_.data(), config_.ns_steps);
    ns_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const float decay = p.weight_decay ? 1.0f - lr * config_.weight_decay : 1.0f;
    const float* o = ortho_.data();
    const float step_size = lr * update_scale(rows, cols, o);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < p.numel; ++i) w[i] = w[i] * decay - step_size * o[i];
  }
  last_ns_seconds_ = ns_seconds;
  if (!adamw_slices_.empty()) adamw_opt_.step(store, lr, grad_scale, adamw_slices_);
}

}  // namespace keel::optim
