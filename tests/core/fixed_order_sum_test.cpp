#include "keel/core/fixed_order_sum.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace keel {
namespace {

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 3.f);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

// The lane sum against the plain running sum in long double, its reference twin: ranges shorter
// than one row of lanes, exact multiples, ragged tails and starts off the 16-float grid.
TEST(FixedOrderSum, SquaresInLanesMatchTheRunningSum) {
  const auto x = random_floats(5000, 7);
  for (int64_t i0 : {int64_t{0}, int64_t{1}, int64_t{13}}) {
    for (int64_t len : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{160}, int64_t{4093}}) {
      SCOPED_TRACE(testing::Message() << "i0 " << i0 << " len " << len);
      long double reference = 0.0L;
      for (int64_t i = i0; i < i0 + len; ++i) reference += static_cast<long double>(x[i]) * x[i];
      const double lanes = sum_of_squares_in_lanes(x.data(), i0, i0 + len);
      EXPECT_NEAR(lanes, static_cast<double>(reference), 1e-13 * static_cast<double>(reference) + 1e-300);
    }
  }
  // Integers whose squares are exact in double: every order gives the same value exactly.
  std::vector<float> ints(1000);
  double exact = 0.0;
  for (size_t i = 0; i < ints.size(); ++i) {
    ints[i] = static_cast<float>(static_cast<int>(i % 97) - 48);
    exact += static_cast<double>(ints[i]) * ints[i];
  }
  EXPECT_EQ(sum_of_squares_in_lanes(ints.data(), 0, 1000), exact);
}

// The chunked sum gives the same bits on teams of one, two and three: the gradient norm, and so
// clipping and the training curve, must not depend on the team the governor hands out.
TEST(FixedOrderSum, SameBitsOnEveryTeamSize) {
  const auto x = random_floats((size_t{1} << 18) + 777, 11);
  const int64_t n = static_cast<int64_t>(x.size());
  auto run = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    const auto s = fixed_order_sum<2>(n, [&](int64_t a, int64_t b) {
      double abs_sum = 0.0;
      for (int64_t i = a; i < b; ++i) abs_sum += std::fabs(x[i]);
      return std::array<double, 2>{sum_of_squares_in_lanes(x.data(), a, b), abs_sum};
    });
    omp_set_num_threads(before);
    return s;
  };
  const auto one = run(1), two = run(2), three = run(3);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(std::memcmp(&one[k], &two[k], sizeof(double)), 0) << k;
    EXPECT_EQ(std::memcmp(&one[k], &three[k], sizeof(double)), 0) << k;
  }
  long double reference = 0.0L;
  for (float v : x) reference += static_cast<long double>(v) * v;
  EXPECT_NEAR(one[0], static_cast<double>(reference), 1e-12 * static_cast<double>(reference));
}

}  // namespace
}  // namespace keel
