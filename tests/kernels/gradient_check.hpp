#pragma once
// Shared helpers for the kernel tests: seeded random fills and a central-difference check of an
// analytic gradient. Losses are evaluated in double as Σ y·g for a fixed random g, so the
// gradient of the loss with respect to y is g and backward kernels are fed dy = g.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace keel::kernels::testing {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// Compares grad[i] with (loss(x+eps·e_i) - loss(x-eps·e_i)) / 2eps at up to max_probes indices
// spread over x (all of them when x is small). |grad - fd| must be <= atol + rtol·|fd|.
template <class Loss>
void expect_gradient(std::vector<float>& x, const std::vector<float>& grad, Loss loss, const std::string& what,
                     double eps = 1e-2, double atol = 2e-3, double rtol = 1e-2, size_t max_probes = 48,
                     bool expect_nonzero = true) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  const size_t stride = std::max<size_t>(1, x.size() / max_probes);
  double worst = 0;
  for (size_t i = 0; i < x.size(); i += stride) {
    const float v = x[i];
    x[i] = float(double(v) + eps);
    const double lp = loss();
    x[i] = float(double(v) - eps);
    const double lm = loss();
    x[i] = v;
    const double fd = (lp - lm) / (2 * eps);
    worst = std::max(worst, std::abs(grad[i] - fd));
    EXPECT_NEAR(grad[i], fd, atol + rtol * std::abs(fd)) << what << "[" << i << "]";
  }
  // A gradient that is zero everywhere checks little; callers say when zero is the right answer.
  if (!expect_nonzero) return;
  double norm = 0;
  for (float g : grad) norm += std::abs(g);
  EXPECT_GT(norm, 0.0) << what << ": all-zero gradient";
}

}  // namespace keel::kernels::testing
