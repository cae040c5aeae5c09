#include "keel/optim/grad_clip.hpp"

#include <cmath>
#include <cstdint>

namespace keel::optim {

double global_grad_norm(std::span<const float> grads) {
  double sum = 0.0;
  const float* g = grads.data();
  const int64_t n = static_cast<int64_t>(grads.size());
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(g[i]) * g[i];
  return std::sqrt(sum);
}

double clip_grad_norm(std::span<float> grads, double max_norm) {
  const double norm = global_grad_norm(grads);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    const float c = static_cast<float>(coef);
    float* g = grads.data();
    const int64_t n = static_cast<int64_t>(grads.size());
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) g[i] *= c;
  }
  return norm;
}

}  // namespace keel::optim
