#include "keel/optim/grad_clip.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../kernels/gradient_check.hpp"

namespace keel::optim {
namespace {

std::vector<float> gradients(size_t n, uint32_t seed) {
  std::vector<float> g = kernels::testing::random_vector(n, seed);
  for (size_t i = 0; i < n; i += 7) g[i] *= 100.f;  // a few large entries
  return g;
}

// sum_of_squares against one long-double running sum, for sizes around its 65,536-value chunks
// (none, one partial, exactly one, one and a value, several and a tail), on teams of 1, 2 and 3
// threads: the same bits on every team, within 1e-12 of the running sum.
TEST(GradClip, SumOfSquaresMatchesARunningSumOnEveryTeam) {
  const int saved_threads = omp_get_max_threads();
  for (size_t n : {size_t(0), size_t(1), size_t(65535), size_t(65536), size_t(65537), size_t(3 * 65536 + 17)}) {
    const std::vector<float> g = gradients(n, uint32_t(n) + 1);
    long double want = 0;
    for (float x : g) want += static_cast<long double>(x) * x;
    double first = 0;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      const double got = sum_of_squares(g);
      const std::string tag = "n=" + std::to_string(n) + " threads=" + std::to_string(threads);
      EXPECT_NEAR(got, double(want), 1e-12 * double(want)) << tag;
      if (threads == 1) first = got;
      else EXPECT_EQ(std::memcmp(&got, &first, sizeof got), 0) << tag << ": not the one-thread bits";
    }
  }
  omp_set_num_threads(saved_threads);
}

// clip_grad_norm as torch.nn.utils.clip_grad_norm_: returns the norm before clipping; above
// max_norm every gradient is scaled by max_norm / (norm + 1e-6); at or below, nothing moves.
TEST(GradClip, ScalesOnlyAboveTheMaxNorm) {
  const std::vector<float> g0 = gradients(70000, 5);
  const double norm = std::sqrt(sum_of_squares(g0));
  std::vector<float> g = g0;
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 2 * norm), norm);
  EXPECT_EQ(std::memcmp(g.data(), g0.data(), g.size() * sizeof(float)), 0);

  const double max_norm = norm / 8;
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, max_norm), norm);
  const float coef = static_cast<float>(max_norm / (norm + 1e-6));
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], g0[i] * coef) << i;
  EXPECT_NEAR(std::sqrt(sum_of_squares(g)), max_norm, 1e-6 * max_norm);
}

}  // namespace
}  // namespace keel::optim
