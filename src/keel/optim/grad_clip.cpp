#include "keel/core/stage_timer.hpp"
#include "keel/optim/grad_clip.hpp"
#include "keel/core/fixed_order_sum.hpp"

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <vector>

namespace keel::optim {

double global_grad_norm(std::span<const float> grads) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Optimizer);  // the clip's first half
  return std::sqrt(sum_of_squares(grads));
}

double sum_of_squares(std::span<const float> grads) {
  // Fixed chunks summed in a fixed order: the norm (and so the clip) is bit-identical from run
  // to run whatever the threads do, which exact resume relies on. An OpenMP reduction would
  // combine partial sums in arrival order.
  constexpr int64_t kChunk = 1 << 16;
  const float* g = grads.data();
  const int64_t n = static_cast<int64_t>(grads.size());
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    partial[static_cast<size_t>(c)] = sum_of_squares_in_lanes(g, c * kChunk, std::min(n, (c + 1) * kChunk));
  }
  double sum = 0.0;
  for (double s : partial) sum += s;
  return sum;
}

float clip_scale(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

double clip_grad_norm(std::span<float> grads, double max_norm) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Optimizer);
  const double norm = global_grad_norm(grads);
  const float c = clip_scale(norm, max_norm);
  if (c != 1.0f) {
    float* g = grads.data();
    const int64_t n = static_cast<int64_t>(grads.size());
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) g[i] *= c;
  }
  return norm;
}

}  // namespace keel::optim
