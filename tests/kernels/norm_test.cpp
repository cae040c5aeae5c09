#include "keel/kernels/norm.hpp"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace keel::kernels
