// QK-Norm on its own: each head's query and key vectors are RMS-normalized with one shared gain
// per dimension (Qwen3's q_norm / k_norm), or each token's whole projection with one gain per
// element (OLMo 2's full width), and the backward matches central differences for the
// projections and both gains in either form.
#include "keel/nn/qk_norm.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "../kernels/gradient_check.hpp"
#include "keel/arch/families.hpp"

namespace keel::nn {
namespace {

using keel::kernels::testing::dot;
using keel::kernels::testing::expect_gradient;
using keel::kernels::testing::random_vector;

constexpr int64_t kTokens = 3, kHeads = 4, kKvHeads = 2, kDim = 8;
constexpr float kEps = 1e-6f;

struct Harness {
  ParameterStore store;
  std::optional<QkNorm> norm;
  Arena arena;
  int64_t q_width, k_width;
  explicit Harness(bool full_width = false)
      : q_width(full_width ? kHeads * kDim : kDim), k_width(full_width ? kKvHeads * kDim : kDim) {
    norm.emplace(store, *arch::family_row(arch::Family::Qwen3).names, 2, kHeads, kKvHeads, kDim, kEps, full_width);
    store.finalize();
    const auto gains = random_vector(size_t(q_width + k_width), 5, 0.5f, 1.5f);
    set_gains(gains);
  }
  // Both gains as one vector [q_norm | k_norm], and back.
  void set_gains(const std::vector<float>& g) {
    std::copy(g.begin(), g.begin() + q_width, store.data("model.layers.2.self_attn.q_norm.weight"));
    std::copy(g.begin() + q_width, g.end(), store.data("model.layers.2.self_attn.k_norm.weight"));
  }
  std::vector<float> gains(bool grad) {
    const float* q = grad ? store.grad("model.layers.2.self_attn.q_norm.weight") : q_gain();
    const float* k = grad ? store.grad("model.layers.2.self_attn.k_norm.weight") : k_gain();
    std::vector<float> g(q, q + q_width);
    g.insert(g.end(), k, k + k_width);
    return g;
  }
  const float* q_gain() { return store.data("model.layers.2.self_attn.q_norm.weight"); }
  const float* k_gain() { return store.data("model.layers.2.self_attn.k_norm.weight"); }
};

TEST(QkNorm, RegistersTheFamilysGainsByRole) {
  Harness h;
  const ParamInfo* q = h.store.find({arch::TensorKind::QNorm, arch::TensorPart::Weight, 2});
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->name, "model.layers.2.self_attn.q_norm.weight");
  EXPECT_EQ(q->shape, std::vector<int64_t>{kDim});
  EXPECT_EQ(q->init, Init::Ones);
  EXPECT_FALSE(q->weight_decay);
  EXPECT_FALSE(q->matrix);
}

TEST(QkNorm, NormalizesEveryHeadVectorWithTheSharedGain) {
  Harness h;
  const auto q_raw = random_vector(size_t(kTokens * kHeads * kDim), 1, -3.f, 3.f);
  const auto k_raw = random_vector(size_t(kTokens * kKvHeads * kDim), 2, -3.f, 3.f);
  std::vector<float> q(q_raw.size()), k(k_raw.size());
  h.norm->forward(h.store, h.arena, q_raw.data(), k_raw.data(), q.data(), k.data(), kTokens);
  auto check = [&](const std::vector<float>& raw, const std::vector<float>& out, const float* gain, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r) {
      double ms = 0;
      for (int64_t c = 0; c < kDim; ++c) ms += double(raw[size_t(r * kDim + c)]) * raw[size_t(r * kDim + c)];
      const double inv = 1.0 / std::sqrt(ms / kDim + kEps);
      for (int64_t c = 0; c < kDim; ++c)
        EXPECT_NEAR(out[size_t(r * kDim + c)], raw[size_t(r * kDim + c)] * inv * gain[c], 1e-5) << r << " " << c;
    }
  };
  check(q_raw, q, h.q_gain(), kTokens * kHeads);
  check(k_raw, k, h.k_gain(), kTokens * kKvHeads);
}

class QkNormWidths : public ::testing::TestWithParam<bool> {};

TEST(QkNorm, FullWidthNormalizesEachTokensWholeProjection) {
  // OLMo 2: one RMS over all heads of a token's q (4 x 8 = 32 values) and of its k (2 x 8).
  Harness h(/*full_width=*/true);
  EXPECT_EQ(h.store.find({arch::TensorKind::QNorm, arch::TensorPart::Weight, 2})->shape,
            std::vector<int64_t>{kHeads * kDim});
  EXPECT_EQ(h.store.find({arch::TensorKind::KNorm, arch::TensorPart::Weight, 2})->shape,
            std::vector<int64_t>{kKvHeads * kDim});
  const auto q_raw = random_vector(size_t(kTokens * kHeads * kDim), 1, -3.f, 3.f);
  const auto k_raw = random_vector(size_t(kTokens * kKvHeads * kDim), 2, -3.f, 3.f);
  std::vector<float> q(q_raw.size()), k(k_raw.size());
  h.norm->forward(h.store, h.arena, q_raw.data(), k_raw.data(), q.data(), k.data(), kTokens);
  auto check = [&](const std::vector<float>& raw, const std::vector<float>& out, const float* gain, int64_t width) {
    for (int64_t t = 0; t < kTokens; ++t) {
      double ms = 0;
      for (int64_t c = 0; c < width; ++c) ms += double(raw[size_t(t * width + c)]) * raw[size_t(t * width + c)];
      const double inv = 1.0 / std::sqrt(ms / static_cast<double>(width) + kEps);
      for (int64_t c = 0; c < width; ++c)
        EXPECT_NEAR(out[size_t(t * width + c)], raw[size_t(t * width + c)] * inv * gain[c], 1e-5) << t << " " << c;
    }
  };
  check(q_raw, q, h.q_gain(), kHeads * kDim);
  check(k_raw, k, h.k_gain(), kKvHeads * kDim);
}

TEST_P(QkNormWidths, BackwardMatchesFiniteDifferences) {
  Harness h(GetParam());
  auto q_raw = random_vector(size_t(kTokens * kHeads * kDim), 3, -2.f, 2.f);
  auto k_raw = random_vector(size_t(kTokens * kKvHeads * kDim), 4, -2.f, 2.f);
  const auto wq = random_vector(q_raw.size(), 6), wk = random_vector(k_raw.size(), 7);
  // Loss = <wq, q> + <wk, k>, so dq = wq and dk = wk.
  auto loss = [&] {
    std::vector<float> q(q_raw.size()), k(k_raw.size());
    Arena a;
    h.norm->forward(h.store, a, q_raw.data(), k_raw.data(), q.data(), k.data(), kTokens);
    return dot(q, wq) + dot(k, wk);
  };
  std::vector<float> q(q_raw.size()), k(k_raw.size()), dq_raw(q_raw.size(), 0.f), dk_raw(k_raw.size(), 0.f);
  const QkNorm::Saved saved = h.norm->forward(h.store, h.arena, q_raw.data(), k_raw.data(), q.data(), k.data(), kTokens);
  h.store.zero_grad();
  h.norm->backward(h.store, saved, wq.data(), wk.data(), dq_raw.data(), dk_raw.data(), kTokens);
  expect_gradient(q_raw, dq_raw, loss, "q_raw");
  expect_gradient(k_raw, dk_raw, loss, "k_raw");
  std::vector<float> gains = h.gains(false);
  const std::vector<float> dgains = h.gains(true);
  auto gain_loss = [&] {
    h.set_gains(gains);
    return loss();
  };
  expect_gradient(gains, dgains, gain_loss, "q_norm and k_norm gains");
}

INSTANTIATE_TEST_SUITE_P(QkNorm, QkNormWidths, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "FullWidth" : "PerHead"; });

}  // namespace
}  // namespace keel::nn
