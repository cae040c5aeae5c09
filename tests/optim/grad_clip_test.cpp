#include "keel/optim/grad_clip.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../kernels/gradient_check.hpp"
#include "keel/nn/parameters.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/muon.hpp"

namespace keel::optim {
namespace {

std::vector<float> gradients(size_t n, uint32_t seed) {
  std::vector<float> g = kernels::testing::random_vector(n, seed);
  for (size_t i = 0; i < n; i += 7) g[i] *= 100.f;  // a few large entries
  return g;
}

// sum_of_squares against one long-double running sum, for sizes around its 65,536-value chunks
// (none, one partial, exactly one, one and a value, several and a tail), on teams of 1, 2 and 3
// threads: the same bits on every team, within 1e-12 of the running sum.
TEST(GradClip, SumOfSquaresMatchesARunningSumOnEveryTeam) {
  const int saved_threads = omp_get_max_threads();
  for (size_t n : {size_t(0), size_t(1), size_t(65535), size_t(65536), size_t(65537), size_t(3 * 65536 + 17)}) {
    const std::vector<float> g = gradients(n, uint32_t(n) + 1);
    long double want = 0;
    for (float x : g) want += static_cast<long double>(x) * x;
    double first = 0;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      const double got = sum_of_squares(g);
      const std::string tag = "n=" + std::to_string(n) + " threads=" + std::to_string(threads);
      EXPECT_NEAR(got, double(want), 1e-12 * double(want)) << tag;
      if (threads == 1) first = got;
      else EXPECT_EQ(std::memcmp(&got, &first, sizeof got), 0) << tag << ": not the one-thread bits";
    }
  }
  omp_set_num_threads(saved_threads);
}

// clip_grad_norm as torch.nn.utils.clip_grad_norm_: returns the norm before clipping; above
// max_norm every gradient is scaled by max_norm / (norm + 1e-6); at or below, nothing moves.
TEST(GradClip, ScalesOnlyAboveTheMaxNorm) {
  const std::vector<float> g0 = gradients(70000, 5);
  const double norm = std::sqrt(sum_of_squares(g0));
  std::vector<float> g = g0;
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 2 * norm), norm);
  EXPECT_EQ(std::memcmp(g.data(), g0.data(), g.size() * sizeof(float)), 0);

  const double max_norm = norm / 8;
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, max_norm), norm);
  const float coef = static_cast<float>(max_norm / (norm + 1e-6));
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], g0[i] * coef) << i;
  EXPECT_NEAR(std::sqrt(sum_of_squares(g)), max_norm, 1e-6 * max_norm);
}

// The trainer clips by handing the optimizer the clip's factor (clip_scale), which multiplies each
// gradient as the update reads it, instead of scaling the stored gradients in a pass of their own.
// Two steps of AdamW and of Muon (its matrices, and AdamW for the rest; with and without Nesterov)
// must leave the same bits as clip_grad_norm followed by a plain step, and the store's gradients
// untouched.
nn::ParameterStore clip_store() {
  nn::ParameterStore store;
  store.add("model.layers.0.mlp.up_proj.weight", {24, 40}, nn::Init::Normal, true, true);
  store.add("lm_head.weight", {50, 24}, nn::Init::Normal, true, false);
  store.add("model.norm.weight", {24}, nn::Init::Ones, false);
  store.finalize();
  store.initialize(3, 0.5f);
  return store;
}

template <typename MakeOptimizer>
void expect_folded_clip_matches_in_place(MakeOptimizer make, const std::string& tag) {
  nn::ParameterStore in_place = clip_store(), folded = clip_store();
  auto opt_in_place = make(in_place), opt_folded = make(folded);
  for (int step = 0; step < 2; ++step) {
    const std::vector<float> g = gradients(in_place.grads().size(), 40u + uint32_t(step));
    std::copy(g.begin(), g.end(), in_place.grads().begin());
    std::copy(g.begin(), g.end(), folded.grads().begin());
    const double norm = std::sqrt(sum_of_squares(g));
    const double max_norm = norm / (3 + step);  // the clip acts on both steps
    const float scale = clip_scale(norm, max_norm);
    ASSERT_LT(scale, 0.5f) << tag;
    clip_grad_norm(in_place.grads(), max_norm);
    opt_in_place->step(in_place, 0.01f);
    opt_folded->step(folded, 0.01f, scale);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(folded.values()[i], in_place.values()[i]) << tag << " step " << step << " value " << i;
      ASSERT_EQ(folded.grads()[i], g[i]) << tag << ": the folded clip wrote the gradients";
    }
  }
}

TEST(GradClip, ScaleFoldedIntoTheOptimizerMatchesClippingInPlace) {
  EXPECT_EQ(clip_scale(2.0, 4.0), 1.0f);
  EXPECT_EQ(clip_scale(std::nan(""), 1.0), 1.0f);
  EXPECT_EQ(clip_scale(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  AdamWConfig adamw;
  adamw.weight_decay = 0.1f;
  expect_folded_clip_matches_in_place([&](nn::ParameterStore& s) { return std::make_unique<AdamW>(s, adamw); },
                                      "adamw");
  for (bool nesterov : {true, false}) {
    MuonConfig muon;
    muon.nesterov = nesterov;
    muon.weight_decay = 0.1f;
    expect_folded_clip_matches_in_place([&](nn::ParameterStore& s) { return std::make_unique<Muon>(s, muon); },
                                        nesterov ? "muon nesterov" : "muon");
  }
}

}  // namespace
}  // namespace keel::optim
