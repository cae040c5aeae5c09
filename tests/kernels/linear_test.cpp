#include "keel/kernels/linear.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gradient_check.hpp"
#include "keel/core/bf16.hpp"
#include "keel/kernels/gemm.hpp"
#include "keel/kernels/precision.hpp"

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

// The forward overwrites y: what was there before (NaN here) plays no part, with or without a
// bias, over a product large enough to be cut into panels.
TEST(LinearKernel, ForwardIgnoresWhatTheOutputHeld) {
  const int64_t n = 700, in = 40, out = 1100;
  const auto x = random_vector(size_t(n * in), 61), w = random_vector(size_t(out * in), 62),
             b = random_vector(size_t(out), 63);
  for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
    std::vector<float> y(size_t(n * out), std::numeric_limits<float>::quiet_NaN());
    linear_forward(x.data(), w.data(), bias, y.data(), n, in, out);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < out; ++o) {
        double acc = bias != nullptr ? double(bias[o]) : 0.0;
        for (int64_t c = 0; c < in; ++c) acc += double(x[size_t(i * in + c)]) * double(w[size_t(o * in + c)]);
        const double diff = std::abs(double(y[size_t(i * out + o)]) - acc);
        worst = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(worst, diff);
      }
    EXPECT_LT(worst, 1e-5) << (bias != nullptr ? "with bias" : "without");
  }
}

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

// A column slice of a wider Conv1D weight (GPT-2's c_attn: q, k, v from one (in, 3·out) matrix):
// forward and backward through ldw agree with the same slice copied out, and the backward
// writes only its own columns of dw.
TEST(LinearKernel, WeightSliceThroughLdwMatchesThePackedSlice) {
  const int64_t n = 6, in = 5, out = 4, parts = 3;
  const auto x = random_vector(size_t(n * in), 21), wide = random_vector(size_t(in * parts * out), 22),
             b = random_vector(size_t(parts * out), 23), g = random_vector(size_t(n * out), 24);
  for (int64_t p = 0; p < parts; ++p) {
    SCOPED_TRACE(p);
    std::vector<float> packed(size_t(in * out));
    for (int64_t r = 0; r < in; ++r)
      for (int64_t c = 0; c < out; ++c) packed[size_t(r * out + c)] = wide[size_t(r * parts * out + p * out + c)];
    std::vector<float> y_slice(size_t(n * out)), y_packed(size_t(n * out));
    linear_forward(x.data(), wide.data() + p * out, b.data() + p * out, y_slice.data(), n, in, out, true, parts * out);
    linear_forward(x.data(), packed.data(), b.data() + p * out, y_packed.data(), n, in, out, true);
    for (size_t i = 0; i < y_slice.size(); ++i) EXPECT_NEAR(y_slice[i], y_packed[i], 1e-6f) << i;
    std::vector<float> dx_slice(size_t(n * in)), dx_packed(size_t(n * in));
    std::vector<float> dw_wide(wide.size(), 0.f), dw_packed(packed.size(), 0.f);
    linear_backward(x.data(), wide.data() + p * out, g.data(), dx_slice.data(), dw_wide.data() + p * out, nullptr, n,
                    in, out, true, parts * out);
    linear_backward(x.data(), packed.data(), g.data(), dx_packed.data(), dw_packed.data(), nullptr, n, in, out, true);
    for (size_t i = 0; i < dx_slice.size(); ++i) EXPECT_NEAR(dx_slice[i], dx_packed[i], 1e-6f) << i;
    for (int64_t r = 0; r < in; ++r)
      for (int64_t c = 0; c < parts * out; ++c) {
        const float got = dw_wide[size_t(r * parts * out + c)];
        const bool mine = c >= p * out && c < (p + 1) * out;
        EXPECT_NEAR(got, mine ? dw_packed[size_t(r * out + c - p * out)] : 0.f, 1e-6f) << r << "," << c;
      }
  }
}

// dx_write Overwrite: dx = dy·W whatever dx held (NaN here), equal to accumulating into zeros;
// dw and db still accumulate.
TEST(LinearKernel, OverwrittenDxIgnoresOldContentsAndWeightGradientsStillAccumulate) {
  const int64_t n = 37, in = 24, out = 19;
  const auto x = random_vector(size_t(n * in), 31), w = random_vector(size_t(in * out), 32),
             g = random_vector(size_t(n * out), 33);
  for (bool w_in_out : {false, true}) {
    SCOPED_TRACE(w_in_out);
    std::vector<float> dx0(x.size(), 0.f), dw0(w.size(), 0.f), db0(size_t(out), 0.f);
    std::vector<float> dx1(x.size(), std::numeric_limits<float>::quiet_NaN()), dw1(w.size(), 0.5f),
        db1(size_t(out), 0.5f);
    linear_backward(x.data(), w.data(), g.data(), dx0.data(), dw0.data(), db0.data(), n, in, out, w_in_out);
    linear_backward(x.data(), w.data(), g.data(), dx1.data(), dw1.data(), db1.data(), n, in, out, w_in_out, 0,
                    GradWrite::Overwrite);
    for (size_t i = 0; i < dx0.size(); ++i) ASSERT_EQ(dx0[i], dx1[i]) << i;
    for (size_t i = 0; i < dw0.size(); ++i) EXPECT_NEAR(dw1[i], dw0[i] + 0.5f, 1e-5) << i;
    for (size_t i = 0; i < db0.size(); ++i) EXPECT_NEAR(db1[i], db0[i] + 0.5f, 1e-5) << i;
  }
}

// Under bf16 the backward rounds dy once for both of its products (SharedBf16Operand: bf16 words
// on the native path, a rounded copy on the portable one, each forced in turn): the bits of the
// two products run through gemm_bf16 one by one, each rounding dy itself, in both weight layouts,
// with dx overwritten or accumulated; and the rounded dy is gone when it returns.
TEST(LinearKernel, Bf16BackwardGivesTheBitsOfItsTwoProductsRunAlone) {
  const int64_t n = 300, in = 96, out = 160;
  const auto x = random_vector(size_t(n * in), 41), w = random_vector(size_t(in * out), 42),
             g = random_vector(size_t(n * out), 43), dx_start = random_vector(size_t(n * in), 44),
             dw_start = random_vector(size_t(in * out), 45);
  PrecisionScope scope(Precision::Bf16);
  const Bf16GemmChoiceScope restore;
  for (Bf16GemmChoice path : {Bf16GemmChoice::Native, Bf16GemmChoice::Portable}) {
    for (bool w_in_out : {false, true}) {
      for (GradWrite write : {GradWrite::Accumulate, GradWrite::Overwrite}) {
        force_bf16_gemm_path(path);
        SCOPED_TRACE(std::string(path == Bf16GemmChoice::Native ? "native " : "portable ") + std::to_string(w_in_out) +
                     (write == GradWrite::Overwrite ? " overwrite" : " accumulate"));
        auto dx = dx_start, dw = dw_start, dx_ref = dx_start, dw_ref = dw_start;
        linear_backward(x.data(), w.data(), g.data(), dx.data(), dw.data(), nullptr, n, in, out, w_in_out, 0, write);
        const float beta = write == GradWrite::Overwrite ? 0.f : 1.f;
        if (w_in_out) {
          gemm_bf16(false, true, n, in, out, 1.f, g.data(), out, w.data(), out, beta, dx_ref.data(), in);
          gemm_bf16(true, false, in, out, n, 1.f, x.data(), in, g.data(), out, 1.f, dw_ref.data(), out);
        } else {
          gemm_bf16(false, false, n, in, out, 1.f, g.data(), out, w.data(), in, beta, dx_ref.data(), in);
          gemm_bf16(true, false, out, in, n, 1.f, g.data(), out, x.data(), in, 1.f, dw_ref.data(), in);
        }
        ASSERT_EQ(dx, dx_ref);
        ASSERT_EQ(dw, dw_ref);
        EXPECT_EQ(shared_bf16_words(g.data(), n, out, out), nullptr);
      }
    }
  }
}

// linear_backward_spent gives linear_backward's bits, bias gradient included (it sums dy's fp32
// values before rounding them), on both bf16 paths and in fp32; on the portable path it leaves
// dy rounded to bf16 (its values are spent), elsewhere as it was. A bias summed after the
// rounding, or a dy rounded differently from the products' own rounding, fails it.
TEST(LinearKernel, SpentGradientGivesTheBitsOfLinearBackward) {
  const int64_t n = 300, in = 96, out = 160;
  const auto x = random_vector(size_t(n * in), 51), w = random_vector(size_t(in * out), 52),
             g = random_vector(size_t(n * out), 53), dx_start = random_vector(size_t(n * in), 54),
             dw_start = random_vector(size_t(in * out), 55), db_start = random_vector(size_t(out), 56);
  const Bf16GemmChoiceScope restore;
  for (Precision precision : {Precision::Fp32, Precision::Bf16}) {
    PrecisionScope scope(precision);
    for (Bf16GemmChoice path : {Bf16GemmChoice::Native, Bf16GemmChoice::Portable}) {
      for (bool w_in_out : {false, true}) {
        force_bf16_gemm_path(path);
        SCOPED_TRACE(std::string(precision_name(precision)) +
                     (path == Bf16GemmChoice::Native ? " native " : " portable ") + std::to_string(w_in_out));
        auto dx = dx_start, dw = dw_start, db = db_start, dx_ref = dx_start, dw_ref = dw_start, db_ref = db_start;
        auto spent = g;
        linear_backward(x.data(), w.data(), g.data(), dx_ref.data(), dw_ref.data(), db_ref.data(), n, in, out, w_in_out,
                        0, GradWrite::Overwrite);
        linear_backward_spent(x.data(), w.data(), spent.data(), dx.data(), dw.data(), db.data(), n, in, out, w_in_out,
                              0, GradWrite::Overwrite);
        ASSERT_EQ(dx, dx_ref);
        ASSERT_EQ(dw, dw_ref);
        ASSERT_EQ(db, db_ref);
        const bool rounded = precision == Precision::Bf16 && bf16_gemm_path() == Bf16GemmPath::Portable;
        size_t moved = 0;
        for (size_t i = 0; i < g.size(); ++i) {
          const float want = rounded ? bf16_to_float(float_to_bf16(g[i])) : g[i];
          ASSERT_EQ(spent[i], want) << i;
          moved += spent[i] != g[i];
        }
        EXPECT_EQ(moved > 0, rounded);
      }
    }
  }
}

}  // namespace
}  // namespace keel::kernels
