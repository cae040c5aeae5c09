#include "keel/kernels/linear.hpp"

#include <gtest/gtest.h>

#include "gradient_check.hpp"

namespace keel::kernels {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::random_vector;

void check_linear(bool w_in_out, bool bias) {
  const int64_t n = 5, in = 7, out = 3;
  auto x = random_vector(size_t(n * in), 10);
  auto w = random_vector(size_t(in * out), 11);
  auto b = random_vector(size_t(out), 12);
  const auto g = random_vector(size_t(n * out), 13);
  std::vector<float> y(size_t(n * out));
  const float* bp = bias ? b.data() : nullptr;
  auto loss = [&] {
    linear_forward(x.data(), w.data(), bp, y.data(), n, in, out, w_in_out);
    return dot(y, g);
  };
  // Forward against the definition.
  loss();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double acc = bias ? b[size_t(o)] : 0.0;
      for (int64_t c = 0; c < in; ++c)
        acc += double(x[size_t(i * in + c)]) * (w_in_out ? w[size_t(c * out + o)] : w[size_t(o * in + c)]);
      EXPECT_NEAR(y[size_t(i * out + o)], acc, 1e-5);
    }
  // Backward accumulates: start from a known non-zero value and subtract it afterwards.
  std::vector<float> dx(x.size(), 1.f), dw(w.size(), 1.f), db(b.size(), 1.f);
  linear_backward(x.data(), w.data(), g.data(), dx.data(), dw.data(), bias ? db.data() : nullptr, n, in, out, w_in_out);
  for (auto* v : {&dx, &dw, &db})
    for (float& e : *v) e -= 1.f;
  const std::string tag = w_in_out ? "in_out " : "out_in ";
  expect_gradient(x, dx, loss, tag + "dx");
  expect_gradient(w, dw, loss, tag + "dw");
  if (bias) expect_gradient(b, db, loss, tag + "db");
}

TEST(LinearKernel, GradientsMatchFiniteDifferencesPyTorchLayout) { check_linear(false, true); }
TEST(LinearKernel, GradientsMatchFiniteDifferencesConv1dLayout) { check_linear(true, true); }
TEST(LinearKernel, GradientsMatchFiniteDifferencesNoBias) { check_linear(false, false); }

TEST(LinearKernel, NullGradientsAreSkipped) {
  const int64_t n = 3, in = 4, out = 2;
  const auto x = random_vector(size_t(n * in), 1), w = random_vector(size_t(in * out), 2),
             g = random_vector(size_t(n * out), 3);
  std::vector<float> dw(w.size(), 0.f);
  linear_backward(x.data(), w.data(), g.data(), nullptr, dw.data(), nullptr, n, in, out);
  double s = 0;
  for (float v : dw) s += std::abs(v);
  EXPECT_GT(s, 0.0);
}

}  // namespace
}  // namespace keel::kernels
