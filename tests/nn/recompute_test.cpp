// Activation recomputation recomputes the same values: gradients, loss and the recorded stats are
// bit-identical with none, attention and blocks, while the activations held shrink.
#include "keel/nn/model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
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

// What the step holds without recomputation, counted by hand (floats per token; qwen3_small,
// fp32, 2 x 128 tokens): the embedding output, the pre-norms' shared output buffer
// (SharedNormed) and, per block, q_raw, k_raw, v, the attention output, the mid-block residual
// sum and the block's output (in the places of o_proj's and down_proj's products), gate and up;
// then the final norm's output, which goes on as the one buffer of the blocks' gradient (the loss's gradient is given back once the
// norm's backward has read it); on top, the larger sublayer backward, whose own gradient is that
// buffer (the MLP's: dh / dup and the norm's input gradient, the recomputed h in up's place; the
// attention's: d_out, dk, dv, then q and k recomputed, whose place dq_raw and dk_raw take, the
// norm's input gradient; dq in the attention output's place). Per-row statistics (rstd, log-sum-exps) and 64-byte padding are
// the rest, under 1%. A kept hidden activation, a second copy of q and k, a buffer per residual
// sum or per block gradient, a normed input per sublayer, or sublayer temporaries held together
// would each add 5-20%.
TEST(ActivationArena, HoldsWhatTheBackwardReadsCountedByHand) {
  const char* config = "bench/configs/qwen3_small.json";
  const arch::ModelSpec s = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + config);
  const double h = double(s.hidden_size), I = double(s.mlp.intermediate_size);
  const double q = double(s.attention.num_heads * s.attention.head_dim);
  const double kv = double(s.attention.num_kv_heads * s.attention.head_dim);
  const double block = 2 * h + 2 * q + 2 * kv + 2 * I;
  const double backward = std::max(h + I, h + 2 * q + 3 * kv);
  const double per_token = h + h + double(s.num_layers) * block + h + backward;
  const double counted = per_token * 256 * sizeof(float);
  const double arena = double(run(config, Recompute::None, 2, 128).arena);
  EXPECT_GE(arena, counted);
  EXPECT_LE(arena, 1.01 * counted) << arena / counted;
}

TEST(Recompute, NamesRoundTrip) {
  for (Recompute r : {Recompute::None, Recompute::Attention, Recompute::Blocks}) {
    EXPECT_EQ(parse_recompute(recompute_name(r)), r);
  }
  EXPECT_FALSE(parse_recompute("layers").has_value());
}

}  // namespace
}  // namespace keel::nn
