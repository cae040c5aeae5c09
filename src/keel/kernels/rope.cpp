#include "keel/core/stage_timer.hpp"
#include "keel/kernels/rope.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>

#include "keel/core/error.hpp"

namespace keel::kernels {

namespace {

double scaling_number(const nlohmann::json& s, const std::string& source, const char* key) {
  if (!s.contains(key) || !s[key].is_number())
    throw Error(source, "rope_scaling", std::string("missing numeric field '") + key + "'");
  return s[key].get<double>();
}

// An optional numeric field; null, absent and 0 all read as `fallback` (HF's `get(k) or default`).
double scaling_number_or(const nlohmann::json& s, const std::string& source, const char* key, double fallback) {
  if (!s.contains(key) || s[key].is_null()) return fallback;
  if (!s[key].is_number()) throw Error(source, "rope_scaling", std::string("field '") + key + "' must be a number");
  const double v = s[key].get<double>();
  return v == 0.0 ? fallback : v;
}

std::string scaling_type(const nlohmann::json& rope_scaling) {
  if (!rope_scaling.is_object()) return "default";
  if (rope_scaling.contains("rope_type") && rope_scaling["rope_type"].is_string())
    return rope_scaling["rope_type"].get<std::string>();
  if (rope_scaling.contains("type") && rope_scaling["type"].is_string()) return rope_scaling["type"].get<std::string>();
  return "";
}

}  // namespace

double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

double rope_attention_factor(const nlohmann::json& rope_scaling, const std::string& source) {
  if (scaling_type(rope_scaling) != "yarn") return 1.0;
  const double factor = scaling_number(rope_scaling, source, "factor");
  if (rope_scaling.contains("attention_factor") && !rope_scaling["attention_factor"].is_null())
    return scaling_number(rope_scaling, source, "attention_factor");
  const double mscale = scaling_number_or(rope_scaling, source, "mscale", 0.0);
  const double mscale_all_dim = scaling_number_or(rope_scaling, source, "mscale_all_dim", 0.0);
  if (mscale != 0.0 && mscale_all_dim != 0.0) return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
  return yarn_mscale(factor, 1.0);
}

std::vector<double> rope_inv_freq(double theta, int64_t rotary_dim, const nlohmann::json& rope_scaling,
                                  int64_t max_positions, const std::string& source) {
  if (rotary_dim <= 0 || rotary_dim % 2 != 0)
    throw Error(source, "rotary_dim", "must be positive and even, got " + std::to_string(rotary_dim));
  const int64_t half = rotary_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[size_t(i)] = std::pow(theta, -double(2 * i) / double(rotary_dim));
  if (rope_scaling.is_null()) return inv;
  if (!rope_scaling.is_object()) throw Error(source, "rope_scaling", "must be an object or null");
  const std::string type = scaling_type(rope_scaling);
  if (type == "default") return inv;
  if (type == "linear") {
    const double factor = scaling_number(rope_scaling, source, "factor");
    for (double& f : inv) f /= factor;
    return inv;
  }
  if (type == "llama3") {
    // transformers modeling_rope_utils._compute_llama3_parameters: wavelengths longer than
    // old_ctx/low_freq_factor are slowed by `factor`, shorter than old_ctx/high_freq_factor are
    // kept, and those between interpolate linearly in old_ctx/wavelen.
    const double factor = scaling_number(rope_scaling, source, "factor");
    const double low = scaling_number(rope_scaling, source, "low_freq_factor");
    const double high = scaling_number(rope_scaling, source, "high_freq_factor");
    const double old_ctx = scaling_number(rope_scaling, source, "original_max_position_embeddings");
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
  if (type == "yarn") {
    // transformers modeling_rope_utils._compute_yarn_parameters (YaRN, arXiv:2309.00071 §3.2;
    // DeepSeek-V3 §4.3): dims that rotate fewer than beta_slow times over the original context
    // are interpolated (f / factor), those rotating more than beta_fast times are kept, and a
    // linear ramp over the (truncated) correction dims blends the two.
    const double factor = scaling_number(rope_scaling, source, "factor");
    const double beta_fast = scaling_number_or(rope_scaling, source, "beta_fast", 32.0);
    const double beta_slow = scaling_number_or(rope_scaling, source, "beta_slow", 1.0);
    const double original = scaling_number_or(rope_scaling, source, "original_max_position_embeddings",
                                              static_cast<double>(max_positions));
    if (!(original > 0.0))
      throw Error(source, "rope_scaling", "yarn needs original_max_position_embeddings (or max_position_embeddings)");
    const bool truncate = !(rope_scaling.contains("truncate") && rope_scaling["truncate"].is_boolean() &&
                            !rope_scaling["truncate"].get<bool>());
    const double dim = static_cast<double>(rotary_dim);
    auto correction_dim = [&](double rotations) {
      return dim * std::log(original / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
    };
    double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
    if (truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1.0);
    if (low == high) high += 0.001;  // HF: avoids a division by zero in the ramp
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1.0 - ramp;  // weight of the unscaled frequency
      double& f = inv[size_t(i)];
      f = (f / factor) * (1.0 - extrapolation) + f * extrapolation;
    }
    return inv;
  }
  throw Error(source, "rope_scaling", "unsupported type '" + type + "' (supported: default, linear, llama3, yarn)");
}

RopeTable make_rope_table(double theta, int64_t rotary_dim, int64_t max_positions, const nlohmann::json& rope_scaling,
                          const std::string& source) {
  const std::vector<double> inv = rope_inv_freq(theta, rotary_dim, rope_scaling, max_positions, source);
  const double attention_factor = rope_attention_factor(rope_scaling, source);
  if (max_positions <= 0) throw Error(source, "max_position_embeddings", "must be positive");
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
      t.cos[size_t(p * half + i)] = float(std::cos(a) * attention_factor);
      t.sin[size_t(p * half + i)] = float(std::sin(a) * attention_factor);
    }
  return t;
}

namespace {

// Token bt of the (batch·seq) rows sits at position first_position + bt % seq.
// sign = +1 rotates by +angle (forward), -1 by -angle (backward, the transpose).
void rope_apply(float* x, const RopeTable& table, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                int64_t first_position, float sign) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
  KEEL_CHECK(table.rotary_dim <= head_dim && first_position >= 0 && first_position + seq <= table.max_positions);
  const int64_t half = table.rotary_dim / 2;
  // Pair i is (i, i + half) in the rotate-half layout, (2i, 2i + 1) when interleaved.
  const int64_t first_stride = table.interleave ? 2 : 1, second_offset = table.interleave ? 1 : half;
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
        const int64_t a = i * first_stride, b = a + second_offset;
        const float x1 = v[a], x2 = v[b], sn = sign * s[i];
        v[a] = x1 * c[i] - x2 * sn;
        v[b] = x2 * c[i] + x1 * sn;
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
