// A step without bf16 packing writes every pre-norm's output into one shared buffer
// (SharedNormed) and the backward writes it again from the norm's input and statistics: the same
// bits as a slot per sublayer, one hidden-wide slot a sublayer fewer but one.
#include <gtest/gtest.h>

#include <string>

#include "keel/arch/config_file.hpp"
#include "keel/nn/model.hpp"
#include "two_steps.hpp"

namespace keel::nn {
namespace {

using two_steps::TwoSteps;

struct Mode {
  const char* name;
  kernels::Precision precision;
  Recompute recompute;
};

TwoSteps run(const std::string& config, const Mode& mode, bool share, int64_t batch = 3, int64_t seq = 8) {
  return two_steps::run_two_steps(
      config,
      [&](TransformerModel& m) {
        m.set_precision(mode.precision);
        // bf16 products with their values in fp32 slots: no packing, so the buffer is shared.
        m.set_bf16_activations(Bf16Activations::Fp32);
        m.set_recompute(mode.recompute);
        m.set_share_normed_outputs(share);
      },
      batch, seq);
}

class SharedNormedMatches : public testing::TestWithParam<const char*> {};

// Loss, max logits, expert loads, activation RMS and gradients bit for bit (thirteen families:
// gated attention output, attention sinks, MoE with shared experts, OLMo 2's norms after the
// branches among them), in every
// recomputation (blocks and attention recompute over the buffer, and the MLP's backward finds
// it holding another sublayer's output), and never more memory.
TEST_P(SharedNormedMatches, GivesTheBitsOfASlotPerSublayer) {
  for (const Mode& mode : {Mode{"fp32", kernels::Precision::Fp32, Recompute::None},
                           Mode{"fp32 attention", kernels::Precision::Fp32, Recompute::Attention},
                           Mode{"fp32 blocks", kernels::Precision::Fp32, Recompute::Blocks},
                           Mode{"bf16 in fp32 slots", kernels::Precision::Bf16, Recompute::None},
                           Mode{"bf16 in fp32 slots, blocks", kernels::Precision::Bf16, Recompute::Blocks}}) {
    SCOPED_TRACE(mode.name);
    const TwoSteps slots = run(GetParam(), mode, false);
    const TwoSteps shared = run(GetParam(), mode, true);
    two_steps::expect_same_step(slots, shared);
    EXPECT_LE(shared.arena, slots.arena);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, SharedNormedMatches,
                         testing::Values("tests/fixtures/qwen3/config.json", "tests/fixtures/gpt2/config.json",
                                         "tests/fixtures/mixtral/config.json", "tests/fixtures/deepseek_v3/config.json",
                                         "tests/fixtures/gpt_oss/config.json", "tests/fixtures/llama_sandwich/config.json",
                                         "tests/fixtures/llama_layernorm_post/config.json",
                                         "tests/fixtures/gemma2/config.json", "tests/fixtures/qwen3_gate/config.json",
                                         "tests/fixtures/qwen3_sinks/config.json", "tests/fixtures/qwen3_moe/config.json",
                                         "tests/fixtures/glm4_moe/config.json", "tests/fixtures/olmo2/config.json"));

// What the buffer saves without recomputation, counted: each of the 2L pre-norms' outputs had a
// hidden-wide slot, and the buffer is one: (2L - 1) × hidden floats a token (qwen3_small, 4
// layers of hidden 256, 2 × 128 tokens; every slot a multiple of the arena's 64-byte padding).
TEST(SharedNormed, SavesAHiddenWideSlotPerPreNormButOne) {
  const std::string config = "bench/configs/qwen3_small.json";
  const arch::ModelSpec s = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + config);
  const Mode fp32{"fp32", kernels::Precision::Fp32, Recompute::None};
  const double slots = double(run(config, fp32, false, 2, 128).arena);
  const double shared = double(run(config, fp32, true, 2, 128).arena);
  const double saved_per_token = double(2 * s.num_layers - 1) * double(s.hidden_size) * sizeof(float);
  EXPECT_EQ(slots - shared, saved_per_token * 256);
  EXPECT_LT(shared, 0.9 * slots);  // 7 of the step's 58.5 hidden-wide slots a token
}

}  // namespace
}  // namespace keel::nn
