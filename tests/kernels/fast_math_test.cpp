#include "keel/kernels/fast_math.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace keel::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The running std::max, max_in_lanes' reference twin.
float running_max(const std::vector<float>& x, int64_t n) {
  float m = -kInf;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[size_t(i)]);
  return m;
}

// Every length around the 16-lane grid, with the maximum placed in the lanes, in the tail and
// at the first element; all-negative rows; an empty row; NaNs passed over as std::max does.
TEST(FastMath, MaxInLanesEqualsTheRunningMax) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(-5.f, 2.f);
  for (int64_t n : {0, 1, 5, 15, 16, 17, 31, 32, 33, 100, 8192, 8195}) {
    for (int where = 0; where < 3; ++where) {
      SCOPED_TRACE(testing::Message() << "n " << n << " where " << where);
      std::vector<float> x(size_t(n) + 1);
      for (auto& v : x) v = dist(rng);
      if (n > 0) x[size_t(where == 0 ? 0 : where == 1 ? n - 1 : n / 2)] = 40.f + float(n);
      EXPECT_EQ(detail::max_in_lanes(x.data(), n), running_max(x, n));
    }
  }
  EXPECT_EQ(detail::max_in_lanes(nullptr, 0), -kInf);
  std::vector<float> with_nan = {1.f, std::nanf(""), 3.f, -2.f};
  with_nan.resize(37, -7.f);
  with_nan[20] = std::nanf("");
  EXPECT_EQ(detail::max_in_lanes(with_nan.data(), int64_t(with_nan.size())), 3.f);
  with_nan[0] = std::nanf("");   // in the first lane's start
  with_nan[35] = std::nanf("");  // in the tail past the last row of 16
  EXPECT_EQ(detail::max_in_lanes(with_nan.data(), int64_t(with_nan.size())), 3.f);
  std::vector<float> masked(40, -kInf);
  EXPECT_EQ(detail::max_in_lanes(masked.data(), 40), -kInf);
  masked[39] = -1e30f;
  EXPECT_EQ(detail::max_in_lanes(masked.data(), 40), -1e30f);
}

// fast_exp against std::exp over the range the softmaxes use, and its clamp below -87.
TEST(FastMath, ExpAndTanhMatchLibm) {
  for (float x = -87.f; x <= 88.f; x += 0.0137f) {
    const double ref = std::exp(double(x));
    ASSERT_NEAR(detail::fast_exp(x), ref, 4e-7 * ref) << x;
  }
  EXPECT_EQ(detail::fast_exp(-100.f), 0.f);
  EXPECT_EQ(detail::fast_exp(-kInf), 0.f);
  for (float x = -12.f; x <= 12.f; x += 0.0071f) ASSERT_NEAR(detail::fast_tanh(x), std::tanh(double(x)), 3e-7) << x;
}

}  // namespace
}  // namespace keel::kernels
