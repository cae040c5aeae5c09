// The spike detector alone: its robust statistics, that a falling loss with ordinary noise raises
// no false alarm, that real spikes and non-finite values are caught, and that its window survives
// a checkpoint round trip. The recovery policies (spike_recovery.hpp) directly: decisions within
// the budgets, the events and messages, and the rollback procedure over a run folder with a
// damaged checkpoint. End to end they are in trainer_test.cpp.
#include "keel/train/spike_guard.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "keel/core/rng.hpp"
#include "keel/train/faults.hpp"
#include "keel/train/run_dir.hpp"
#include "keel/train/run_state.hpp"
#include "keel/train/spike_recovery.hpp"

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
  // A grad norm 5x its level with the loss normal: an outlier healthy runs have, not a spike.
  EXPECT_FALSE(guard.check(4.0, 2.5).spike);
  // The same with the loss raised too (above threshold/2 deviations, below the loss limit).
  v = guard.check(4.0 + 0.8 * (guard.check(100.0, 0.5).threshold - 4.0), 2.5);
  EXPECT_TRUE(v.spike);
  EXPECT_EQ(v.signal, "grad_norm");
  EXPECT_GT(v.threshold, 0.5);
  EXPECT_LT(v.threshold, 2.5);
  // 10% above is not a spike.
  EXPECT_FALSE(guard.check(4.0, 0.55).spike);
}

TEST(SpikeGuard, GradNormSignalModes) {
  // One window, three settings: alone calls a lone grad-norm outlier, with_loss needs the loss
  // raised as well, off never looks at the grad norm.
  auto filled = [](GradNormSignal mode) {
    SpikeConfig c;
    c.grad_norm = mode;
    SpikeGuard g(c);
    for (int i = 0; i < 100; ++i) {
      g.accept(3.0 + 0.02 * normal_at(9, 1, static_cast<uint64_t>(i)), 0.5 * std::exp(0.1 * normal_at(9, 2, static_cast<uint64_t>(i))));
    }
    return g;
  };
  const SpikeGuard alone = filled(GradNormSignal::Alone), with_loss = filled(GradNormSignal::WithLoss),
                   off = filled(GradNormSignal::Off);
  const double loss_limit = with_loss.check(100.0, 0.5).threshold;
  const double raised = 3.0 + 0.7 * (loss_limit - 3.0);  // 0.7 x 6 = 4.2 deviations: "raised"
  EXPECT_EQ(alone.check(3.0, 5.0).signal, "grad_norm");
  EXPECT_FALSE(with_loss.check(3.0, 5.0).spike);
  EXPECT_EQ(with_loss.check(raised, 5.0).signal, "grad_norm");
  EXPECT_FALSE(with_loss.check(raised, 0.5).spike) << "a raised loss alone, below its limit, is no spike";
  EXPECT_FALSE(off.check(raised, 50.0).spike);
  EXPECT_EQ(off.check(100.0, 0.5).signal, "loss");
  EXPECT_EQ(off.check(3.0, std::nan("")).signal, "nonfinite_grad");
  EXPECT_EQ(parse_grad_norm_signal("with_loss"), GradNormSignal::WithLoss);
  EXPECT_STREQ(to_string(GradNormSignal::Alone), "alone");
  EXPECT_THROW(parse_grad_norm_signal("sometimes"), std::invalid_argument);
}

TEST(SpikeGuard, ReplayCallsWhatTheOnlineGuardCalls) {
  SpikeConfig c;
  c.grad_norm = GradNormSignal::Alone;
  std::vector<int64_t> steps;
  std::vector<double> loss, grad;
  for (int i = 0; i < 300; ++i) {
    steps.push_back(i + 1);
    loss.push_back(5.0 + 3.0 * std::exp(-i / 50.0) + 0.03 * normal_at(4, 1, static_cast<uint64_t>(i)));
    grad.push_back(0.8 * std::exp(0.15 * normal_at(4, 2, static_cast<uint64_t>(i))));
  }
  loss[150] *= 2;        // a loss jump
  grad[200] *= 40;       // a lone grad-norm outlier
  loss[250] = std::nan("");
  SpikeGuard online(c);
  std::vector<int64_t> called;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (online.check(loss[i], grad[i]).spike) called.push_back(steps[i]);
    online.accept(loss[i], grad[i]);
  }
  const auto replayed = replay_spike_guard(c, steps, loss, grad);
  ASSERT_EQ(replayed.size(), called.size());
  for (size_t i = 0; i < called.size(); ++i) EXPECT_EQ(replayed[i].step, called[i]);
  ASSERT_EQ(replayed.size(), 3u);
  EXPECT_EQ(replayed[0].verdict.signal, "loss");
  EXPECT_EQ(replayed[1].verdict.signal, "grad_norm");
  EXPECT_EQ(replayed[2].verdict.signal, "nonfinite_loss");
  c.grad_norm = GradNormSignal::WithLoss;
  EXPECT_EQ(replay_spike_guard(c, steps, loss, grad).size(), 2u) << "the lone outlier is not called by default";
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

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

SpikeConfig policy(SpikePolicy p) {
  SpikeConfig c;
  c.policy = p;
  c.max_skips = 2;
  c.max_rollbacks = 1;
  return c;
}

TEST(SpikeRecovery, DecisionsKeepToThePolicyWithinItsBudgets) {
  const SpikeVerdict loss{true, "loss", 9.0, 4.0}, nan_grad{true, "nonfinite_grad", kNaN, 0};
  EXPECT_EQ(decide_spike(policy(SpikePolicy::Warn), loss, 0, 0).action, SpikePolicy::Warn);
  EXPECT_EQ(decide_spike(policy(SpikePolicy::Warn), loss, 0, 0).abort_reason, "");
  // A non-finite value cannot be trained through: warn turns into abort.
  auto d = decide_spike(policy(SpikePolicy::Warn), nan_grad, 0, 0);
  EXPECT_EQ(d.action, SpikePolicy::Abort);
  EXPECT_NE(d.abort_reason.find("spikes.policy = warn"), std::string::npos) << d.abort_reason;
  EXPECT_EQ(decide_spike(policy(SpikePolicy::Skip), nan_grad, 1, 0).action, SpikePolicy::Skip);
  d = decide_spike(policy(SpikePolicy::Skip), loss, 2, 0);
  EXPECT_EQ(d.action, SpikePolicy::Abort);
  EXPECT_EQ(d.abort_reason, "spikes.max_skips (2) updates already skipped");
  EXPECT_EQ(decide_spike(policy(SpikePolicy::Rollback), loss, 5, 0).action, SpikePolicy::Rollback);
  d = decide_spike(policy(SpikePolicy::Rollback), loss, 0, 1);
  EXPECT_EQ(d.action, SpikePolicy::Abort);
  EXPECT_EQ(d.abort_reason, "spikes.max_rollbacks (1) rollbacks already done");
  EXPECT_EQ(decide_spike(policy(SpikePolicy::Abort), loss, 0, 0).abort_reason, "spikes.policy = abort");
}

TEST(SpikeRecovery, EventsAndMessagesNameTheSignal) {
  const nlohmann::json e = spike_event(22, {true, "loss", 9.5, 4.0}, SpikePolicy::Rollback);
  EXPECT_EQ(e.dump(), R"({"action":"rollback","signal":"loss","step":22,"threshold":4.0,"type":"spike","value":9.5})");
  // JSON has no NaN: the value is null, and there is no threshold for a non-finite signal.
  EXPECT_EQ(spike_event(3, {true, "nonfinite_grad", kNaN, 0}, SpikePolicy::Skip).dump(),
            R"({"action":"skip","signal":"nonfinite_grad","step":3,"type":"spike","value":null})");
  EXPECT_EQ(spike_message(22, {true, "loss", 9.5, 4.0}, SpikePolicy::Rollback),
            "keel: spike at step 22: loss = 9.5 above 4.000000; rollback");
  EXPECT_EQ(spike_message(3, {true, "nonfinite_grad", kNaN, 0}, SpikePolicy::Skip),
            "keel: spike at step 3: nonfinite_grad = nan; skip");
}

// One tensor in model.safetensors, for checkpoints without a model.
class Weights : public Stateful {
 public:
  std::vector<float> v = std::vector<float>(64, 0.0f);
  void save(CheckpointWriter& out) const override {
    out.file("model.safetensors");
    out.tensor("model.safetensors", "w", {64}, v.data());
  }
  void load(CheckpointReader& in) override { in.tensor("model.safetensors", "w", {64}, v.data()); }
};

class RollbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("keel_spike_recovery_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::vector<nlohmann::json> events() const {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir_ / "events.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  // A checkpoint of the parts at (step, sequences), the weights all equal to step.
  void save_at(int64_t step, int64_t sequences) {
    state_ = {step, step * 100, sequences};
    std::fill(weights_.v.begin(), weights_.v.end(), static_cast<float>(step));
    checkpoint_.save(dir_.string(), step, 3);
  }
  std::filesystem::path dir_;
  TrainState state_;
  Weights weights_;
  TrainStateRecord record_{state_};
  Checkpoint checkpoint_;
};

TEST_F(RollbackTest, LoadsTheNewestIntactCheckpointAndSkipsTheDataWindow) {
  EventLog log((dir_ / "events.jsonl").string(), true);
  std::vector<std::string> said;
  SpikeRecovery recovery(policy(SpikePolicy::Rollback), dir_.string(), log,
                         [&](const std::string& text) { said.push_back(text); });
  checkpoint_.add("train", record_);
  checkpoint_.add("model", weights_);
  checkpoint_.add("spike_guard", recovery);
  save_at(5, 20);
  save_at(10, 40);
  damage_checkpoint((dir_ / kCheckpointsDir / "step_00000010").string());
  state_ = {12, 1200, 52};  // the spike's batches ended at sequence 52

  nlohmann::json step_events = nlohmann::json::array();
  const auto r = recovery.rollback(13, "loss", state_, checkpoint_, step_events);
  EXPECT_EQ(r.to_step, 5);
  EXPECT_EQ(r.from_sequences, 20);
  EXPECT_EQ(r.to_sequences, 52);
  EXPECT_EQ(state_.step, 5);
  EXPECT_EQ(state_.tokens, 500);
  EXPECT_EQ(state_.sequences, 52) << "PaLM §5.1: the data between the checkpoint and the spike is skipped";
  EXPECT_EQ(weights_.v[7], 5.0f);
  EXPECT_EQ(recovery.rollbacks_used(), 1) << "the checkpoint's counters do not give the budget back";
  // The damaged checkpoint is kept aside, never loaded again.
  EXPECT_TRUE(std::filesystem::exists(dir_ / kCheckpointsDir / "corrupt_step_00000010"));
  EXPECT_EQ(complete_checkpoints(dir_.string()).size(), 1u);

  auto ev = events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0]["type"], "checkpoint_corrupt");
  EXPECT_EQ(ev[0]["step"], 13);
  EXPECT_NE(ev[0]["reason"].get<std::string>().find("checksum mismatch"), std::string::npos);
  EXPECT_EQ(ev[1].dump(), R"({"skipped_sequences":[20,52],"step":13,"to_step":5,"type":"rollback"})");
  EXPECT_EQ(step_events.size(), 1u);
  ASSERT_EQ(said.size(), 2u);
  EXPECT_NE(said[0].find("step_00000010 is damaged"), std::string::npos) << said[0];
  EXPECT_EQ(said[1], "keel: rolled back to step 5, skipping sequences 20..52");

  // The budget is spent: the next rollback decision aborts.
  EXPECT_EQ(decide_spike(policy(SpikePolicy::Rollback), {true, "loss", 9, 4}, 0, recovery.rollbacks_used()).action,
            SpikePolicy::Abort);
}

TEST_F(RollbackTest, WithoutAnIntactCheckpointTheRunAborts) {
  EventLog log((dir_ / "events.jsonl").string(), true);
  SpikeRecovery recovery(policy(SpikePolicy::Rollback), dir_.string(), log, [](const std::string&) {});
  checkpoint_.add("train", record_);
  checkpoint_.add("model", weights_);
  save_at(5, 20);
  damage_checkpoint((dir_ / kCheckpointsDir / "step_00000005").string());
  state_ = {7, 700, 28};
  nlohmann::json step_events = nlohmann::json::array();
  try {
    recovery.rollback(8, "loss", state_, checkpoint_, step_events);
    FAIL() << "expected an abort";
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), dir_.string());
    EXPECT_NE(std::string(e.what()).find("training diverged at step 8 (loss): no intact checkpoint to roll back to"),
              std::string::npos)
        << e.what();
  }
  auto ev = events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0]["type"], "checkpoint_corrupt");
  EXPECT_EQ(ev[1]["type"], "abort");
  EXPECT_EQ(recovery.rollbacks_used(), 0);
}

TEST_F(RollbackTest, CountersAndWindowRoundTripThroughACheckpoint) {
  EventLog log((dir_ / "events.jsonl").string(), true);
  SpikeRecovery a(policy(SpikePolicy::Skip), dir_.string(), log, [](const std::string&) {});
  // Two skipped steps spend the budget; the applied ones fill the window.
  for (int64_t s = 1; s <= 30; ++s) {
    StepContext step;
    step.step = s;
    step.loss = 5.0 - 0.01 * static_cast<double>(s);
    step.grad_norm = 1.0;
    step.fate = s == 4 || s == 9 ? StepFate::Skip : StepFate::Apply;
    a.finish(step);
  }
  EXPECT_EQ(a.skips_used(), 2);
  EXPECT_EQ(a.guard().history(), 28u);
  checkpoint_.add("spike_guard", a);
  checkpoint_.save(dir_.string(), 30, 3);

  SpikeRecovery b(policy(SpikePolicy::Skip), dir_.string(), log, [](const std::string&) {});
  Checkpoint other;
  other.add("spike_guard", b);
  other.load(*latest_complete_checkpoint(dir_.string()));
  EXPECT_EQ(b.skips_used(), 2);
  EXPECT_EQ(b.guard().state(), a.guard().state());
  EXPECT_EQ(decide_spike(policy(SpikePolicy::Skip), {true, "loss", 9, 4}, b.skips_used(), 0).action,
            SpikePolicy::Abort);
}

}  // namespace
}  // namespace keel::train
