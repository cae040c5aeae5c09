// MoE router: the selection rules of each family on hand-made scores, and the backward from the
// combine weights to the logits against central differences (selection held fixed).
#include "keel/kernels/router.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "gradient_check.hpp"

namespace keel::kernels {
namespace {

using testing::random_vector;

float logit_of(float s) { return std::log(s / (1.0f - s)); }

TEST(Router, SoftmaxTopKRenormalizes) {
  RouterConfig c{RouterScore::Softmax, 4, 2, true};
  const float z[4] = {0.1f, 2.0f, -1.0f, 1.0f};
  float p[4], w[2];
  int32_t idx[2];
  router_forward(c, z, nullptr, p, idx, w, 1);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  const double e1 = std::exp(2.0), e3 = std::exp(1.0);
  EXPECT_NEAR(w[0], e1 / (e1 + e3), 1e-6);
  EXPECT_NEAR(w[1], e3 / (e1 + e3), 1e-6);
  c.normalize = false;  // Qwen3-MoE with norm_topk_prob = false: the raw softmax probabilities
  router_forward(c, z, nullptr, p, idx, w, 1);
  const double sum = std::exp(0.1) + e1 + std::exp(-1.0) + e3;
  EXPECT_NEAR(w[0], e1 / sum, 1e-6);
  EXPECT_NEAR(w[1], e3 / sum, 1e-6);
  EXPECT_NEAR(router_entropy(c, p, 1), [&] {
    double h = 0;
    for (double e : {std::exp(0.1), e1, std::exp(-1.0), e3}) h -= e / sum * std::log(e / sum);
    return h;
  }(), 1e-6);
}

TEST(Router, SoftmaxGroupLimitedGreedyRanksGroupsByTheirBestExpert) {
  // DeepSeek-V2's group_limited_greedy: 8 experts in 4 groups of 2, keep 1 group, top-2, scale 16.
  RouterConfig c{RouterScore::Softmax, 8, 2, false, 16.f, 4, 1};
  //                          g0         g1         g2         g3
  const float z[8] = {2.0f, -3.0f, 1.9f, 1.8f, 0.0f, 0.0f, -1.f, -1.f};
  // Group maxima: g0 2.0 beats g1 1.9, although g1's two experts sum higher (the top-2 sum of V3
  // would pick g1). Inside g0 the second choice is expert 1, however small its probability.
  float p[8], w[2];
  int32_t idx[2];
  router_forward(c, z, nullptr, p, idx, w, 1);
  double sum = 0;
  for (float x : z) sum += std::exp(double(x));
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 1);
  EXPECT_NEAR(w[0], 16 * std::exp(2.0) / sum, 1e-5);
  EXPECT_NEAR(w[1], 16 * std::exp(-3.0) / sum, 1e-6);
  // greedy (n_group 1): the two best overall, experts 0 and 2; weights are probabilities, not renormalized.
  c.n_group = c.topk_group = 1;
  router_forward(c, z, nullptr, p, idx, w, 1);
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 2);
  EXPECT_NEAR(w[1], 16 * std::exp(1.9) / sum, 1e-5);
}

TEST(Router, SigmoidGroupLimitedWithBiasForSelectionOnly) {
  // 8 experts in 4 groups of 2, keep 2 groups, top-2, normalized, scale 2.5.
  RouterConfig c{RouterScore::Sigmoid, 8, 2, true, 2.5f, 4, 2};
  //                 g0          g1          g2          g3
  const float s[8] = {0.90f, 0.10f, 0.60f, 0.55f, 0.70f, 0.05f, 0.30f, 0.20f};
  // Group scores (sum of top-2): 1.00, 1.15, 0.75, 0.50 -> groups 1 and 0. Expert 4 (0.70, the
  // second best score) sits in group 2 and is not reachable: top-2 is {0, 2}.
  float z[8];
  for (int e = 0; e < 8; ++e) z[e] = logit_of(s[e]);
  float p[8], w[2];
  int32_t idx[2];
  router_forward(c, z, nullptr, p, idx, w, 1);
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 2);
  EXPECT_NEAR(w[0], 2.5 * 0.90 / 1.50, 1e-5);
  EXPECT_NEAR(w[1], 2.5 * 0.60 / 1.50, 1e-5);
  // A bias on expert 3 lifts it above expert 2 for selection; the weight still uses its score.
  float bias[8] = {0, 0, 0, 0.1f, 0, 0, 0, 0};
  router_forward(c, z, bias, p, idx, w, 1);
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 3);
  EXPECT_NEAR(w[1], 2.5 * 0.55 / 1.45, 1e-5);
  // Without group limits expert 4 wins second place.
  c.n_group = 1;
  c.topk_group = 1;
  router_forward(c, z, nullptr, p, idx, w, 1);
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 4);
  // No normalization: the scores times the scale.
  c.normalize = false;
  router_forward(c, z, nullptr, p, idx, w, 1);
  EXPECT_NEAR(w[0], 2.5 * 0.90, 1e-5);
  EXPECT_NEAR(w[1], 2.5 * 0.70, 1e-5);
}

struct RouterCase {
  const char* name;
  RouterConfig config;
};

class RouterBackward : public ::testing::TestWithParam<RouterCase> {};

TEST_P(RouterBackward, MatchesFiniteDifferences) {
  const RouterConfig c = GetParam().config;
  const int64_t n = 5, E = c.experts, k = c.top_k;
  auto logits = random_vector(static_cast<size_t>(n * E), 3, -2.f, 2.f);
  auto bias = random_vector(static_cast<size_t>(E), 4, -0.05f, 0.05f);
  auto g = random_vector(static_cast<size_t>(n * k), 5);
  std::vector<float> p(logits.size()), w(g.size());
  std::vector<int32_t> idx(g.size());
  const float* b = c.score == RouterScore::Sigmoid ? bias.data() : nullptr;
  router_forward(c, logits.data(), b, p.data(), idx.data(), w.data(), n);
  const auto chosen = idx;
  std::vector<float> dlogits(logits.size(), 0.f);
  router_backward(c, p.data(), idx.data(), w.data(), g.data(), dlogits.data(), n);
  // Central differences on every logit whose probe keeps the selection (the loss has a kink
  // where it changes); at most a few probes may be skipped.
  const double eps = 1e-3;
  int skipped = 0;
  double norm = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float old = logits[i];
    auto at = [&](double v, bool& same) {
      logits[i] = static_cast<float>(v);
      std::vector<float> p2(p.size()), w2(w.size());
      std::vector<int32_t> i2(idx.size());
      router_forward(c, logits.data(), b, p2.data(), i2.data(), w2.data(), n);
      same = same && i2 == chosen;
      return testing::dot(w2, g);
    };
    bool same = true;
    const double lp = at(old + eps, same), lm = at(old - eps, same);
    logits[i] = old;
    if (!same) {
      ++skipped;
      continue;
    }
    const double fd = (lp - lm) / (2 * eps);
    EXPECT_NEAR(dlogits[i], fd, 1e-3 + 1e-2 * std::fabs(fd)) << GetParam().name << " logit " << i;
    norm += std::fabs(dlogits[i]);
  }
  EXPECT_LE(skipped, static_cast<int>(logits.size()) / 10) << "too many probes changed the selection";
  EXPECT_GT(norm, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Routers, RouterBackward,
    ::testing::Values(RouterCase{"mixtral_softmax_renorm", {RouterScore::Softmax, 4, 2, true}},
                      RouterCase{"qwen3_softmax_raw", {RouterScore::Softmax, 8, 3, false}},
                      RouterCase{"deepseek_sigmoid_grouped", {RouterScore::Sigmoid, 8, 2, true, 2.5f, 4, 2}},
                      RouterCase{"sigmoid_unnormalized", {RouterScore::Sigmoid, 6, 2, false, 1.5f, 1, 1}},
                      RouterCase{"deepseek_v2_softmax_grouped", {RouterScore::Softmax, 8, 2, false, 16.f, 4, 2}}),
    [](const ::testing::TestParamInfo<RouterCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace keel::kernels
