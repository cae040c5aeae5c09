#include "keel/core/stage_timer.hpp"
#include "keel/kernels/softcap.hpp"

#include <cmath>

namespace keel::kernels {

// x: (n) -> y: (n)
void softcap_forward(const float* x, float* y, int64_t n, float cap) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = cap * std::tanh(x[i] / cap);
}

// x, dy: (n); accumulates dx: (n)
void softcap_backward(const float* x, const float* dy, float* dx, int64_t n, float cap) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float t = std::tanh(x[i] / cap);
    dx[i] += (1.f - t * t) * dy[i];
  }
}

}  // namespace keel::kernels
