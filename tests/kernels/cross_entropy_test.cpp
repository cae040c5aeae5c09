#include "keel/kernels/cross_entropy.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "gradient_check.hpp"

namespace keel::kernels {
namespace {

using testing::random_vector;

// Naive double-precision LM head: full logits, loss = grad_scale·(Σ CE + z·Σ lse²), gradients
// by the textbook softmax formula.
struct Naive {
  LmHeadLoss loss;
  std::vector<double> dh, dw;
};

Naive naive_ce(const std::vector<float>& h, const std::vector<float>& w, const std::vector<int32_t>& tg, int64_t n,
               int64_t c, int64_t vocab, float z_loss, float cap, float scale) {
  Naive r;
  r.dh.assign(size_t(n * c), 0);
  r.dw.assign(size_t(vocab * c), 0);
  std::vector<double> z(static_cast<size_t>(vocab)), raw(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < n; ++i) {
    if (tg[size_t(i)] < 0) continue;
    double zmax = -1e300;
    for (int64_t v = 0; v < vocab; ++v) {
      double acc = 0;
      for (int64_t e = 0; e < c; ++e) acc += double(h[size_t(i * c + e)]) * w[size_t(v * c + e)];
      raw[size_t(v)] = acc;
      z[size_t(v)] = cap > 0 ? cap * std::tanh(acc / cap) : acc;
      zmax = std::max(zmax, z[size_t(v)]);
    }
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(z[size_t(v)] - zmax);
    const double lse = zmax + std::log(sum);
    r.loss.ce_sum += lse - z[size_t(tg[size_t(i)])];
    r.loss.z_sum += lse * lse;
    ++r.loss.count;
    for (int64_t v = 0; v < vocab; ++v) {
      double g = std::exp(z[size_t(v)] - lse) * (1 + 2 * z_loss * lse) - (v == tg[size_t(i)] ? 1 : 0);
      if (cap > 0) g *= 1 - std::pow(std::tanh(raw[size_t(v)] / cap), 2);
      g *= scale;
      for (int64_t e = 0; e < c; ++e) {
        r.dh[size_t(i * c + e)] += g * w[size_t(v * c + e)];
        r.dw[size_t(v * c + e)] += g * h[size_t(i * c + e)];
      }
    }
  }
  return r;
}

struct CeCase {
  int64_t n, c, vocab;
  float z_loss, cap;
};

// Fused chunked kernel vs the naive one. Two cases run several chunks with a ragged last one:
// 270 rows at vocab 36,000 (chunks of 256, the floor) and 4,100 at vocab 2,048 (chunks of 4,096,
// the 8 Mi-logit budget), so rows past the first chunk, dw summed over chunks and a short last
// chunk are all reached.
TEST(CrossEntropyKernel, MatchesNaive) {
  const CeCase cases[] = {{9, 12, 37, 0.f, 0.f},          {9, 12, 37, 1e-3f, 0.f}, {6, 8, 50, 1e-2f, 5.f},
                          {270, 16, 36000, 1e-4f, 0.f}, {4100, 8, 2048, 0.f, 0.f}};
  for (const CeCase& cs : cases) {
    const auto h = random_vector(size_t(cs.n * cs.c), 1, -1.f, 1.f), w = random_vector(size_t(cs.vocab * cs.c), 2);
    std::vector<int32_t> tg(size_t(cs.n));
    for (int64_t i = 0; i < cs.n; ++i) tg[size_t(i)] = i % 4 == 1 ? -1 : int32_t((i * 7919) % cs.vocab);
    const float scale = 0.37f;
    std::vector<float> dh(h.size(), 0.f), dw(w.size(), 0.f);
    const LmHeadLoss got =
        lm_head_cross_entropy(h.data(), w.data(), tg.data(), cs.n, cs.c, cs.vocab, cs.z_loss, cs.cap, scale,
                              dh.data(), dw.data());
    const Naive want = naive_ce(h, w, tg, cs.n, cs.c, cs.vocab, cs.z_loss, cs.cap, scale);
    const std::string tag = "vocab=" + std::to_string(cs.vocab) + " z=" + std::to_string(cs.z_loss) +
                            " cap=" + std::to_string(cs.cap);
    EXPECT_EQ(got.count, want.loss.count) << tag;
    EXPECT_NEAR(got.ce_sum, want.loss.ce_sum, 1e-5 * std::abs(want.loss.ce_sum)) << tag;
    EXPECT_NEAR(got.z_sum, want.loss.z_sum, 1e-5 * std::abs(want.loss.z_sum)) << tag;
    for (size_t i = 0; i < dh.size(); ++i) ASSERT_NEAR(dh[i], want.dh[i], 1e-5) << tag << " dh " << i;
    for (size_t i = 0; i < dw.size(); ++i) ASSERT_NEAR(dw[i], want.dw[i], 1e-5) << tag << " dw " << i;
    // Ignored rows get no gradient.
    for (int64_t e = 0; e < cs.c; ++e) EXPECT_EQ(dh[size_t(1 * cs.c + e)], 0.f);
  }
}

TEST(CrossEntropyKernel, GradientsMatchFiniteDifferences) {
  for (const CeCase& cs : {CeCase{5, 7, 11, 0.f, 0.f}, CeCase{5, 7, 11, 0.05f, 0.f}, CeCase{5, 7, 11, 0.05f, 1.5f}}) {
    const int64_t n = cs.n, c = cs.c, vocab = cs.vocab;
    auto h = random_vector(size_t(n * c), 3, -1.5f, 1.5f), w = random_vector(size_t(vocab * c), 4, -1.5f, 1.5f);
    const std::vector<int32_t> tg = {3, -1, 10, 0, 3};
    const float scale = 0.5f;
    auto loss = [&] {
      const LmHeadLoss l =
          lm_head_cross_entropy(h.data(), w.data(), tg.data(), n, c, vocab, cs.z_loss, cs.cap, 0.f, nullptr, nullptr);
      return double(scale) * (l.ce_sum + double(cs.z_loss) * l.z_sum);
    };
    std::vector<float> dh(h.size(), 0.f), dw(w.size(), 0.f);
    const LmHeadLoss l =
        lm_head_cross_entropy(h.data(), w.data(), tg.data(), n, c, vocab, cs.z_loss, cs.cap, scale, dh.data(), dw.data());
    EXPECT_EQ(l.count, 4);
    const std::string tag = "z=" + std::to_string(cs.z_loss) + " cap=" + std::to_string(cs.cap) + " ";
    testing::expect_gradient(h, dh, loss, tag + "dh", 1e-3, 1e-3, 1e-2, 64);
    testing::expect_gradient(w, dw, loss, tag + "dw", 1e-3, 1e-3, 1e-2, 80);
  }
}

TEST(CrossEntropyKernel, LogitsMatchGemmAndCap) {
  const int64_t n = 3, c = 5, vocab = 7;
  const auto h = random_vector(size_t(n * c), 5, -3.f, 3.f), w = random_vector(size_t(vocab * c), 6, -3.f, 3.f);
  std::vector<float> logits(size_t(n * vocab));
  lm_head_logits(h.data(), w.data(), logits.data(), n, c, vocab, 2.f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t v = 0; v < vocab; ++v) {
      double acc = 0;
      for (int64_t e = 0; e < c; ++e) acc += double(h[size_t(i * c + e)]) * w[size_t(v * c + e)];
      EXPECT_NEAR(logits[size_t(i * vocab + v)], 2 * std::tanh(acc / 2), 1e-5);
    }
}

}  // namespace
}  // namespace keel::kernels
