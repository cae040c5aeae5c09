// The run config: typed sections, unknown keys and wrong types named, --set overrides.
#include <gtest/gtest.h>

#include "keel/core/error.hpp"
#include "keel/train/run_config.hpp"

namespace keel::train {
namespace {

const char* kBase = R"(
[run]
steps = 30
out = "runs/x"
[model]
config = "configs/tiny/qwen3.json"
set = ["vocab_size=64"]
[data]
dataset = "data/x"
[batch]
sequences = 4
seq_len = 16
[optimizer]
lr = 0.01
[schedule]
kind = "warmup_hold_cosine"
warmup_steps = 5
hold_tokens = 100
decay_tokens = 200
tails = [{until_tokens = 400, lr = 0.001}]
[eval]
every = 10
[checkpoint]
every = 10
keep = 2
)";

std::string error_field(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    parse_run_config(text, "run.toml", sets);
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), "run.toml");
    return e.field();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

TEST(RunConfig, ParsesEverySection) {
  RunConfig c = parse_run_config(kBase, "run.toml");
  EXPECT_EQ(c.steps, 30);
  EXPECT_EQ(c.model_set, std::vector<std::string>{"vocab_size=64"});
  EXPECT_EQ(c.sequences, 4);
  EXPECT_EQ(c.ramp.micro_sequences, 4);
  EXPECT_DOUBLE_EQ(c.schedule.peak_lr, 0.01);
  EXPECT_EQ(c.schedule.kind, ScheduleKind::WarmupHoldCosine);
  ASSERT_EQ(c.schedule.tails.size(), 1u);
  EXPECT_EQ(c.schedule.tails[0].until_tokens, 400);
  EXPECT_EQ(c.checkpoint_keep, 2);
}

TEST(RunConfig, OverridesTakeTomlValuesOrStrings) {
  RunConfig c = parse_run_config(kBase, "run.toml", {"run.steps=7", "run.out=/tmp/elsewhere", "checkpoint.every=3",
                                                     "optimizer.lr=2e-3", "schedule.kind=wsd", "schedule.decay_steps=2"});
  EXPECT_EQ(c.steps, 7);
  EXPECT_EQ(c.out, "/tmp/elsewhere");
  EXPECT_EQ(c.checkpoint_every, 3);
  EXPECT_DOUBLE_EQ(c.lr, 2e-3);
  EXPECT_EQ(c.schedule.kind, ScheduleKind::Wsd);
}

TEST(RunConfig, ErrorsNameTheKey) {
  EXPECT_EQ(error_field(std::string(kBase) + "\n[optimiser]\nlr = 1\n"), "optimiser");
  EXPECT_EQ(error_field(kBase, {"run.stpes=3"}), "run.stpes");
  EXPECT_EQ(error_field(kBase, {"batch.sequences=\"many\""}), "batch.sequences");
  EXPECT_EQ(error_field(kBase, {"batch.seq_len=0"}), "batch.seq_len");
  EXPECT_EQ(error_field(kBase, {"schedule.kind=cosinus"}), "schedule.kind");
  EXPECT_EQ(error_field(kBase, {"optimizer.name=sgd"}), "optimizer.name");
  EXPECT_EQ(error_field(kBase, {"run.precision=\"fp16\""}), "run.precision");
  EXPECT_EQ(error_field(kBase, {"run.precision=16"}), "run.precision");
  EXPECT_EQ(error_field(kBase, {"run.recompute=\"layers\""}), "run.recompute");
  EXPECT_EQ(error_field(kBase, {"steps=3"}), "steps=3");
  EXPECT_EQ(error_field("[run]\nsteps = 3\n"), "model.config");
  EXPECT_EQ(error_field("[run\nsteps = 3\n"), "");  // not TOML at all: the file is named, no field
}

TEST(RunConfig, DistSectionIsTypedAndRoundTrips) {
  EXPECT_TRUE(parse_run_config(kBase, "run.toml").dist_overlap);
  const RunConfig c = parse_run_config(kBase, "run.toml", {"dist.overlap=false"});
  EXPECT_FALSE(c.dist_overlap);
  EXPECT_FALSE(parse_run_config(to_toml(c), "again.toml").dist_overlap);
  EXPECT_EQ(error_field(kBase, {"dist.overlap=\"yes\""}), "dist.overlap");
  EXPECT_EQ(error_field(kBase, {"dist.world=4"}), "dist.world");  // the world size comes from mpirun
}

TEST(RunConfig, SpikesGradNormSignalParsesRoundTripsAndIsChecked) {
  EXPECT_EQ(parse_run_config(kBase, "run.toml").spikes.grad_norm, GradNormSignal::WithLoss);
  RunConfig a = parse_run_config(kBase, "run.toml", {"spikes.grad_norm=alone", "spikes.threshold=7"});
  EXPECT_EQ(a.spikes.grad_norm, GradNormSignal::Alone);
  EXPECT_EQ(parse_run_config(to_toml(a), "again.toml").spikes.grad_norm, GradNormSignal::Alone);
  EXPECT_EQ(error_field(kBase, {"spikes.grad_norm=sometimes"}), "spikes.grad_norm");
  EXPECT_EQ(error_field(kBase, {"spikes.grad_norm=1"}), "spikes.grad_norm");
  // The [spikes] section alone (keel spikes): defaults from nothing, the same checks.
  const SpikeConfig only = parse_spike_config("", "x", {"spikes.grad_norm=off", "spikes.window=50"});
  EXPECT_EQ(only.grad_norm, GradNormSignal::Off);
  EXPECT_EQ(only.window, 50);
  EXPECT_DOUBLE_EQ(parse_spike_config(kBase, "run.toml").threshold, 6.0);
  EXPECT_THROW(parse_spike_config("", "x", {"spikes.threshold=-1"}), Error);
  EXPECT_THROW(parse_spike_config("[spikes]\nwindw = 3\n", "x"), Error);
}

TEST(RunConfig, TomlRoundTrip) {
  RunConfig a = parse_run_config(kBase, "run.toml");
  RunConfig b = parse_run_config(to_toml(a), "again.toml");
  EXPECT_EQ(to_toml(a), to_toml(b));
  EXPECT_EQ(b.schedule.hold_tokens, 100);
  EXPECT_EQ(b.model_set, a.model_set);
}

TEST(RunConfig, PrecisionDefaultsToFp32AndRoundTrips) {
  EXPECT_EQ(parse_run_config(kBase, "run.toml").precision, kernels::Precision::Fp32);
  RunConfig a = parse_run_config(kBase, "run.toml", {"run.precision=\"bf16\""});
  EXPECT_EQ(a.precision, kernels::Precision::Bf16);
  RunConfig b = parse_run_config(to_toml(a), "again.toml");
  EXPECT_EQ(b.precision, kernels::Precision::Bf16);
  EXPECT_NE(to_toml(a).find("bf16"), std::string::npos) << to_toml(a);
}

TEST(RunConfig, RecomputeDefaultsToNoneAndRoundTrips) {
  EXPECT_EQ(parse_run_config(kBase, "run.toml").recompute, nn::Recompute::None);
  RunConfig a = parse_run_config(kBase, "run.toml", {"run.recompute=\"blocks\""});
  EXPECT_EQ(a.recompute, nn::Recompute::Blocks);
  EXPECT_EQ(parse_run_config(to_toml(a), "again.toml").recompute, nn::Recompute::Blocks);
  EXPECT_EQ(parse_run_config(kBase, "run.toml", {"run.recompute=\"attention\""}).recompute, nn::Recompute::Attention);
}

TEST(RunConfig, Bf16ActivationsDefaultToAllAndRoundTrip) {
  EXPECT_EQ(parse_run_config(kBase, "run.toml").bf16_activations, "all");
  RunConfig a = parse_run_config(kBase, "run.toml", {"run.bf16_activations=\"fp32\""});
  EXPECT_EQ(a.bf16_activations, "fp32");
  EXPECT_EQ(parse_run_config(to_toml(a), "again.toml").bf16_activations, "fp32");
  RunConfig packed = parse_run_config(kBase, "run.toml", {"run.bf16_activations=\"packed\""});
  EXPECT_EQ(parse_run_config(to_toml(packed), "again.toml").bf16_activations, "packed");
  EXPECT_EQ(parse_run_config(to_toml(parse_run_config(kBase, "run.toml")), "again.toml").bf16_activations, "all");
  EXPECT_EQ(error_field(kBase, {"run.bf16_activations=\"fp16\""}), "run.bf16_activations");
}

TEST(RunConfig, LeanBlocksDefaultToTwoAndRoundTrip) {
  EXPECT_EQ(parse_run_config(kBase, "run.toml").lean_blocks, 2);
  RunConfig none = parse_run_config(kBase, "run.toml", {"run.lean_blocks=0"});
  EXPECT_EQ(none.lean_blocks, 0);
  EXPECT_EQ(parse_run_config(to_toml(none), "again.toml").lean_blocks, 0);
  EXPECT_EQ(error_field(kBase, {"run.lean_blocks=-1"}), "run.lean_blocks");
  EXPECT_EQ(error_field(kBase, {"run.lean_blocks=\"two\""}), "run.lean_blocks");
}

}  // namespace
}  // namespace keel::train
