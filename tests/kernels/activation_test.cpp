#include "keel/kernels/activation.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gradient_check.hpp"

namespace keel::kernels {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::random_vector;

const Activation kAll[] = {Activation::Silu, Activation::Gelu, Activation::GeluTanh, Activation::Relu};

// Inputs kept away from 0 so ReLU's kink is never straddled by the finite difference.
std::vector<float> away_from_zero(size_t n, uint32_t seed) {
  auto v = random_vector(n, seed, -3.f, 3.f);
  for (float& x : v)
    if (std::abs(x) < 0.05f) x += 0.2f;
  return v;
}

// Four points, and a grid of 4,099 from -20 to 20: long enough that the kernels' vectorized loop
// bodies (fast_exp and fast_tanh as the compiler vectorizes them, which differs between AVX2 and
// AVX-512 code) compute most of it, not the scalar tail, and far enough out that the exps
// saturate.
TEST(ActivationKernel, ForwardMatchesDefinitions) {
  std::vector<float> x = {-2.f, -0.5f, 0.3f, 1.7f};
  for (int i = 0; i < 4099; ++i) x.push_back(-20.f + 40.f * float(i) / 4098.f);
  std::vector<float> y(x.size());
  for (Activation a : kAll) {
    activation_forward(x.data(), y.data(), int64_t(x.size()), a);
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = x[i];
      double want = 0;
      switch (a) {
        case Activation::Silu: want = v / (1 + std::exp(-v)); break;
        case Activation::Gelu: want = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); break;
        case Activation::GeluTanh:
          want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
          break;
        case Activation::Relu: want = v > 0 ? v : 0; break;
      }
      ASSERT_NEAR(y[i], want, 1e-6 + 1e-6 * std::abs(want)) << int(a) << " at " << v;
    }
  }
}

// The tanh GELU is computed as x·σ(2u) (activation.cpp); its derivative against the tanh form's,
// in double, over the grid of the forward's test.
TEST(ActivationKernel, GeluTanhDerivativeMatchesDefinition) {
  std::vector<float> x;
  for (int i = 0; i < 4099; ++i) x.push_back(-20.f + 40.f * float(i) / 4098.f);
  const std::vector<float> ones(x.size(), 1.f);
  std::vector<float> dx(x.size(), 7.f);
  activation_backward(x.data(), ones.data(), dx.data(), int64_t(x.size()), Activation::GeluTanh,
                      GradWrite::Overwrite);
  const double c = std::sqrt(2 / M_PI), a = 0.044715;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], t = std::tanh(c * (v + a * v * v * v));
    const double want = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * a * v * v);
    ASSERT_NEAR(dx[i], want, 2e-6 + 2e-6 * std::abs(want)) << "at " << v;
  }
}

TEST(ActivationKernel, BackwardMatchesFiniteDifferences) {
  for (Activation a : kAll) {
    auto x = away_from_zero(41, 1);
    const auto g = random_vector(x.size(), 2);
    std::vector<float> y(x.size()), dx(x.size(), 0.f);
    auto loss = [&] {
      activation_forward(x.data(), y.data(), int64_t(x.size()), a);
      return dot(y, g);
    };
    activation_backward(x.data(), g.data(), dx.data(), int64_t(x.size()), a);
    expect_gradient(x, dx, loss, "act " + std::to_string(int(a)), 1e-3);
  }
}

TEST(ActivationKernel, GatedBackwardMatchesFiniteDifferences) {
  for (Activation a : kAll) {
    auto gate = away_from_zero(29, 3);
    auto up = random_vector(gate.size(), 4, -2.f, 2.f);
    const auto g = random_vector(gate.size(), 5);
    std::vector<float> h(gate.size()), dgate(gate.size(), 0.f), dup(gate.size(), 0.f);
    auto loss = [&] {
      gated_forward(gate.data(), up.data(), h.data(), int64_t(h.size()), a);
      return dot(h, g);
    };
    gated_backward(gate.data(), up.data(), g.data(), dgate.data(), dup.data(), int64_t(h.size()), a);
    expect_gradient(gate, dgate, loss, "gated dgate " + std::to_string(int(a)), 1e-3);
    expect_gradient(up, dup, loss, "gated dup " + std::to_string(int(a)), 1e-3);
  }
}

// Overwrite writes what Accumulate adds into zeros, bit for bit, and never reads the buffer it
// writes (it starts as NaN here, as an unzeroed arena slot may).
TEST(ActivationKernel, OverwriteEqualsAccumulatingIntoZerosAndIgnoresOldContents) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Activation a : kAll) {
    SCOPED_TRACE(int(a));
    const auto gate = away_from_zero(1000, 6);
    const auto up = random_vector(gate.size(), 7, -2.f, 2.f), dh = random_vector(gate.size(), 8);
    std::vector<float> dg0(gate.size(), 0.f), du0(gate.size(), 0.f), dg1(gate.size(), nan), du1(gate.size(), nan);
    gated_backward(gate.data(), up.data(), dh.data(), dg0.data(), du0.data(), int64_t(gate.size()), a);
    gated_backward(gate.data(), up.data(), dh.data(), dg1.data(), du1.data(), int64_t(gate.size()), a,
                   GradWrite::Overwrite);
    std::vector<float> dx0(gate.size(), 0.f), dx1(gate.size(), nan);
    activation_backward(gate.data(), dh.data(), dx0.data(), int64_t(gate.size()), a);
    activation_backward(gate.data(), dh.data(), dx1.data(), int64_t(gate.size()), a, GradWrite::Overwrite);
    for (size_t i = 0; i < gate.size(); ++i) {
      ASSERT_EQ(dg0[i], dg1[i]) << i;
      ASSERT_EQ(du0[i], du1[i]) << i;
      ASSERT_EQ(dx0[i], dx1[i]) << i;
    }
    // Accumulate still adds: a second call doubles the first.
    gated_backward(gate.data(), up.data(), dh.data(), dg0.data(), du0.data(), int64_t(gate.size()), a);
    for (size_t i = 0; i < gate.size(); i += 97) EXPECT_FLOAT_EQ(dg0[i], 2.f * dg1[i]) << i;
  }
}

// Overwriting, the input gradient may take dh's own place (the MLP's backward keeps one wide
// buffer fewer): the same bits as into a separate buffer, for every activation and for a length
// with a vector tail.
TEST(ActivationKernel, OverwriteInPlaceOfTheOutputGradientMatchesASeparateBuffer) {
  for (Activation a : kAll) {
    SCOPED_TRACE(int(a));
    const auto gate = away_from_zero(1003, 9);
    const auto up = random_vector(gate.size(), 10, -2.f, 2.f), dh = random_vector(gate.size(), 11);
    const int64_t n = int64_t(gate.size());
    std::vector<float> dg(gate.size()), du(gate.size()), dg_in(gate.size()), du_in = dh;
    gated_backward(gate.data(), up.data(), dh.data(), dg.data(), du.data(), n, a, GradWrite::Overwrite);
    gated_backward(gate.data(), up.data(), du_in.data(), dg_in.data(), du_in.data(), n, a, GradWrite::Overwrite);
    std::vector<float> dx(gate.size()), dx_in = dh;
    activation_backward(gate.data(), dh.data(), dx.data(), n, a, GradWrite::Overwrite);
    activation_backward(gate.data(), dx_in.data(), dx_in.data(), n, a, GradWrite::Overwrite);
    for (size_t i = 0; i < gate.size(); ++i) {
      ASSERT_EQ(dg[i], dg_in[i]) << i;
      ASSERT_EQ(du[i], du_in[i]) << i;
      ASSERT_EQ(dx[i], dx_in[i]) << i;
    }
  }
}

}  // namespace
// The backward that recomputes the forward's output in the same pass gives what the forward
// kernel and the overwriting backward kernel give, bit for bit, into separate buffers and in the
// places the MLP uses (dup in dh's, dgate in gate's), at a length with a vector tail.
TEST(ActivationKernel, BackwardWithTheOutputMatchesForwardThenBackward) {
  for (Activation a : kAll) {
    SCOPED_TRACE(int(a));
    const auto gate = away_from_zero(1003, 12);
    const auto up = random_vector(gate.size(), 13, -2.f, 2.f), dh = random_vector(gate.size(), 14);
    const int64_t n = int64_t(gate.size());
    std::vector<float> h(gate.size()), dg(gate.size()), du(gate.size());
    gated_forward(gate.data(), up.data(), h.data(), n, a);
    gated_backward(gate.data(), up.data(), dh.data(), dg.data(), du.data(), n, a, GradWrite::Overwrite);
    std::vector<float> h2(gate.size()), dg2(gate.size()), du2(gate.size());
    gated_backward_and_output(gate.data(), up.data(), dh.data(), h2.data(), dg2.data(), du2.data(), n, a);
    std::vector<float> h3(gate.size()), gate_in = gate, dh_in = dh;
    gated_backward_and_output(gate_in.data(), up.data(), dh_in.data(), h3.data(), gate_in.data(), dh_in.data(), n, a);
    std::vector<float> y(gate.size()), dx(gate.size());
    activation_forward(gate.data(), y.data(), n, a);
    activation_backward(gate.data(), dh.data(), dx.data(), n, a, GradWrite::Overwrite);
    std::vector<float> y2(gate.size()), dx_in = dh;
    activation_backward_and_output(gate.data(), dx_in.data(), y2.data(), dx_in.data(), n, a);
    for (size_t i = 0; i < gate.size(); ++i) {
      ASSERT_EQ(h[i], h2[i]) << i;
      ASSERT_EQ(dg[i], dg2[i]) << i;
      ASSERT_EQ(du[i], du2[i]) << i;
      ASSERT_EQ(h[i], h3[i]) << i;
      ASSERT_EQ(dg[i], gate_in[i]) << i;
      ASSERT_EQ(du[i], dh_in[i]) << i;
      ASSERT_EQ(y[i], y2[i]) << i;
      ASSERT_EQ(dx[i], dx_in[i]) << i;
    }
  }
}

}  // namespace keel::kernels
