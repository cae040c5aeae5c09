#include "keel/kernels/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>

#include "gradient_check.hpp"
#include "keel/core/error.hpp"

namespace keel::kernels {
namespace {

using testing::random_vector;

// Llama 3.1 settings: theta 500000, head_dim 128, factor 8, low 1, high 4, original context 8192.
// Thresholds: wavelengths above 8192/1 = 8192 are slowed 8x, below 8192/4 = 2048 are kept.
TEST(RopeKernel, Llama3ScalingMatchesHandComputedFrequencies) {
  const nlohmann::json scaling = {{"rope_type", "llama3"},
                                  {"factor", 8.0},
                                  {"low_freq_factor", 1.0},
                                  {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 8192}};
  const auto inv = rope_inv_freq(500000.0, 128, scaling);
  ASSERT_EQ(inv.size(), 64u);
  // i = 0: inv_freq 1, wavelength 2π, high frequency: unchanged.
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  // i = 8: 500000^(-16/128) = 0.1939227, wavelength 32.4: unchanged.
  EXPECT_NEAR(inv[8], 0.1939227, 1e-6);
  // i = 63: 500000^(-126/128) = 2.455141e-6, wavelength 2.56e6 > 8192: divided by 8 -> 3.068926e-7.
  EXPECT_NEAR(inv[63], 3.068926e-7, 1e-12);
  // i = 30: 500000^(-60/128) = 2.131120e-3, wavelength 2948.30 between 2048 and 8192: smoothed
  // with s = (8192/2948.30 - 1)/(4 - 1) = 0.592849, f = (1-s)·f/8 + s·f = 1.371894e-3.
  EXPECT_NEAR(inv[30], 1.371894e-3, 2e-9);
  // The table holds cos/sin of position·inv_freq.
  const RopeTable t = make_rope_table(500000.0, 128, 16, scaling);
  EXPECT_NEAR(t.cos[size_t(5 * 64 + 30)], std::cos(5 * 1.371894e-3), 1e-6);
  EXPECT_NEAR(t.sin[size_t(5 * 64 + 63)], std::sin(5 * 3.068926e-7), 1e-9);
  EXPECT_NEAR(t.sin[size_t(3 * 64 + 0)], std::sin(3.0), 1e-6);
}

TEST(RopeKernel, LinearScalingDividesFrequencies) {
  const auto plain = rope_inv_freq(10000.0, 8, nullptr);
  const auto lin = rope_inv_freq(10000.0, 8, nlohmann::json{{"type", "linear"}, {"factor", 4.0}});
  EXPECT_NEAR(plain[1], std::pow(10000.0, -2.0 / 8), 1e-12);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(lin[i], plain[i] / 4, 1e-12);
}

TEST(RopeKernel, UnsupportedScalingThrowsNamingTheField) {
  try {
    rope_inv_freq(10000.0, 8, nlohmann::json{{"rope_type", "dynamic"}, {"factor", 4.0}});
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "rope_scaling");
    EXPECT_NE(e.reason().find("dynamic"), std::string::npos);
  }
}

// YaRN as transformers' _compute_yarn_parameters, rotary dim 8, theta 10000, factor 4, original
// context 64, beta_fast 32, beta_slow 1: correction dims 8·ln(64/(2π·rot))/(2 ln 10000) are
// -0.497 (rot 32, floored to -1, clamped to 0) and 1.008 (rot 1, ceiled to 2), so the ramp is
// (i - 0)/2: i = 0 keeps its frequency, i = 1 blends half and half, i = 2, 3 are divided by 4.
TEST(RopeKernel, YarnScalingMatchesHandComputedFrequencies) {
  const nlohmann::json scaling = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64},
                                  {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 0.8}};
  const auto inv = rope_inv_freq(10000.0, 8, scaling);
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_NEAR(inv[1], 0.1 * 0.5 + 0.1 / 4 * 0.5, 1e-15);  // 10000^(-1/4) = 0.1
  EXPECT_NEAR(inv[2], 0.01 / 4, 1e-16);
  EXPECT_NEAR(inv[3], 0.001 / 4, 1e-17);
  // Without original_max_position_embeddings the table's max_positions stands in (HF uses
  // max_position_embeddings): 64 gives the same frequencies.
  nlohmann::json no_original = scaling;
  no_original.erase("original_max_position_embeddings");
  EXPECT_EQ(rope_inv_freq(10000.0, 8, no_original, 64), inv);
  // cos/sin carry the attention factor mscale(4, 1) / mscale(4, 0.8).
  const double af = (0.1 * std::log(4.0) + 1) / (0.08 * std::log(4.0) + 1);
  EXPECT_NEAR(rope_attention_factor(scaling), af, 1e-15);
  EXPECT_NEAR(yarn_mscale(40.0, 1.0), 1.3688879454, 1e-9);  // DeepSeek-V3's factor 40
  EXPECT_EQ(yarn_mscale(1.0, 1.0), 1.0);
  const RopeTable t = make_rope_table(10000.0, 8, 16, scaling);
  EXPECT_NEAR(t.cos[size_t(3 * 4 + 1)], af * std::cos(3 * inv[1]), 1e-6);
  EXPECT_NEAR(t.sin[size_t(3 * 4 + 1)], af * std::sin(3 * inv[1]), 1e-6);
  // Only mscale set: factor mscale(4, 1); neither: 1 for other types.
  EXPECT_NEAR(rope_attention_factor({{"type", "yarn"}, {"factor", 4.0}}), 0.1 * std::log(4.0) + 1, 1e-15);
  EXPECT_EQ(rope_attention_factor(nullptr), 1.0);
}

// rope_interleave (DeepSeek): frequency i rotates the adjacent pair (2i, 2i+1) of the first
// rotary_dim dims; the rest pass through.
TEST(RopeKernel, InterleavedForwardRotatesAdjacentPairs) {
  const int64_t B = 2, T = 3, H = 2, D = 10, rd = 6;
  RopeTable t = make_rope_table(10000.0, rd, 8, nullptr);
  t.interleave = true;
  const auto x0 = random_vector(size_t(B * T * H * D), 5);
  auto x = x0;
  rope_forward(x.data(), t, B, T, H, D);
  const auto inv = rope_inv_freq(10000.0, rd, nullptr);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < T; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const size_t base = size_t(((b * T + s) * H + h) * D);
        for (int64_t i = 0; i < rd / 2; ++i) {
          const double a = double(s) * inv[size_t(i)];
          const double x1 = x0[base + size_t(2 * i)], x2 = x0[base + size_t(2 * i + 1)];
          EXPECT_NEAR(x[base + size_t(2 * i)], x1 * std::cos(a) - x2 * std::sin(a), 1e-6);
          EXPECT_NEAR(x[base + size_t(2 * i + 1)], x2 * std::cos(a) + x1 * std::sin(a), 1e-6);
        }
        for (int64_t i = rd; i < D; ++i) EXPECT_EQ(x[base + size_t(i)], x0[base + size_t(i)]);
      }
}

// Interleaved and YaRN-scaled (cos/sin times the attention factor, no longer a pure rotation):
// backward is still the transpose.
TEST(RopeKernel, InterleavedYarnBackwardMatchesFiniteDifferences) {
  const int64_t B = 1, T = 5, H = 3, D = 10, rd = 8;
  RopeTable t = make_rope_table(10000.0, rd, 5, {{"type", "yarn"}, {"factor", 4.0}, {"mscale", 1.0},
                                                 {"mscale_all_dim", 0.5}, {"original_max_position_embeddings", 4}});
  t.interleave = true;
  auto x = random_vector(size_t(B * T * H * D), 6);
  const auto g = random_vector(x.size(), 7);
  auto loss = [&] {
    auto y = x;
    rope_forward(y.data(), t, B, T, H, D);
    return testing::dot(y, g);
  };
  auto dx = g;
  rope_backward(dx.data(), t, B, T, H, D);
  testing::expect_gradient(x, dx, loss, "interleaved yarn rope dx");
}

// rotate-half on the first rotary_dim = 6 of head_dim = 10 dims; the last 4 pass through.
TEST(RopeKernel, ForwardRotatesHalvesAndPassesTheRestThrough) {
  const int64_t B = 2, T = 3, H = 2, D = 10, rd = 6;
  const RopeTable t = make_rope_table(10000.0, rd, 8, nullptr);
  const auto x0 = random_vector(size_t(B * T * H * D), 1);
  auto x = x0;
  rope_forward(x.data(), t, B, T, H, D);
  const auto inv = rope_inv_freq(10000.0, rd, nullptr);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < T; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const size_t base = size_t(((b * T + s) * H + h) * D);
        for (int64_t i = 0; i < rd / 2; ++i) {
          const double a = double(s) * inv[size_t(i)];
          const double x1 = x0[base + size_t(i)], x2 = x0[base + size_t(i + rd / 2)];
          EXPECT_NEAR(x[base + size_t(i)], x1 * std::cos(a) - x2 * std::sin(a), 1e-6);
          EXPECT_NEAR(x[base + size_t(i + rd / 2)], x2 * std::cos(a) + x1 * std::sin(a), 1e-6);
        }
        for (int64_t i = rd; i < D; ++i) EXPECT_EQ(x[base + size_t(i)], x0[base + size_t(i)]);
      }
}

TEST(RopeKernel, BackwardMatchesFiniteDifferences) {
  const int64_t B = 1, T = 5, H = 3, D = 10, rd = 6;
  const RopeTable t = make_rope_table(10000.0, rd, 5, nullptr);
  auto x = random_vector(size_t(B * T * H * D), 2);
  const auto g = random_vector(x.size(), 3);
  auto loss = [&] {
    auto y = x;
    rope_forward(y.data(), t, B, T, H, D);
    return testing::dot(y, g);
  };
  auto dx = g;
  rope_backward(dx.data(), t, B, T, H, D);
  testing::expect_gradient(x, dx, loss, "rope dx");
}

// Rotating tokens at positions p0.. one slice at a time equals rotating the whole sequence:
// what a KV cache does when it appends tokens to a sequence already rotated.
TEST(RopeKernel, ForwardAtContinuesTheSequenceFromAnyPosition) {
  const int64_t T = 9, H = 3, D = 10, rd = 8;
  const RopeTable t = make_rope_table(500000.0, rd, 16, nullptr);
  const auto x0 = random_vector(size_t(T * H * D), 4);
  auto whole = x0;
  rope_forward(whole.data(), t, 1, T, H, D);
  auto pieces = x0;
  const int64_t cuts[] = {0, 1, 4, 5, T};  // slices of 1, 3, 1 and 4 tokens
  for (size_t c = 0; c + 1 < std::size(cuts); ++c) {
    rope_forward_at(pieces.data() + cuts[c] * H * D, t, cuts[c + 1] - cuts[c], H, D, cuts[c]);
  }
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(pieces[i], whole[i]) << "element " << i;

  // A single token at the table's last position uses the last row.
  auto one = std::vector<float>(x0.begin(), x0.begin() + H * D);
  rope_forward_at(one.data(), t, 1, H, D, 15);
  const auto inv = rope_inv_freq(500000.0, rd, nullptr);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < rd / 2; ++i) {
      const double a = 15.0 * inv[size_t(i)];
      const double x1 = x0[size_t(h * D + i)], x2 = x0[size_t(h * D + i + rd / 2)];
      EXPECT_NEAR(one[size_t(h * D + i)], x1 * std::cos(a) - x2 * std::sin(a), 1e-6);
    }
}

}  // namespace
}  // namespace keel::kernels
