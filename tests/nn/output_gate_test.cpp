#include "keel/nn/output_gate.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "../kernels/gradient_check.hpp"

namespace keel::nn {
namespace {

using kernels::testing::dot;
using kernels::testing::expect_gradient;
using kernels::testing::random_vector;

// Qwen3NextAttention: q_proj(x).view(..., heads, 2·head_dim) chunked in two along the last dim.
TEST(OutputGate, SplitTakesEachHeadsQueryThenGate) {
  const int64_t n = 2, heads = 3, d = 4;
  std::vector<float> qg(size_t(n * heads * 2 * d));
  for (size_t i = 0; i < qg.size(); ++i) qg[i] = float(i);
  std::vector<float> q(size_t(n * heads * d)), g(q.size()), back(qg.size());
  split_query_gate(qg.data(), q.data(), g.data(), n, heads, d);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = 0; c < d; ++c) {
        const size_t base = size_t((t * heads + h) * 2 * d + c);
        EXPECT_EQ(q[size_t((t * heads + h) * d + c)], float(base));
        EXPECT_EQ(g[size_t((t * heads + h) * d + c)], float(base + size_t(d)));
      }
  merge_query_gate(q.data(), g.data(), back.data(), n, heads, d);
  EXPECT_EQ(back, qg);
}

TEST(OutputGate, ForwardIsAttentionTimesSigmoid) {
  const std::vector<float> a = {2.f, -1.f, 0.5f}, g = {0.f, 3.f, -2.f};
  std::vector<float> y(3);
  output_gate_forward(a.data(), g.data(), y.data(), 3);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(y[i], a[i] / (1 + std::exp(-double(g[i]))), 1e-7);
}

TEST(OutputGate, BackwardMatchesFiniteDifferences) {
  const int64_t count = 64;
  auto a = random_vector(size_t(count), 1, -2.f, 2.f);
  auto g = random_vector(size_t(count), 2, -4.f, 4.f);
  const auto w = random_vector(size_t(count), 3);
  std::vector<float> y(static_cast<size_t>(count)), da(y.size()), dg(y.size());
  auto loss = [&] {
    output_gate_forward(a.data(), g.data(), y.data(), count);
    return dot(y, w);
  };
  output_gate_backward(a.data(), g.data(), w.data(), da.data(), dg.data(), count);
  expect_gradient(a, da, loss, "dattn", 1e-3, 1e-4, 1e-3);
  expect_gradient(g, dg, loss, "dgate", 1e-3, 1e-4, 1e-3);
}

}  // namespace
}  // namespace keel::nn
