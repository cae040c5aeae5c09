// Activation recomputation recomputes the same values: gradients, loss and the recorded stats are
// bit-identical with none, attention and blocks, while the activations held shrink.
#include "keel/nn/model.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "keel/arch/config_file.hpp"

namespace keel::nn {
namespace {

struct Result {
  std::vector<float> grads, max_logits, expert_load;
  std::vector<double> activation_ms;
  double ce = 0;
  size_t activation_bytes = 0;
};

Result run(const std::string& config, Recompute r, int64_t batch, int64_t seq) {
  TransformerModel model(arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + config));
  model.initialize(5);
  model.set_recompute(r);
  const int64_t n = batch * seq;
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    tokens[size_t(i)] = static_cast<int32_t>((i * 31 + 7) % model.spec().vocab_size);
    targets[size_t(i)] = static_cast<int32_t>((i * 17 + 3) % model.spec().vocab_size);
  }
  Result out;
  // Two steps: the second runs on the arena folded after the first, as training does.
  for (int step = 0; step < 2; ++step) {
    model.parameters().zero_grad();
    out.ce = model.forward_backward(tokens.data(), targets.data(), batch, seq, 1.0f / float(n)).ce_sum;
  }
  out.grads.assign(model.parameters().grads().begin(), model.parameters().grads().end());
  out.max_logits = model.max_logits();
  out.expert_load = model.expert_load();
  out.activation_ms = model.activation_mean_square();
  out.activation_bytes = model.activation_capacity_bytes();
  return out;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << a.size() << " differ";
}

class RecomputeMatches : public testing::TestWithParam<const char*> {};

TEST_P(RecomputeMatches, AttentionAndBlocksGiveTheBitsOfNone) {
  const Result none = run(GetParam(), Recompute::None, 3, 8);
  for (Recompute r : {Recompute::Attention, Recompute::Blocks}) {
    SCOPED_TRACE(std::string(recompute_name(r)));
    const Result other = run(GetParam(), r, 3, 8);
    EXPECT_EQ(none.ce, other.ce);
    expect_same_bits(none.grads, other.grads, "gradients");
    expect_same_bits(none.max_logits, other.max_logits, "max logits");
    expect_same_bits(none.expert_load, other.expert_load, "expert load");
    EXPECT_EQ(none.activation_ms, other.activation_ms);
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
  const size_t none = run(config, Recompute::None, 2, 128).activation_bytes;
  const size_t attention = run(config, Recompute::Attention, 2, 128).activation_bytes;
  const size_t blocks = run(config, Recompute::Blocks, 2, 128).activation_bytes;
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
