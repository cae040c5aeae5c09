// The spike detector alone: its robust statistics, that a falling loss with ordinary noise raises
// no false alarm, that real spikes and non-finite values are caught, and that its window survives
// a checkpoint round trip. The recovery policies end to end are in trainer_test.cpp.
#include "keel/train/spike_guard.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "keel/core/rng.hpp"

namespace keel::train {
namespace {

TEST(SpikeGuard, RobustStatsAreMedianAndScaledMad) {
  // Median 3; absolute deviations {2,1,0,1,97} -> MAD 1 -> 1.4826.
  auto s = robust_stats({1, 2, 3, 4, 100});
  EXPECT_DOUBLE_EQ(s.median, 3.0);
  EXPECT_DOUBLE_EQ(s.deviation, 1.4826);
  // Even count: the mean of the middle two.
  EXPECT_DOUBLE_EQ(robust_stats({4, 1, 3, 2}).median, 2.5);
}

TEST(SpikeGuard, WindowStatsIgnoreATrend) {
  // A loss falling by 0.05 a step with ±0.01 alternating noise: the level is the recent median,
  // the deviation reflects the noise, not the 0.05·n trend.
  std::deque<double> v;
  for (int i = 0; i < 100; ++i) v.push_back(8.0 - 0.05 * i + (i % 2 ? 0.01 : -0.01));
  auto s = window_stats(v);
  EXPECT_NEAR(s.median, 8.0 - 0.05 * 87.5, 0.06);  // newest quarter: i = 75..99
  EXPECT_LT(s.deviation, 0.08);
  EXPECT_GT(s.deviation, 0.0);
}

TEST(SpikeGuard, NoFalseAlarmsOnANoisyFallingLossThenCatchesASpike) {
  SpikeGuard guard(SpikeConfig{});
  int alarms = 0;
  for (int i = 0; i < 2000; ++i) {
    const double loss = 4.0 + 5.0 * std::exp(-i / 200.0) + 0.05 * normal_at(7, 1, static_cast<uint64_t>(i));
    const double grad = 0.5 * std::exp(0.1 * normal_at(7, 2, static_cast<uint64_t>(i)));
    if (guard.check(loss, grad).spike) ++alarms;
    guard.accept(loss, grad);
  }
  EXPECT_EQ(alarms, 0);
  // Loss two nats above its level.
  auto v = guard.check(6.0, 0.5);
  EXPECT_TRUE(v.spike);
  EXPECT_EQ(v.signal, "loss");
  EXPECT_GT(v.threshold, 4.0);
  EXPECT_LT(v.threshold, 5.0);
  // A grad norm 5x its level, loss normal.
  v = guard.check(4.0, 2.5);
  EXPECT_TRUE(v.spike);
  EXPECT_EQ(v.signal, "grad_norm");
  EXPECT_GT(v.threshold, 0.5);
  EXPECT_LT(v.threshold, 2.5);
  // 10% above is not a spike.
  EXPECT_FALSE(guard.check(4.0, 0.55).spike);
}

TEST(SpikeGuard, NonFiniteIsAlwaysASpikeEvenWithoutHistory) {
  SpikeGuard guard(SpikeConfig{});
  EXPECT_EQ(guard.check(std::nan(""), 1.0).signal, "nonfinite_loss");
  EXPECT_EQ(guard.check(1.0, std::numeric_limits<double>::infinity()).signal, "nonfinite_grad");
  // A finite jump before min_history steps is not judged.
  EXPECT_FALSE(guard.check(1e6, 1e6).spike);
  // Non-finite values never enter the window.
  guard.accept(std::nan(""), 1.0);
  EXPECT_EQ(guard.history(), 0u);
}

TEST(SpikeGuard, WindowSurvivesACheckpointRoundTrip) {
  SpikeConfig cfg;
  cfg.window = 30;
  SpikeGuard a(cfg), b(cfg);
  for (int i = 0; i < 50; ++i) a.accept(3.0 + 0.01 * (i % 5), 0.4 + 0.01 * (i % 3));
  EXPECT_EQ(a.history(), 30u);
  b.restore(nlohmann::json::parse(a.state().dump()));
  EXPECT_EQ(b.history(), 30u);
  for (double loss : {3.02, 3.3, 3.6, 5.0}) {
    auto va = a.check(loss, 0.41), vb = b.check(loss, 0.41);
    EXPECT_EQ(va.spike, vb.spike) << loss;
    EXPECT_DOUBLE_EQ(va.threshold, vb.threshold);
  }
  // Damaged state starts an empty window instead of failing.
  b.restore(nlohmann::json::parse(R"({"loss": [1, "x"], "log_grad_norm": [0, 0]})"));
  EXPECT_EQ(b.history(), 0u);
}

TEST(SpikeGuard, PolicyNames) {
  EXPECT_EQ(parse_spike_policy("rollback"), SpikePolicy::Rollback);
  EXPECT_STREQ(to_string(SpikePolicy::Skip), "skip");
  EXPECT_THROW(parse_spike_policy("retry"), std::invalid_argument);
}

}  // namespace
}  // namespace keel::train
