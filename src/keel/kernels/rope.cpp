#include "keel/kernels/rope.hpp"

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>

#include "keel/core/error.hpp"

namespace keel::kernels {

namespace {

double scaling_number(const nlohmann::json& s, const char* key) {
  if (!s.contains(key) || !s[key].is_number())
    throw Error("", "rope_scaling", std::string("missing numeric field '") + key + "'");
  return s[key].get<double>();
}

}  // namespace

std::vector<double> rope_inv_freq(double theta, int64_t rotary_dim, const nlohmann::json& rope_scaling) {
  if (rotary_dim <= 0 || rotary_dim % 2 != 0)
    throw Error("", "rotary_dim", "must be positive and even, got " + std::to_string(rotary_dim));
  const int64_t half = rotary_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[size_t(i)] = std::pow(theta, -double(2 * i) / double(rotary_dim));
  if (rope_scaling.is_null()) return inv;
  if (!rope_scaling.is_object()) throw Error("", "rope_scaling", "must be an object or null");
  std::string type;
  if (rope_scaling.contains("rope_type") && rope_scaling["rope_type"].is_string())
    type = rope_scaling["rope_type"].get<std::string>();
  else if (rope_scaling.contains("type") && rope_scaling["type"].is_string())
    type = rope_scaling["type"].get<std::string>();
  if (type == "default") return inv;
  if (type == "linear") {
    const double factor = scaling_number(rope_scaling, "factor");
    for (double& f : inv) f /= factor;
    return inv;
  }
  if (type == "llama3") {
    // transformers modeling_rope_utils._compute_llama3_parameters: wavelengths longer than
    // old_ctx/low_freq_factor are slowed by `factor`, shorter than old_ctx/high_freq_factor are
    // kept, and those between interpolate linearly in old_ctx/wavelen.
    const double factor = scaling_number(rope_scaling, "factor");
    const double low = scaling_number(rope_scaling, "low_freq_factor");
    const double high = scaling_number(rope_scaling, "high_freq_factor");
    const double old_ctx = scaling_number(rope_scaling, "original_max_position_embeddings");
    const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    for (double& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      const double scaled = wavelen > low_wavelen ? f / factor : f;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const double smooth = (old_ctx / wavelen - low) / (high - low);
        f = (1.0 - smooth) * scaled / factor + smooth * scaled;
      } else {
        f = scaled;
      }
    }
    return inv;
  }
  throw Error("", "rope_scaling", "unsupported type '" + type + "' (supported: default, linear, llama3)");
}

RopeTable make_rope_table(double theta, int64_t rotary_dim, int64_t max_positions, const nlohmann::json& rope_scaling) {
  const std::vector<double> inv = rope_inv_freq(theta, rotary_dim, rope_scaling);
  if (max_positions <= 0) throw Error("", "max_position_embeddings", "must be positive");
  RopeTable t;
  t.rotary_dim = rotary_dim;
  t.max_positions = max_positions;
  const int64_t half = rotary_dim / 2;
  t.cos.resize(size_t(max_positions * half));
  t.sin.resize(size_t(max_positions * half));
  // Angles in double: at position 100k an fp32 angle is already off by ~1e-2 rad.
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < max_positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(p) * inv[size_t(i)];
      t.cos[size_t(p * half + i)] = float(std::cos(a));
      t.sin[size_t(p * half + i)] = float(std::sin(a));
    }
  return t;
}

namespace {

// Token bt of the (batch·seq) rows sits at position first_position + bt % seq.
// sign = +1 rotates by +angle (forward), -1 by -angle (backward, the transpose).
void rope_apply(float* x, const RopeTable& table, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                int64_t first_position, float sign) {
  KEEL_CHECK(table.rotary_dim <= head_dim && first_position >= 0 && first_position + seq <= table.max_positions);
  const int64_t half = table.rotary_dim / 2;
#pragma omp parallel for schedule(static) if (batch * seq > 1)
  for (int64_t bt = 0; bt < batch * seq; ++bt) {
    const int64_t t = first_position + bt % seq;
    const float* c = table.cos.data() + t * half;
    const float* s = table.sin.data() + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (bt * heads + h) * head_dim;
      // HF: out = x·cos + rotate_half(x)·sin, rotate_half(x) = (-x2, x1).
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = v[i], x2 = v[i + half], sn = sign * s[i];
        v[i] = x1 * c[i] - x2 * sn;
        v[i + half] = x2 * c[i] + x1 * sn;
      }
    }
  }
}

}  // namespace

// x: (B, T, H, D), in place
void rope_forward(float* x, const RopeTable& table, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim) {
  rope_apply(x, table, batch, seq, heads, head_dim, 0, 1.f);
}

// x: (tokens, H, D), in place, positions first_position..first_position+tokens-1
void rope_forward_at(float* x, const RopeTable& table, int64_t tokens, int64_t heads, int64_t head_dim,
                     int64_t first_position) {
  rope_apply(x, table, 1, tokens, heads, head_dim, first_position, 1.f);
}

// dx: (B, T, H, D), in place (the inverse rotation)
void rope_backward(float* dx, const RopeTable& table, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim) {
  rope_apply(dx, table, batch, seq, heads, head_dim, 0, -1.f);
}

}  // namespace keel::kernels
