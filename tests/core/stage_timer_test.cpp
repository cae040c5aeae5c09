// The stage timer's GEMM shapes (`keel bench --json` "gemm_shapes"): each outermost GEMM call
// counted once under its form, bf16 flag and (m, n, k); the FLOPs they carry are the ones
// gemm_gflops_per_s divides; nothing is kept while the timer is off.
#include "keel/core/stage_timer.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "keel/kernels/gemm.hpp"

namespace keel {
namespace {

const stage_timer::GemmShape* find_shape(const stage_timer::Totals& t, const std::string& form, bool bf16, int64_t m,
                                         int64_t n, int64_t k) {
  for (const auto& s : t.gemm_shapes)
    if (std::string(s.form) == form && s.bf16 == bf16 && s.m == m && s.n == n && s.k == k) return &s;
  return nullptr;
}

TEST(StageTimer, GemmShapesCountEachOutermostCallOnce) {
  // A linear layer's three products at 64 tokens, 32 in, 48 out, W stored (out, in).
  const int64_t tokens = 64, in = 32, out = 48;
  std::vector<float> x(tokens * in, 0.5f), w(out * in, 0.25f), y(tokens * out), dy(tokens * out, 0.125f),
      dx(tokens * in), dw(out * in, 0.f);
  stage_timer::enable(true);
  for (int i = 0; i < 3; ++i)  // forward y = x·Wᵀ, three times
    kernels::gemm(false, true, tokens, out, in, 1.f, x.data(), in, w.data(), in, 0.f, y.data(), out);
  kernels::gemm(false, false, tokens, in, out, 1.f, dy.data(), out, w.data(), in, 0.f, dx.data(), in);  // dx = dy·W
  kernels::gemm(true, false, out, in, tokens, 1.f, dy.data(), out, x.data(), in, 1.f, dw.data(), in);   // dW += dyᵀ·x
  // bf16: gemm_bf16 runs gemm_bf16_words_b (native) or gemm's panels (portable) inside it: one
  // call of one shape, not two.
  kernels::gemm_bf16(false, true, tokens, out, in, 1.f, x.data(), in, w.data(), in, 0.f, y.data(), out);
  const stage_timer::Totals t = stage_timer::totals();
  stage_timer::enable(false);

  ASSERT_EQ(t.gemm_shapes.size(), 4u);
  const auto* forward = find_shape(t, "NT", false, tokens, out, in);
  const auto* input_grad = find_shape(t, "NN", false, tokens, in, out);
  const auto* weight_grad = find_shape(t, "TN", false, out, in, tokens);
  const auto* forward_bf16 = find_shape(t, "NT", true, tokens, out, in);
  ASSERT_NE(forward, nullptr);
  ASSERT_NE(input_grad, nullptr);
  ASSERT_NE(weight_grad, nullptr);
  ASSERT_NE(forward_bf16, nullptr);
  EXPECT_EQ(forward->calls, 3);
  EXPECT_EQ(input_grad->calls, 1);
  EXPECT_EQ(weight_grad->calls, 1);
  EXPECT_EQ(forward_bf16->calls, 1);

  // The shapes' FLOPs are exactly the ones counted for gemm_gflops_per_s; their time lies inside
  // the Gemm stage's (a shape's clock starts after the stage's and stops before it).
  double flops = 0, seconds = 0;
  for (size_t i = 0; i < t.gemm_shapes.size(); ++i) {
    const auto& s = t.gemm_shapes[i];
    flops += 2.0 * double(s.m) * double(s.n) * double(s.k) * double(s.calls);
    seconds += s.seconds;
    EXPECT_GT(s.seconds, 0.0);
    if (i > 0) {
      EXPECT_GE(t.gemm_shapes[i - 1].seconds, s.seconds);  // most time first
    }
  }
  EXPECT_EQ(flops, t.gemm_flops);
  EXPECT_LE(seconds, t.seconds[static_cast<size_t>(stage_timer::Stage::Gemm)]);

  // Off: a GEMM leaves nothing behind.
  kernels::gemm(false, true, tokens, out, in, 1.f, x.data(), in, w.data(), in, 0.f, y.data(), out);
  const stage_timer::Totals off = stage_timer::totals();
  EXPECT_TRUE(off.gemm_shapes.empty());
  EXPECT_EQ(off.gemm_flops, 0.0);
  // enable() starts from zero: what an earlier enabled stretch recorded is gone.
  stage_timer::enable(true);
  kernels::gemm(false, true, tokens, out, in, 1.f, x.data(), in, w.data(), in, 0.f, y.data(), out);
  ASSERT_EQ(stage_timer::totals().gemm_shapes.size(), 1u);
  stage_timer::enable(true);
  const stage_timer::Totals fresh = stage_timer::totals();
  stage_timer::enable(false);
  EXPECT_TRUE(fresh.gemm_shapes.empty());
  EXPECT_EQ(fresh.gemm_flops, 0.0);
}

}  // namespace
}  // namespace keel
