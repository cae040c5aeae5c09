// Activation recomputation recomputes the same values: gradients, loss and the recorded stats are
// bit-identical with none, attention and blocks, while the activations held shrink.
#include "keel/nn/model.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "keel/arch/config_file.hpp"
#include "two_steps.hpp"

namespace keel::nn {
namespace {

using two_steps::TwoSteps;

TwoSteps run(const std::string& config, Recompute r, int64_t batch, int64_t seq) {
  return two_steps::run_two_steps(config, [&](TransformerModel& m) { m.set_recompute(r); }, batch, seq);
}

class RecomputeMatches : public testing::TestWithParam<const char*> {};

TEST_P(RecomputeMatches, AttentionAndBlocksGiveTheBitsOfNone) {
  const TwoSteps none = run(GetParam(), Recompute::None, 3, 8);
  for (Recompute r : {Recompute::Attention, Recompute::Blocks}) {
    SCOPED_TRACE(std::string(recompute_name(r)));
    const TwoSteps other = run(GetParam(), r, 3, 8);
    two_steps::expect_same_step(none, other);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, RecomputeMatches,
                         testing::Values("tests/fixtures/qwen3/config.json", "tests/fixtures/gpt2/config.json",
                                         "tests/fixtures/mixtral/config.json", "tests/fixtures/deepseek_v3/config.json",
                                         "tests/fixtures/gpt_oss/config.json", "tests/fixtures/llama_sandwich/config.json",
                                         "tests/fixtures/llama_layernorm_post/config.json",
                                         "tests/fixtures/gemma2/config.json"));

// What recomputation is for: fewer activations held. A 4-layer model at 2 x 128 tokens.
TEST(Recompute, HoldsFewerActivations) {
  const char* config = "bench/configs/qwen3_small.json";
  const size_t none = run(config, Recompute::None, 2, 128).arena;
  const size_t attention = run(config, Recompute::Attention, 2, 128).arena;
  const size_t blocks = run(config, Recompute::Blocks, 2, 128).arena;
  EXPECT_LT(attention, none);
  EXPECT_LT(blocks, attention);
  EXPECT_LT(double(blocks), 0.7 * double(none)) << none << " -> " << blocks;
}

TEST(Recompute, NamesRoundTrip) {
  for (Recompute r : {Recompute::None, Recompute::Attention, Recompute::Blocks}) {
    EXPECT_EQ(parse_recompute(recompute_name(r)), r);
  }
  EXPECT_FALSE(parse_recompute("layers").has_value());
}

}  // namespace
}  // namespace keel::nn
