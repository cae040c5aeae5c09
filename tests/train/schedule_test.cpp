// Schedules are pure functions of (step, tokens); each phase boundary is checked exactly.
#include <gtest/gtest.h>

#include <cmath>

#include "keel/train/schedule.hpp"

namespace keel::train {
namespace {

TEST(Schedule, ConstantAndWarmup) {
  ScheduleConfig s;
  s.peak_lr = 1e-3;
  EXPECT_DOUBLE_EQ(lr_at(s, 1, 0), 1e-3);
  s.kind = ScheduleKind::Warmup;
  s.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(lr_at(s, 1, 0), 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 0), 5e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 10, 0), 1e-3);  // warmup ends exactly at its last step
  EXPECT_DOUBLE_EQ(lr_at(s, 11, 0), 1e-3);
}

TEST(Schedule, CosineEndsAtFinal) {
  ScheduleConfig s;
  s.kind = ScheduleKind::Cosine;
  s.peak_lr = 1.0;
  s.final_lr = 0.1;
  s.warmup_steps = 10;
  s.total_steps = 110;
  EXPECT_DOUBLE_EQ(lr_at(s, 10, 0), 1.0);
  EXPECT_NEAR(lr_at(s, 60, 0), 0.55, 1e-12);  // half way: the mean of peak and final
  EXPECT_NEAR(lr_at(s, 110, 0), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(s, 200, 0), 0.1, 1e-12);  // clamped past the end
}

TEST(Schedule, WarmupHoldCosineInDeepSeekV3Shape) {
  // DeepSeek-V3 §4.2 scaled down: warmup 20 steps, hold peak until 1000 tokens, cosine to 0.1 of
  // peak over 500 tokens, then 0.1 until 1200 tokens, then 0.033.
  ScheduleConfig s;
  s.kind = ScheduleKind::WarmupHoldCosine;
  s.peak_lr = 2.2e-4;
  s.final_lr = 2.2e-5;
  s.warmup_steps = 20;
  s.hold_tokens = 1000;
  s.decay_tokens = 500;
  s.tails = {{1700, 2.2e-5}, {1900, 7.3e-6}};
  EXPECT_DOUBLE_EQ(lr_at(s, 10, 100), 1.1e-4);      // in warmup
  EXPECT_DOUBLE_EQ(lr_at(s, 20, 200), 2.2e-4);      // warmup done
  EXPECT_DOUBLE_EQ(lr_at(s, 50, 999), 2.2e-4);      // last token of the hold
  EXPECT_DOUBLE_EQ(lr_at(s, 51, 1000), 2.2e-4);     // cosine starts at the peak
  EXPECT_NEAR(lr_at(s, 60, 1250), (2.2e-4 + 2.2e-5) / 2, 1e-15);
  EXPECT_NEAR(lr_at(s, 70, 1499), 2.2e-5, 1e-8);    // one token before the end of the cosine
  EXPECT_DOUBLE_EQ(lr_at(s, 71, 1500), 2.2e-5);     // first tail
  EXPECT_DOUBLE_EQ(lr_at(s, 80, 1699), 2.2e-5);
  EXPECT_DOUBLE_EQ(lr_at(s, 81, 1700), 7.3e-6);     // second tail
  EXPECT_DOUBLE_EQ(lr_at(s, 90, 5000), 7.3e-6);     // stays at the last tail
}

TEST(Schedule, WsdShapes) {
  ScheduleConfig s;
  s.kind = ScheduleKind::Wsd;
  s.peak_lr = 1.0;
  s.final_lr = 0.0;
  s.warmup_steps = 10;
  s.total_steps = 100;
  s.decay_steps = 20;
  EXPECT_DOUBLE_EQ(lr_at(s, 5, 0), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 10, 0), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 80, 0), 1.0);  // last stable step
  s.decay_shape = DecayShape::Linear;
  EXPECT_DOUBLE_EQ(lr_at(s, 90, 0), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 100, 0), 0.0);
  s.decay_shape = DecayShape::Cosine;
  EXPECT_NEAR(lr_at(s, 90, 0), 0.5, 1e-12);
  EXPECT_NEAR(lr_at(s, 85, 0), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  s.decay_shape = DecayShape::OneMinusSqrt;
  EXPECT_NEAR(lr_at(s, 85, 0), 1 - std::sqrt(0.25), 1e-12);
  EXPECT_NEAR(lr_at(s, 100, 0), 0.0, 1e-12);
}

TEST(BatchRamp, GrowsByWholeMicroBatches) {
  BatchRamp r{8, 16, 64, 1000};
  EXPECT_EQ(accumulation_at(r, 1, 0), 2);       // 16 sequences = 2 micro-batches
  EXPECT_EQ(accumulation_at(r, 1, 500), 5);     // 40 sequences
  EXPECT_EQ(accumulation_at(r, 1, 999), 7);     // 63.95 -> 7 micro-batches (56 sequences)
  EXPECT_EQ(accumulation_at(r, 1, 1000), 8);    // 64
  EXPECT_EQ(accumulation_at(r, 1, 10'000), 8);
  BatchRamp off{8, 0, 0, 0};
  EXPECT_EQ(accumulation_at(off, 3, 12345), 3);  // no ramp: the configured accumulation
}

}  // namespace
}  // namespace keel::train
