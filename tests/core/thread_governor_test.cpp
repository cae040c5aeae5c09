// The thread governor sizes the team to the cores the machine leaves free, with hysteresis; and
// changing the team never changes a training step's numbers.
#include "keel/core/thread_governor.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <string>
#include <vector>

#include "keel/arch/config_file.hpp"
#include "keel/nn/model.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/grad_clip.hpp"

namespace keel {
namespace {

TEST(ThreadGovernor, GivesUpAThreadToABusyCoreAndTakesItBackWhenFree) {
  ThreadGovernor g(2, 2, true);
  EXPECT_EQ(g.threads(), 2);
  EXPECT_EQ(g.decide(0.0), 2);
  EXPECT_EQ(g.decide(1.0), 2);  // smoothed: 0.5 so far, inside the band
  EXPECT_EQ(g.decide(1.0), 1);  // 0.75 of a core used by others: one thread
  EXPECT_EQ(g.decide(0.45), 1);  // 0.6: still inside the band, no flip
  EXPECT_EQ(g.decide(0.2), 1);   // 0.4
  EXPECT_EQ(g.decide(0.0), 2);   // 0.2: the core is back
}

TEST(ThreadGovernor, NeverBelowOneNorAboveWhatWasAskedFor) {
  ThreadGovernor g(4, 16, true);
  EXPECT_EQ(g.decide(8.0), 4);  // 8 of 16 cores left: still more than the 4 asked for
  ThreadGovernor small(2, 2, true);
  for (int i = 0; i < 5; ++i) small.decide(3.0);
  EXPECT_EQ(small.threads(), 1);
}

TEST(ThreadGovernor, DisabledKeepsTheTeam) {
  ThreadGovernor g(2, 2, false);
  EXPECT_FALSE(g.enabled());
  EXPECT_EQ(g.step_boundary(), 2);
  ThreadGovernor one(1, 2, true);  // one thread asked for: nothing to govern
  EXPECT_FALSE(one.enabled());
}

TEST(ThreadGovernor, SamplesThisMachine) {
  const CpuSample a = sample_cpu();
  ASSERT_TRUE(a.valid);  // Linux CI: /proc/stat exists
  volatile double x = 0;
  for (int i = 0; i < 20000000; ++i) x = x + 1e-9 * i;
  const CpuSample b = sample_cpu();
  EXPECT_GT(b.self_cpu_s, a.self_cpu_s);
  EXPECT_GE(b.machine_busy_s, a.machine_busy_s);
}

// One training step (forward, backward, clip, AdamW) at a shape where GEMMs are cut into
// panels, attention has many tasks and the sums many chunks; with a team of 1 and of 2.
struct StepResult {
  std::vector<float> grads, values;
  double ce = 0;
};

StepResult one_step(const std::string& config, const std::vector<std::string>& sets, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  nn::TransformerModel model(arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + config, sets));
  model.initialize(3);
  const int64_t batch = 2, seq = 96, n = batch * seq;
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    tokens[size_t(i)] = static_cast<int32_t>((i * 7919 + 13) % model.spec().vocab_size);
    targets[size_t(i)] = static_cast<int32_t>((i * 104729 + 5) % model.spec().vocab_size);
  }
  auto& store = model.parameters();
  optim::AdamW adamw(store, optim::AdamWConfig{});
  store.zero_grad();
  const auto sums = model.forward_backward(tokens.data(), targets.data(), batch, seq, 1.0f / float(n));
  StepResult r;
  r.ce = sums.ce_sum;
  r.grads.assign(store.grads().begin(), store.grads().end());
  optim::clip_grad_norm(store.grads(), 0.5);
  adamw.step(store, 1e-3f);
  r.values.assign(store.values().begin(), store.values().end());
  omp_set_num_threads(saved);
  return r;
}

class TeamSizeInvariance : public testing::TestWithParam<const char*> {};

TEST_P(TeamSizeInvariance, OneThreadAndTwoGiveTheSameBits) {
  const std::vector<std::string> sets = {"num_hidden_layers=2"};
  const std::string config = GetParam();
  const bool gpt2 = config.find("gpt2") != std::string::npos;
  const StepResult one = one_step(config, gpt2 ? std::vector<std::string>{"n_layer=2"} : sets, 1);
  const StepResult two = one_step(config, gpt2 ? std::vector<std::string>{"n_layer=2"} : sets, 2);
  EXPECT_EQ(one.ce, two.ce);
  ASSERT_EQ(one.grads.size(), two.grads.size());
  size_t differ = 0;
  for (size_t i = 0; i < one.grads.size(); ++i) differ += std::memcmp(&one.grads[i], &two.grads[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "gradients differing between 1 and 2 threads, of " << one.grads.size();
  differ = 0;
  for (size_t i = 0; i < one.values.size(); ++i) differ += std::memcmp(&one.values[i], &two.values[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "updated weights differing between 1 and 2 threads";
}

INSTANTIATE_TEST_SUITE_P(Families, TeamSizeInvariance,
                         testing::Values("bench/configs/qwen3_small.json", "bench/configs/gpt2_small.json",
                                         "bench/configs/mixtral_small.json", "bench/configs/mla_small.json",
                                         "tests/fixtures/gpt_oss/config.json"));

}  // namespace
}  // namespace keel
