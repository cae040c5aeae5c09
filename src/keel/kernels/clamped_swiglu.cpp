#include "keel/kernels/clamped_swiglu.hpp"

#include <algorithm>
#include <cmath>

namespace keel::kernels {

void clamped_swiglu_forward(const float* gate_up, float* h, int64_t n, int64_t width, const ClampedSwiglu& c) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* in = gate_up + t * 2 * width;
    float* out = h + t * width;
    for (int64_t i = 0; i < width; ++i) {
      const float g = std::min(in[2 * i], c.limit);
      const float u = std::clamp(in[2 * i + 1], -c.limit, c.limit);
      out[i] = (u + 1.f) * g / (1.f + std::exp(-c.alpha * g));
    }
  }
}

void clamped_swiglu_backward(const float* gate_up, const float* dh, float* dgate_up, int64_t n, int64_t width,
                             const ClampedSwiglu& c) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* in = gate_up + t * 2 * width;
    const float* d = dh + t * width;
    float* out = dgate_up + t * 2 * width;
    for (int64_t i = 0; i < width; ++i) {
      const float gate = in[2 * i], up = in[2 * i + 1];
      const float g = std::min(gate, c.limit);
      const float u = std::clamp(up, -c.limit, c.limit);
      const float s = 1.f / (1.f + std::exp(-c.alpha * g));
      const float glu = g * s;
      // d/dg [g·σ(αg)] = σ(αg) + α·g·σ(αg)(1 − σ(αg))
      const float dglu = s + c.alpha * g * s * (1.f - s);
      out[2 * i] = gate <= c.limit ? d[i] * (u + 1.f) * dglu : 0.f;
      out[2 * i + 1] = (up >= -c.limit && up <= c.limit) ? d[i] * glu : 0.f;
    }
  }
}

}  // namespace keel::kernels
