#include "keel/kernels/norm.hpp"

#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "gradient_check.hpp"

namespace keel::kernels {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::random_vector;

TEST(NormKernel, RmsNormForwardMatchesDefinition) {
  const int64_t rows = 3, dim = 19;
  const auto x = random_vector(size_t(rows * dim), 1, -3.f, 3.f), w = random_vector(size_t(dim), 2);
  std::vector<float> y(x.size()), rstd(static_cast<size_t>(rows));
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, dim, 1e-5f);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += double(x[size_t(r * dim + j)]) * x[size_t(r * dim + j)];
    const double rs = 1 / std::sqrt(ss / dim + 1e-5);
    EXPECT_NEAR(rstd[size_t(r)], rs, 1e-6 * rs);
    for (int64_t j = 0; j < dim; ++j)
      EXPECT_NEAR(y[size_t(r * dim + j)], x[size_t(r * dim + j)] * rs * w[size_t(j)], 1e-5);
  }
}

TEST(NormKernel, RmsNormGradientsMatchFiniteDifferences) {
  const int64_t rows = 4, dim = 13;
  auto x = random_vector(size_t(rows * dim), 3, -2.f, 2.f);
  auto w = random_vector(size_t(dim), 4, 0.5f, 1.5f);
  const auto g = random_vector(x.size(), 5);
  std::vector<float> y(x.size()), rstd(static_cast<size_t>(rows));
  auto loss = [&] {
    rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, dim, 1e-6f);
    return dot(y, g);
  };
  loss();
  std::vector<float> dx(x.size(), 0.5f), dw(w.size(), 0.5f);
  rmsnorm_backward(x.data(), w.data(), rstd.data(), g.data(), dx.data(), dw.data(), rows, dim);
  for (float& v : dx) v -= 0.5f;  // backward accumulates onto 0.5
  for (float& v : dw) v -= 0.5f;
  expect_gradient(x, dx, loss, "rmsnorm dx", 1e-3);
  expect_gradient(w, dw, loss, "rmsnorm dw", 1e-3);
}

TEST(NormKernel, LayerNormForwardMatchesDefinition) {
  const int64_t rows = 2, dim = 23;
  // A large common offset: the two-pass variance must not cancel.
  const auto x = random_vector(size_t(rows * dim), 6, 999.f, 1001.f);
  const auto w = random_vector(size_t(dim), 7), b = random_vector(size_t(dim), 8);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, dim, 1e-5f);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < dim; ++j) mu += x[size_t(r * dim + j)];
    mu /= dim;
    for (int64_t j = 0; j < dim; ++j) var += (x[size_t(r * dim + j)] - mu) * (x[size_t(r * dim + j)] - mu);
    const double rs = 1 / std::sqrt(var / dim + 1e-5);
    EXPECT_NEAR(rstd[size_t(r)], rs, 1e-4 * rs);
    for (int64_t j = 0; j < dim; ++j)
      EXPECT_NEAR(y[size_t(r * dim + j)], (x[size_t(r * dim + j)] - mu) * rs * w[size_t(j)] + b[size_t(j)], 2e-3);
  }
}

TEST(NormKernel, LayerNormGradientsMatchFiniteDifferences) {
  const int64_t rows = 3, dim = 11;
  auto x = random_vector(size_t(rows * dim), 9, -2.f, 2.f);
  auto w = random_vector(size_t(dim), 10, 0.5f, 1.5f), b = random_vector(size_t(dim), 11);
  const auto g = random_vector(x.size(), 12);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  auto loss = [&] {
    layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, dim, 1e-5f);
    return dot(y, g);
  };
  loss();
  std::vector<float> dx(x.size(), 0.f), dw(w.size(), 0.f), db(b.size(), 0.f);
  layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), g.data(), dx.data(), dw.data(), db.data(), rows,
                     dim);
  expect_gradient(x, dx, loss, "layernorm dx", 1e-3);
  expect_gradient(w, dw, loss, "layernorm dw", 1e-3);
  expect_gradient(b, db, loss, "layernorm db", 1e-3);
}

// Many rows: the weight and bias gradients are summed in blocks of rows inside the backward's row
// pass (norm.cpp). They must equal the plain sums over all rows, whatever the team size, also
// with a ragged last block and when dx is not wanted.
TEST(NormKernel, WeightGradientsOverManyRowsMatchSumsForAnyTeam) {
  for (const int64_t rows : {int64_t(1000), int64_t(5000)}) {
    const int64_t dim = 37;
    const auto x = random_vector(size_t(rows * dim), 21, -2.f, 2.f), g = random_vector(x.size(), 22);
    const auto w = random_vector(size_t(dim), 23, 0.5f, 1.5f), b = random_vector(size_t(dim), 24);
    std::vector<float> y(x.size()), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows)),
        rms_rstd(static_cast<size_t>(rows));
    layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, dim, 1e-5f);
    rmsnorm_forward(x.data(), w.data(), y.data(), rms_rstd.data(), rows, dim, 1e-5f);
    std::vector<double> want_ln_w(static_cast<size_t>(dim)), want_ln_b(static_cast<size_t>(dim)),
        want_rms_w(static_cast<size_t>(dim));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < dim; ++j) {
        const size_t i = size_t(r * dim + j);
        want_ln_w[size_t(j)] += double(g[i]) * ((x[i] - mean[size_t(r)]) * rstd[size_t(r)]);
        want_ln_b[size_t(j)] += double(g[i]);
        want_rms_w[size_t(j)] += double(g[i]) * x[i] * rms_rstd[size_t(r)];
      }
    const int team = omp_get_max_threads();
    std::vector<float> first_ln_w, first_rms_w, first_dx;
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> dx(x.size(), 0.f), ln_w(static_cast<size_t>(dim), 1.f), ln_b(static_cast<size_t>(dim), 1.f),
          rms_w(static_cast<size_t>(dim), 1.f);
      layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), g.data(), dx.data(), ln_w.data(), ln_b.data(),
                         rows, dim);
      rmsnorm_backward(x.data(), w.data(), rms_rstd.data(), g.data(), nullptr, rms_w.data(), rows, dim);
      for (int64_t j = 0; j < dim; ++j) {  // each accumulated onto 1
        EXPECT_NEAR(ln_w[size_t(j)] - 1.0, want_ln_w[size_t(j)], 1e-4 + 1e-6 * std::abs(want_ln_w[size_t(j)]));
        EXPECT_NEAR(ln_b[size_t(j)] - 1.0, want_ln_b[size_t(j)], 1e-4 + 1e-6 * std::abs(want_ln_b[size_t(j)]));
        EXPECT_NEAR(rms_w[size_t(j)] - 1.0, want_rms_w[size_t(j)], 1e-4 + 1e-6 * std::abs(want_rms_w[size_t(j)]));
      }
      if (threads == 1) {
        first_ln_w = ln_w;
        first_rms_w = rms_w;
        first_dx = dx;
      } else {
        EXPECT_EQ(ln_w, first_ln_w) << threads << " threads, " << rows << " rows";
        EXPECT_EQ(rms_w, first_rms_w) << threads << " threads, " << rows << " rows";
        EXPECT_EQ(dx, first_dx) << threads << " threads, " << rows << " rows";
      }
    }
    omp_set_num_threads(team);
  }
}

// A norm's output dropped between forward and backward is recomputed from the saved statistics:
// the very bits, or the backward's products would read other values than the forward's. Rows of
// a width with a vector tail, with and without a gain (and LayerNorm's bias).
TEST(NormKernel, ApplyGivesTheForwardsBitsFromItsStatistics) {
  const int64_t rows = 37, dim = 75;
  const auto x = random_vector(size_t(rows * dim), 21, -4.f, 4.f);
  const auto w = random_vector(size_t(dim), 22, 0.5f, 1.5f), b = random_vector(size_t(dim), 23);
  std::vector<float> y(x.size()), again(x.size()), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  for (const float* gain : {w.data(), static_cast<const float*>(nullptr)}) {
    rmsnorm_forward(x.data(), gain, y.data(), rstd.data(), rows, dim, 1e-6f);
    std::fill(again.begin(), again.end(), -1.f);
    rmsnorm_apply(x.data(), gain, rstd.data(), again.data(), rows, dim);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(again[i]), std::bit_cast<uint32_t>(y[i])) << i;
    for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
      layernorm_forward(x.data(), gain, bias, y.data(), mean.data(), rstd.data(), rows, dim, 1e-5f);
      std::fill(again.begin(), again.end(), -1.f);
      layernorm_apply(x.data(), gain, bias, mean.data(), rstd.data(), again.data(), rows, dim);
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(again[i]), std::bit_cast<uint32_t>(y[i])) << i;
    }
  }
}

// Overwriting (QK-Norm's backward, the only writer of dq_raw and dk_raw) gives what accumulating
// into zeros gives, bit for bit, and never reads the buffer it writes (NaN here, as an unzeroed
// arena slot may hold); the weight gradient still accumulates.
TEST(NormKernel, RmsNormOverwriteEqualsAccumulatingIntoZeros) {
  const int64_t rows = 37, dim = 64;
  const auto x = random_vector(size_t(rows * dim), 21, -2.f, 2.f), w = random_vector(size_t(dim), 22, 0.5f, 1.5f);
  const auto dy = random_vector(x.size(), 23);
  std::vector<float> y(x.size()), rstd(static_cast<size_t>(rows));
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, dim, 1e-6f);
  std::vector<float> dx0(x.size(), 0.f), dx1(x.size(), std::nanf("")), dw0(size_t(dim), 0.f), dw1(size_t(dim), 0.f);
  rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx0.data(), dw0.data(), rows, dim);
  rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx1.data(), dw1.data(), rows, dim, GradWrite::Overwrite);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(dx0[i], dx1[i]) << i;
  for (size_t j = 0; j < dw0.size(); ++j) ASSERT_EQ(dw0[j], dw1[j]) << j;
  rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx1.data(), dw1.data(), rows, dim, GradWrite::Overwrite);
  for (size_t i = 0; i < x.size(); i += 7) ASSERT_EQ(dx0[i], dx1[i]) << i;  // overwritten again, not doubled
  for (size_t j = 0; j < dw0.size(); j += 7) EXPECT_FLOAT_EQ(dw1[j], 2.f * dw0[j]) << j;
}

}  // namespace
}  // namespace keel::kernels
