#include "keel/kernels/clamped_swiglu.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "gradient_check.hpp"

namespace keel::kernels {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::random_vector;

double reference(double gate, double up, double alpha, double limit) {
  const double g = std::min(gate, limit);
  const double u = std::max(-limit, std::min(up, limit));
  return (u + 1) * g / (1 + std::exp(-alpha * g));
}

TEST(ClampedSwiglu, ForwardClampsGateAboveAndUpBothWays) {
  const ClampedSwiglu c{1.702f, 1.0f};
  // (gate, up) pairs: inside, gate over the limit, gate far below (passes), up over, up under.
  const std::vector<float> gu = {0.5f, -0.3f, 3.0f, 0.2f, -4.0f, 0.5f, 0.4f, 2.5f, 0.4f, -2.5f};
  std::vector<float> h(5);
  clamped_swiglu_forward(gu.data(), h.data(), 1, 5, c);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(h[size_t(i)], reference(gu[size_t(2 * i)], gu[size_t(2 * i + 1)], 1.702, 1.0), 1e-6) << i;
  EXPECT_NEAR(h[1], reference(1.0, 0.2, 1.702, 1.0), 1e-6);  // gate 3 acts as 1
  EXPECT_NEAR(h[3], 2.0 * 0.4 / (1 + std::exp(-1.702 * 0.4)), 1e-6);  // up 2.5 acts as 1: (1 + 1)·glu
  EXPECT_NEAR(h[4], 0.0, 1e-7);  // up −2.5 acts as −1: (−1 + 1)·glu = 0
}

TEST(ClampedSwiglu, BackwardMatchesFiniteDifferencesAwayFromTheClampEdges) {
  const int64_t n = 6, width = 10;
  const ClampedSwiglu c{1.702f, 1.5f};
  auto gu = random_vector(size_t(n * 2 * width), 5, -3.f, 3.f);
  // Keep probes off the kinks at ±limit, where a central difference straddles two slopes.
  for (float& x : gu) {
    if (std::abs(std::abs(x) - c.limit) < 0.05f) x += 0.2f;
  }
  const auto w = random_vector(size_t(n * width), 6);
  std::vector<float> h(size_t(n * width)), dgu(gu.size());
  auto loss = [&] {
    clamped_swiglu_forward(gu.data(), h.data(), n, width, c);
    return dot(h, w);
  };
  clamped_swiglu_backward(gu.data(), w.data(), dgu.data(), n, width, c);
  expect_gradient(gu, dgu, loss, "dgate_up", 1e-3, 1e-4, 1e-3, 120);
  int zero_gate = 0, zero_up = 0;
  for (int64_t i = 0; i < n * width; ++i) {
    zero_gate += gu[size_t(2 * i)] > c.limit && dgu[size_t(2 * i)] == 0.f;
    zero_up += std::abs(gu[size_t(2 * i + 1)]) > c.limit && dgu[size_t(2 * i + 1)] == 0.f;
  }
  EXPECT_GT(zero_gate, 0) << "some gates must be clamped (and pass no gradient)";
  EXPECT_GT(zero_up, 0) << "some ups must be clamped (and pass no gradient)";
}

}  // namespace
}  // namespace keel::kernels
