// The lean top blocks of a bf16 step (TransformerModel::lean_block): attention a kv head at a
// time against the whole attention (its reference twin) in fp32, where only the order of fp32
// sums may differ; and whole models whose top blocks run lean against the same models with every
// block packed, under bf16 with bf16_activations = "all".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../kernels/gradient_check.hpp"
#include "keel/arch/config_file.hpp"
#include "keel/core/bf16.hpp"
#include "keel/kernels/precision.hpp"
#include "keel/kernels/rope.hpp"
#include "keel/nn/model.hpp"
#include "keel/nn/modules.hpp"
#include "two_steps.hpp"

namespace keel::nn {
namespace {

using keel::kernels::testing::random_vector;

// max |a - b| over max |b|: one number that a wrong slice or a missed group moves to order 1.
double max_relative(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

struct AttentionHarness {
  arch::ModelSpec spec;
  kernels::RopeTable rope;
  ParameterStore store;
  std::optional<Attention> attention;
  Arena arena;
  explicit AttentionHarness(const std::string& config)
      : spec(arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + config)) {
    rope = kernels::make_rope_table(spec.attention.rope.theta, spec.attention.rope.rotary_dim,
                                    spec.max_position_embeddings, spec.attention.rope.scaling, spec.source);
    attention.emplace(store, spec, 0, &rope);
    store.finalize();
    store.initialize(3, 0.2f);
    // Biases and QK-Norm gains away from their zeros and ones, so a slice read at the wrong
    // offset shows.
    for (const ParamInfo& p : store.entries()) {
      if (p.name.find("bias") != std::string::npos || p.name.find("norm") != std::string::npos) {
        const auto v = random_vector(size_t(p.numel), 11, 0.5f, 1.5f);
        std::copy(v.begin(), v.end(), store.values().data() + p.offset);
      }
    }
  }
};

class AttentionByKvHead : public testing::TestWithParam<const char*> {};

TEST_P(AttentionByKvHead, MatchesTheWholeAttentionForwardAndBackward) {
  AttentionHarness h(GetParam());
  Attention& attn = *h.attention;
  ASSERT_TRUE(attn.splits_by_kv_head());
  const StepShape s{2, 7};  // 7 rows a sequence: not a multiple of any block of the kernels
  const int64_t n = s.tokens(), hidden = h.spec.hidden_size, heads = h.spec.attention.num_heads;
  const auto xn = random_vector(size_t(n * hidden), 1);
  const auto dy = random_vector(size_t(n * hidden), 2);

  std::vector<float> max_whole(size_t(heads), -1e30f), max_split(size_t(heads), -1e30f);
  const float* y = attn.forward(h.store, h.arena, xn.data(), s, max_whole.data());
  const std::vector<float> y_whole(y, y + n * hidden);
  std::vector<float> dx_whole(size_t(n * hidden));
  h.store.zero_grad();
  attn.backward(h.store, h.arena, dy.data(), dx_whole.data(), s, kernels::GradWrite::Overwrite);
  const std::vector<float> grads_whole(h.store.grads().begin(), h.store.grads().end());
  h.arena.reset();

  std::vector<float> y_split(size_t(n * hidden), std::nanf("")), dx_split(size_t(n * hidden), std::nanf(""));
  attn.forward_by_kv_head(h.store, h.arena, xn.data(), s, max_split.data(), y_split.data());
  h.store.zero_grad();
  attn.backward_by_kv_head(h.store, h.arena, xn.data(), dy.data(), dx_split.data(), s);
  const std::vector<float> grads_split(h.store.grads().begin(), h.store.grads().end());

  EXPECT_LT(max_relative(y_split.data(), y_whole.data(), y_whole.size()), 1e-5);
  EXPECT_LT(max_relative(max_split.data(), max_whole.data(), max_whole.size()), 1e-6);
  EXPECT_LT(max_relative(dx_split.data(), dx_whole.data(), dx_whole.size()), 1e-5);
  // Every parameter's gradient, each on its own scale (a bias's gradient is not a weight's).
  for (const ParamInfo& p : h.store.entries()) {
    SCOPED_TRACE(p.name);
    const size_t at = size_t(p.offset), count = size_t(p.numel);
    ASSERT_GT(count, 0u);
    EXPECT_LT(max_relative(grads_split.data() + at, grads_whole.data() + at, count), 1e-5);
  }
}

// QK-Norm (Qwen3), q/k/v biases (Qwen2), both (llama_qknorm_bias), a sliding window and a
// logit soft-cap with Gemma's query scale (gemma2), a window alone (mistral_window).
INSTANTIATE_TEST_SUITE_P(Fixtures, AttentionByKvHead,
                         testing::Values("tests/fixtures/qwen3/config.json", "tests/fixtures/qwen2/config.json",
                                         "tests/fixtures/llama_qknorm_bias/config.json",
                                         "tests/fixtures/gemma2/config.json",
                                         "tests/fixtures/mistral_window/config.json"));

// A whole block, lean against its reference twin in fp32 on inputs that are bf16 values already
// (so that keeping them in bf16 words loses nothing): Block::forward_attention and
// Block::forward_mlp, then the backwards with the MLP's input rounded to bf16 as "all" keeps it,
// against forward_lean and backward_lean. 3 x
// 100 tokens: two runs of the MLP's rows, one of them short.
class LeanBlock : public testing::TestWithParam<const char*> {};

TEST_P(LeanBlock, MatchesTheBlockOnBf16Inputs) {
  const arch::ModelSpec spec = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + GetParam());
  const kernels::RopeTable rope = kernels::make_rope_table(spec.attention.rope.theta, spec.attention.rope.rotary_dim,
                                                           spec.max_position_embeddings, spec.attention.rope.scaling,
                                                           spec.source);
  ParameterStore store;
  Block block(store, spec, 0, &rope);
  store.finalize();
  store.initialize(3, 0.2f);
  for (const ParamInfo& p : store.entries()) {
    if (p.name.find("norm") != std::string::npos || p.name.find("bias") != std::string::npos) {
      const auto v = random_vector(size_t(p.numel), 13, 0.5f, 1.5f);
      std::copy(v.begin(), v.end(), store.values().data() + p.offset);
    }
  }
  ASSERT_TRUE(block.can_run_lean());
  const StepShape s{3, 100};
  const int64_t n = s.tokens(), hidden = spec.hidden_size, heads = spec.attention.num_heads;
  const size_t size = size_t(n * hidden);
  std::vector<float> x = random_vector(size, 1, -2.f, 2.f);
  kernels::round_to_bf16(x.data(), int64_t(size));
  const std::vector<float> dy = random_vector(size, 2);

  // The lean forward first: the reference backward reads the MLP's input as the lean block keeps
  // it (its words), so that both backwards start from the same bf16 values even where the split
  // o_proj's order of sums tips a rounding.
  Arena lean_arena, whole_arena;
  std::vector<float> max_whole(size_t(heads), -1e30f), max_lean(size_t(heads), -1e30f);
  std::vector<float> x_lean = x, x1_lean(size), out_lean(size);
  std::vector<uint16_t> x_words(size), x1_words(size);
  block.forward_lean(store, lean_arena, x_lean.data(), x1_lean.data(), out_lean.data(), s, max_lean.data(),
                     x_words.data(), x1_words.data());

  const float* x1 = block.forward_attention(store, whole_arena, x.data(), s, max_whole.data());
  const std::vector<float> x1_whole(x1, x1 + size);
  const float* out = block.forward_mlp(store, whole_arena, x1_whole.data(), s);
  const std::vector<float> out_whole(out, out + size);
  EXPECT_EQ(x_lean, x);  // read, not written
  for (size_t i = 0; i < size; ++i) EXPECT_EQ(x_words[i], float_to_bf16(x[i])) << i;
  EXPECT_LT(max_relative(x1_lean.data(), x1_whole.data(), size), 1e-5);
  EXPECT_LT(max_relative(out_lean.data(), out_whole.data(), size), 1e-5);
  EXPECT_LT(max_relative(max_lean.data(), max_whole.data(), max_whole.size()), 1e-6);
  std::vector<float> x1_kept(size);
  for (size_t i = 0; i < size; ++i) x1_kept[i] = bf16_to_float(x1_words[i]);
  std::vector<float> x1_rounded = x1_whole;
  kernels::round_to_bf16(x1_rounded.data(), int64_t(size));
  EXPECT_LT(max_relative(x1_kept.data(), x1_rounded.data(), size), 1e-2);  // at most a bf16 step apart

  // The backward of "all" reads the MLP's input rounded: the whole MLP's forward again from there.
  block.forward_mlp(store, whole_arena, x1_kept.data(), s);
  std::vector<float> grad_whole = dy;
  store.zero_grad();
  block.backward_mlp(store, whole_arena, grad_whole.data(), s);
  block.backward_attention(store, whole_arena, grad_whole.data(), s);
  const std::vector<float> grads_whole(store.grads().begin(), store.grads().end());

  std::vector<float> grad_lean = dy;
  store.zero_grad();
  block.backward_lean(store, lean_arena, grad_lean.data(), s, x_words.data(), x1_words.data());
  EXPECT_LT(max_relative(grad_lean.data(), grad_whole.data(), size), 1e-5);
  for (const ParamInfo& p : store.entries()) {
    SCOPED_TRACE(p.name);
    EXPECT_LT(max_relative(store.grads().data() + p.offset, grads_whole.data() + p.offset, size_t(p.numel)), 1e-5);
  }
  // A second backward adds to the gradients (accumulation over micro-batches): twice the first.
  const std::vector<float> once(store.grads().begin(), store.grads().end());
  std::vector<float> grad_again = dy;
  block.backward_lean(store, lean_arena, grad_again.data(), s, x_words.data(), x1_words.data());
  std::vector<float> twice(once.size());
  for (size_t i = 0; i < once.size(); ++i) twice[i] = 2 * once[i];
  EXPECT_LT(max_relative(store.grads().data(), twice.data(), twice.size()), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LeanBlock,
                         testing::Values("tests/fixtures/qwen3/config.json", "tests/fixtures/qwen2/config.json",
                                         "tests/fixtures/llama_qknorm_bias/config.json",
                                         "tests/fixtures/mistral_window/config.json"));

using two_steps::TwoSteps;

TwoSteps run_lean(const std::string& config, size_t lean_blocks, kernels::Precision precision, int64_t batch,
                  int64_t seq, const std::vector<std::string>& overrides) {
  return two_steps::run_two_steps(config, [&](TransformerModel& m) {
    m.set_precision(precision);
    m.set_bf16_activations(Bf16Activations::All);
    m.set_lean_top_blocks(lean_blocks);
  }, batch, seq, overrides);
}

using two_steps::relative_distance;

// The lean blocks keep what the packed ones' backward reads under "all" (the block input and the
// sum after the attention rounded to bf16) and recompute the rest from it, where a packed block
// keeps its forward's own values: the forward keeps its bits, and the gradients move by less
// than bf16's own products move them from fp32.
class LeanTopBlocks : public testing::TestWithParam<const char*> {};

TEST_P(LeanTopBlocks, TrackTheBlocksPackedWhole) {
  const std::vector<std::string> layers = {"num_hidden_layers=4"};
  const TwoSteps packed = run_lean(GetParam(), 0, kernels::Precision::Bf16, 3, 100, layers);
  const TwoSteps fp32 = two_steps::run_two_steps(GetParam(), [](TransformerModel&) {}, 3, 100, layers);
  const double bf16_moves = relative_distance(packed.grads, fp32.grads);
  for (size_t lean : {size_t{1}, size_t{2}, size_t{4}}) {
    SCOPED_TRACE("lean blocks: " + std::to_string(lean));
    const TwoSteps r = run_lean(GetParam(), lean, kernels::Precision::Bf16, 3, 100, layers);
    ASSERT_EQ(r.grads.size(), packed.grads.size());
    ASSERT_TRUE(std::all_of(r.grads.begin(), r.grads.end(), [](float g) { return std::isfinite(g); }));
    EXPECT_LT(std::abs(r.ce - packed.ce), 1e-6 * std::abs(packed.ce));
    EXPECT_LT(max_relative(r.max_logits.data(), packed.max_logits.data(), packed.max_logits.size()), 1e-6);
    const double moved = relative_distance(r.grads, packed.grads);
    std::printf("[lean %zu] gradients moved %.2e, bf16 against fp32 %.2e\n", lean, moved, bf16_moves);
    EXPECT_LT(moved, bf16_moves);  // measured 0.30-0.85x
    // Tensor by tensor, the same direction: a slice's gradient dropped or misplaced would not be.
    const TransformerModel model(arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + GetParam(), layers));
    for (const ParamInfo& p : model.parameters().entries()) {
      double dot = 0, na = 0, nb = 0;
      for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
        dot += double(r.grads[size_t(i)]) * packed.grads[size_t(i)];
        na += double(r.grads[size_t(i)]) * r.grads[size_t(i)];
        nb += double(packed.grads[size_t(i)]) * packed.grads[size_t(i)];
      }
      if (nb == 0) continue;  // no gradient in either (a buffer)
      EXPECT_GT(dot / std::sqrt(na * nb), 0.999) << p.name;
    }
    // Fewer blocks packed, so fewer packed bytes: the lean blocks keep two bf16 tensors and no stretch.
    EXPECT_LT(r.packed_fp32, packed.packed_fp32);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LeanTopBlocks,
                         testing::Values("tests/fixtures/qwen3/config.json", "tests/fixtures/qwen2/config.json",
                                         "tests/fixtures/mistral_window/config.json"));

// Blocks that cannot run lean stay packed whole, bit for bit: GPT-2's fused c_attn, gpt-oss's
// sinks, Qwen3-Next's output gate, OLMo 2's full-width QK-Norm and post-sublayer norms, Gemma 2's
// sandwich norms, Mixtral's MoE, DeepSeek-V3's MLA; and a block that could, under one that
// cannot (Qwen3-MoE's dense first layer).
TEST(LeanTopBlocks, LeaveBlocksThatCannotSplitPacked) {
  for (const char* config : {"tests/fixtures/gpt2/config.json", "tests/fixtures/gpt_oss/config.json",
                             "tests/fixtures/qwen3_gate/config.json", "tests/fixtures/olmo2/config.json",
                             "tests/fixtures/gemma2/config.json", "tests/fixtures/mixtral/config.json",
                             "tests/fixtures/deepseek_v3/config.json",
                             // a dense block under an MoE top block: lean would save nothing there
                             "tests/fixtures/qwen3_moe/config.json"}) {
    SCOPED_TRACE(config);
    const TwoSteps lean = run_lean(config, 2, kernels::Precision::Bf16, 2, 8, {});
    const TwoSteps packed = run_lean(config, 0, kernels::Precision::Bf16, 2, 8, {});
    two_steps::expect_same_step(lean, packed);
    EXPECT_EQ(lean.packed_fp32, packed.packed_fp32);
  }
}

// Without bf16 packing (fp32, or bf16 storage in fp32 slots) no block runs lean: the same bits.
TEST(LeanTopBlocks, OnlyUnderBf16AllWithoutRecomputation) {
  const std::string config = "tests/fixtures/qwen3/config.json";
  two_steps::expect_same_step(run_lean(config, 2, kernels::Precision::Fp32, 2, 8, {}),
                              run_lean(config, 0, kernels::Precision::Fp32, 2, 8, {}));
  for (Bf16Activations storage : {Bf16Activations::Fp32, Bf16Activations::Packed}) {
    auto setup = [storage](size_t lean) {
      return [storage, lean](TransformerModel& m) {
        m.set_precision(kernels::Precision::Bf16);
        m.set_bf16_activations(storage);
        m.set_lean_top_blocks(lean);
      };
    };
    two_steps::expect_same_step(two_steps::run_two_steps(config, setup(2), 2, 8),
                                two_steps::run_two_steps(config, setup(0), 2, 8));
  }
  for (Recompute r : {Recompute::Attention, Recompute::Blocks}) {
    auto setup = [r](size_t lean) {
      return [r, lean](TransformerModel& m) {
        m.set_precision(kernels::Precision::Bf16);
        m.set_recompute(r);
        m.set_lean_top_blocks(lean);
      };
    };
    two_steps::expect_same_step(two_steps::run_two_steps(config, setup(2), 2, 8),
                                two_steps::run_two_steps(config, setup(0), 2, 8));
  }
}

}  // namespace
}  // namespace keel::nn
