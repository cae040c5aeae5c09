#include "keel/kernels/softcap.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "gradient_check.hpp"

namespace keel::kernels {
namespace {

TEST(SoftcapKernel, ForwardAndGradientMatch) {
  const float cap = 5.f;
  auto x = testing::random_vector(37, 1, -15.f, 15.f);
  const auto g = testing::random_vector(x.size(), 2);
  std::vector<float> y(x.size()), dx(x.size(), 0.f);
  auto loss = [&] {
    softcap_forward(x.data(), y.data(), int64_t(x.size()), cap);
    return testing::dot(y, g);
  };
  loss();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], cap * std::tanh(double(x[i]) / cap), 1e-5);
  softcap_backward(x.data(), g.data(), dx.data(), int64_t(x.size()), cap);
  testing::expect_gradient(x, dx, loss, "softcap dx", 1e-2);
}

}  // namespace
}  // namespace keel::kernels
