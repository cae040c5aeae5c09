// bf16 activation storage: packing is exact for bf16 values, lossless for training (gradients
// and recorded stats bit-identical to keeping the same bf16 values in fp32 slots, for every kind
// of block and with attention recomputation), and the arena holds fewer bytes for it.
#include "keel/nn/model.hpp"

#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "keel/arch/config_file.hpp"
#include "keel/core/bf16.hpp"
#include "keel/core/rng.hpp"
#include "keel/kernels/precision.hpp"
#include "two_steps.hpp"

namespace keel::nn {
namespace {

std::vector<float> random_values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(uniform_int_at(seed, 0, static_cast<uint64_t>(i), 1u << 30)) / (1 << 30);
    v[static_cast<size_t>(i)] = static_cast<float>(std::ldexp(u - 0.5, static_cast<int>(i % 40) - 20));
  }
  return v;
}

TEST(PackBf16, RoundTripsBf16ValuesExactlyInPlaceAndShifted) {
  // Lengths around the conversion chunk (4,096) and odd ones, packed onto themselves and onto a
  // place a few values lower (as compaction moves a tensor down), then unpacked back up: the
  // overlapping moves must never overwrite a value before it is read.
  for (int64_t n : {0, 1, 7, 4095, 4096, 4097, 3 * 4096 + 5}) {
    for (int64_t shift : {0, 1, 3, 5000}) {
      SCOPED_TRACE(std::to_string(n) + " values, shift " + std::to_string(shift));
      std::vector<float> buf(static_cast<size_t>(n + shift) + 1);
      float* x = buf.data() + shift;
      const std::vector<float> v = random_values(n, 3);
      std::copy(v.begin(), v.end(), x);
      kernels::round_to_bf16(x, n);
      const std::vector<float> want(x, x + n);
      auto* packed = reinterpret_cast<uint16_t*>(buf.data()) + shift;  // shift x 2 bytes below x
      kernels::pack_bf16(x, packed, n);
      std::vector<uint16_t> bits(static_cast<size_t>(n));
      if (n > 0) std::memcpy(bits.data(), packed, bits.size() * sizeof(uint16_t));
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits[size_t(i)], float_to_bf16(want[size_t(i)])) << i;
      kernels::unpack_bf16(packed, x, n);
      ASSERT_TRUE(n == 0 || std::memcmp(x, want.data(), sizeof(float) * static_cast<size_t>(n)) == 0);
    }
  }
}

TEST(PackBf16, RoundsValuesThatAreNotBf16ToNearestEven) {
  std::vector<float> x = {1.0f + 1.0f / 256 + 1.0f / 512, 1.0f + 1.0f / 256, 3.14159265f, -2.0e-3f};
  std::vector<float> want = x;
  kernels::round_to_bf16(want.data(), 4);
  std::vector<uint16_t> packed(4);
  kernels::pack_bf16(x.data(), packed.data(), 4);
  kernels::unpack_bf16(packed.data(), x.data(), 4);
  EXPECT_EQ(x, want);
  EXPECT_EQ(x[0], 1.0f + 2.0f / 256);  // the tie goes to even
  EXPECT_EQ(x[1], 1.0f);
}

TEST(Bf16Capture, RecordsRoundedTensorsOnlyUnderBf16) {
  std::vector<float> a(8, 1.1f), b(4, 2.2f);
  std::vector<kernels::FloatSpan> seen;
  {
    kernels::Bf16Capture capture(&seen);
    kernels::round_activation(a.data(), 8);  // fp32: nothing rounded, nothing recorded
    kernels::PrecisionScope bf16(kernels::Precision::Bf16);
    kernels::round_activation(b.data(), 4);
  }
  kernels::PrecisionScope bf16(kernels::Precision::Bf16);
  kernels::round_activation(a.data(), 8);  // no capture alive
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].data, b.data());
  EXPECT_EQ(seen[0].count, 4);
}

TEST(Bf16Capture, UnroundForgetsExactlyTheSpansItOverlaps) {
  // A residual sum written over a rounded projection output: that span (and only spans touching
  // the range) leave the list, so packing copies them in fp32.
  std::vector<float> buf(64, 1.1f);
  float* x = buf.data();
  std::vector<kernels::FloatSpan> seen;
  kernels::Bf16Capture capture(&seen);
  kernels::PrecisionScope bf16(kernels::Precision::Bf16);
  kernels::round_activation(x, 8);        // [0, 8)
  kernels::round_activation(x + 8, 8);    // [8, 16): the sum goes here
  kernels::round_activation(x + 16, 8);   // [16, 24)
  kernels::round_activation(x + 30, 10);  // [30, 40): overlaps [36, 44) partly
  kernels::unround_activation(x + 8, 8);
  kernels::unround_activation(x + 36, 8);
  kernels::unround_activation(x + 50, 4);  // nothing recorded there
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].data, x);
  EXPECT_EQ(seen[1].data, x + 16);
  EXPECT_EQ(seen[1].count, 8);
}

TEST(Bf16Capture, KeepsResidualTensorsUnroundedAndOnlyWhenAskedTo) {
  std::vector<float> a(8, 1.1f), b(4, 2.2f);
  std::vector<kernels::FloatSpan> exact, all;
  kernels::PrecisionScope bf16(kernels::Precision::Bf16);
  {
    kernels::Bf16Capture capture(&exact);
    kernels::keep_residual_as_bf16(a.data(), 8);  // bf16_activations = "packed": not recorded
    {
      kernels::Bf16Capture inner(&all, /*residual_too=*/true);
      kernels::keep_residual_as_bf16(b.data(), 4);
    }
    kernels::keep_residual_as_bf16(a.data(), 8);  // the outer scope's setting is back
  }
  kernels::keep_residual_as_bf16(a.data(), 8);  // no capture alive
  EXPECT_TRUE(exact.empty());
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].data, b.data());
  EXPECT_EQ(all[0].count, 4);
  EXPECT_EQ(b[0], 2.2f);  // recorded as it is: packing rounds the kept copy, not the forward's value
}

// A stretch the arena could not give as one run of memory (no reserved address space, a block
// added mid-forward) is not compacted, but what packing would round is rounded in place, so a
// step reads the same values whatever the arena's layout; a dropped tensor is left alone.
TEST(PackedActivations, StretchAcrossArenaBlocksRoundsInPlace) {
  Arena arena;  // grows block by block
  arena.alloc(16);
  const Arena::Mark mark = arena.mark();
  float* residual = arena.alloc(1 << 17);  // larger than the first block: a second one
  float* out = arena.alloc(8);
  ASSERT_FALSE(arena.contiguous_since(mark));
  const std::vector<float> v = random_values(1 << 17, 7);
  std::copy(v.begin(), v.end(), residual);
  std::fill(out, out + 8, 1.0f + 1.0f / 1024);  // not a bf16 value
  PackedActivations packed;
  packed.start(2);
  packed.capture(0)->push_back({residual, 1 << 17});
  packed.capture(0)->push_back({out, 8});
  packed.unused(0)->push_back({out, 8});
  packed.pack(0, arena, mark);
  std::vector<float> want = v;
  kernels::round_to_bf16(want.data(), 1 << 17);
  EXPECT_EQ(0, std::memcmp(residual, want.data(), sizeof(float) * want.size()));
  EXPECT_NE(v, want);  // the rounding did something
  EXPECT_EQ(out[0], 1.0f + 1.0f / 1024);
  EXPECT_EQ(packed.compacted_bytes(), 0u);
  packed.unpack(0);  // nothing was packed: nothing moves
  EXPECT_EQ(0, std::memcmp(residual, want.data(), sizeof(float) * want.size()));
}

TEST(PackedActivations, WavesCoverEachPieceOnceAndNeverWriteWhereTheirOwnValuesAreRead) {
  // The schedule move_piece runs, checked against its invariant for every kind of piece: waves
  // tile [0, count) in the order of the move (up when packing, down when expanding), and in a
  // wave the team splits, no value is written where a value of the same wave is still to be read:
  // with values at `from + 4·i` (fp32 place) and `to + elem·i` (compacted), gap = from - to, the
  // wave [b, e) needs elem·e <= gap + 4·b in both directions. An off-by-one in either bound fails.
  constexpr int64_t s = detail::kWaveSlice;
  for (bool pack : {true, false}) {
    for (size_t elem : {size_t{2}, size_t{4}}) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, 2 * s - 1, 2 * s, 2 * s + 1, 5 * s + 3,
                            int64_t{1} << 20, int64_t{3000001}}) {
        for (int64_t gap : {int64_t{0}, int64_t{2}, int64_t{6}, 4 * s + 2, 8 * s, 3 * s * 4 + 2, int64_t{2097152},
                            int64_t{10485762}, int64_t{1} << 26}) {
          if (elem == 4 && gap == 0) continue;  // an fp32 piece in place does not move
          SCOPED_TRACE(std::string(pack ? "pack" : "expand") + " elem " + std::to_string(elem) + " count " +
                       std::to_string(count) + " gap " + std::to_string(gap));
          const std::vector<detail::Wave> waves = detail::piece_waves(pack, count, gap, elem);
          int64_t at = pack ? 0 : count;
          for (const detail::Wave& w : waves) {
            ASSERT_LT(w.begin, w.end);
            ASSERT_EQ(pack ? w.begin : w.end, at);
            at = pack ? w.end : w.begin;
            if (w.split) {
              ASSERT_LE(static_cast<int64_t>(elem) * w.end, gap + 4 * w.begin);
            }
          }
          ASSERT_EQ(at, pack ? count : 0);
          EXPECT_LE(static_cast<int64_t>(waves.size()), count / (2 * s) + 64);
        }
      }
    }
  }
  // An overlapping bf16 piece is split but for its first two slices: a 12 MB piece at gap 0 (the
  // first of a stretch) then moves in waves that double in length.
  int64_t split = 0;
  for (const detail::Wave& w : detail::piece_waves(true, 3000000, 0, 2)) split += w.split ? w.end - w.begin : 0;
  EXPECT_EQ(split, 3000000 - 2 * s);
}

TEST(PackedActivations, LargeOverlappingPiecesMoveInWavesExactly) {
  // Pieces large enough that the team moves them in waves (move_piece): a bf16 tensor at gap 0
  // (the stretch's first piece, its compacted place overlapping its own), an fp32 piece shifted
  // by less than its length, a dropped tensor, a bf16 tensor overlapping its place by a part, and
  // small odd ones. After packing, everything above the compacted copy is overwritten (later
  // blocks' stretches); expanding must give back every value: bf16 tensors as rounded, the rest
  // bit for bit, the dropped one as NaN.
  Arena arena;
  ASSERT_TRUE(arena.reserve_address_space(size_t{1} << 30));
  arena.alloc(16);
  const Arena::Mark mark = arena.mark();
  struct Tensor {
    int64_t count;
    char kind;  // 'b' bf16, 'f' fp32, 'd' dropped
    float* at = nullptr;
  };
  std::vector<Tensor> tensors = {{1 << 20, 'b'}, {1500000, 'f'}, {200000, 'd'}, {3000000, 'b'},
                                 {12345, 'b'},   {777, 'f'},     {600000, 'b'}};
  PackedActivations packed;
  packed.start(2);
  std::vector<std::vector<float>> want;
  uint64_t seed = 11;
  for (Tensor& t : tensors) {
    t.at = arena.alloc(static_cast<size_t>(t.count));
    std::vector<float> v = random_values(t.count, ++seed);
    if (t.kind == 'b') {
      kernels::round_to_bf16(v.data(), t.count);
      packed.capture(0)->push_back({t.at, t.count});
    }
    if (t.kind == 'd') packed.unused(0)->push_back({t.at, t.count});
    std::copy(v.begin(), v.end(), t.at);
    want.push_back(std::move(v));
  }
  float* end = arena.top();
  struct TeamOfFour {  // waves split across a team, whatever the machine
    int before = omp_get_max_threads();
    TeamOfFour() { omp_set_num_threads(4); }
    ~TeamOfFour() { omp_set_num_threads(before); }
  } team;
  packed.pack(0, arena, mark);
  size_t bytes = 0;  // the tensors as stored, and the arena's alignment padding after each as fp32
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    bytes += static_cast<size_t>(t.count) * (t.kind == 'b' ? 2 : t.kind == 'f' ? 4 : 0);
    bytes += static_cast<size_t>((i + 1 < tensors.size() ? tensors[i + 1].at : end) - (t.at + t.count)) * 4;
  }
  EXPECT_EQ(packed.compacted_bytes(), bytes);
  float* top = arena.top();
  ASSERT_LT(top, end);
  std::fill(top, end, -7.0f);  // a later block's stretch
  packed.unpack(0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    const Tensor& t = tensors[i];
    if (t.kind == 'd') {
      EXPECT_TRUE(std::all_of(t.at, t.at + t.count, [](float x) { return std::isnan(x); }));
    } else {
      EXPECT_EQ(0, std::memcmp(t.at, want[i].data(), sizeof(float) * want[i].size()));
    }
  }
}

using two_steps::expect_same_bits;
using two_steps::TwoSteps;

// Every block packed, the top ones too: the lean top blocks of "all" (lean_block_test.cpp) keep
// no stretch, and this file checks the packed layout.
TwoSteps run(const std::string& config, Bf16Activations storage, Recompute r, int64_t batch, int64_t seq,
             const std::vector<std::string>& overrides = {}) {
  return two_steps::run_two_steps(config, [&](TransformerModel& m) {
    m.set_precision(kernels::Precision::Bf16);
    m.set_bf16_activations(storage);
    m.set_recompute(r);
    m.set_lean_top_blocks(0);
  }, batch, seq, overrides);
}

class PackedActivationsMatch : public testing::TestWithParam<const char*> {};

TEST_P(PackedActivationsMatch, GradientsAndStatsKeepTheirBits) {
  for (Recompute r : {Recompute::None, Recompute::Attention, Recompute::Blocks}) {
    SCOPED_TRACE(std::string(recompute_name(r)));
    const TwoSteps slots = run(GetParam(), Bf16Activations::Fp32, r, 2, 8);
    const TwoSteps packed = run(GetParam(), Bf16Activations::Packed, r, 2, 8);
    two_steps::expect_same_step(slots, packed);
    EXPECT_EQ(slots.packed_fp32, 0u);
    if (r == Recompute::Blocks) {
      // The forward keeps only the block inputs; the backward packs one attention at a time.
      EXPECT_EQ(packed.packed_fp32, 0u);
      EXPECT_EQ(packed.compacted, 0u);
      continue;
    }
    EXPECT_GT(packed.packed_fp32, 0u);
    EXPECT_GT(packed.compacted, 0u);
    EXPECT_GT(packed.dropped, 0u);
  }
}

// Under recompute = blocks with packing the backward recomputes a block a sublayer at a time,
// the attention's stretch packed under the MLP's backward (TransformerModel::
// recompute_block_packed): the bits of the whole block recomputed in fp32 slots, under both
// storages. Under "all" this is the only reference: the other modes round other tensors.
TEST_P(PackedActivationsMatch, RecomputedBlocksGiveTheBitsOfWholeBlocks) {
  for (Bf16Activations storage : {Bf16Activations::Packed, Bf16Activations::All}) {
    SCOPED_TRACE(std::string(bf16_activations_name(storage)));
    auto blocks = [&](bool whole) {
      return two_steps::run_two_steps(GetParam(), [&](TransformerModel& m) {
        m.set_precision(kernels::Precision::Bf16);
        m.set_bf16_activations(storage);
        m.set_recompute(Recompute::Blocks);
        m.set_recompute_whole_blocks(whole);
      }, 2, 8);
    };
    const TwoSteps whole = blocks(true), by_sublayer = blocks(false);
    two_steps::expect_same_step(whole, by_sublayer);
    EXPECT_LT(by_sublayer.arena, whole.arena);
  }
}

// A shared expert's output is a rounded projection until the routed experts' outputs are added
// into it; a post-sublayer norm (sandwich placement) then keeps it as its input. Three layers so
// that an MoE block (the first is dense) is packed at all.
TEST(PackedActivations, MoeSharedExpertUnderSandwichNormsKeepsItsBits) {
  const std::vector<std::string> sets = {"num_hidden_layers=3", "keel.norm_placement=sandwich"};
  const TwoSteps slots = run("tests/fixtures/deepseek_v3/config.json", Bf16Activations::Fp32, Recompute::None, 2, 8, sets);
  const TwoSteps packed = run("tests/fixtures/deepseek_v3/config.json", Bf16Activations::Packed, Recompute::None, 2, 8, sets);
  two_steps::expect_same_step(slots, packed);
  EXPECT_GT(packed.packed_fp32, 0u);
}

INSTANTIATE_TEST_SUITE_P(Families, PackedActivationsMatch,
                         testing::Values("tests/fixtures/qwen3/config.json", "tests/fixtures/gpt2/config.json",
                                         "tests/fixtures/mixtral/config.json", "tests/fixtures/deepseek_v3/config.json",
                                         "tests/fixtures/gpt_oss/config.json", "tests/fixtures/llama_sandwich/config.json",
                                         "tests/fixtures/gemma2/config.json",
                                         // Norm placements post (wrap) and post-sublayer (after), the
                                         // attention output gate, MLA without a q LoRA: the
                                         // outputs dropped are the right ones in each.
                                         "tests/fixtures/llama_layernorm_post/config.json",
                                         "tests/fixtures/olmo2/config.json", "tests/fixtures/qwen3_gate/config.json",
                                         "tests/fixtures/mla_no_q_lora/config.json"));

using two_steps::relative_distance;

// bf16_activations = "all": the forward is the same computation (loss, max logits, expert loads
// and activation RMS keep their bits); the backward reads the residual stream's copies rounded to
// bf16, so the gradients move, by about what bf16 rounding of a norm's input moves them. Where
// no norm reads the residual stream (OLMo 2 normalizes only the sublayers' outputs; the stream
// feeds matmuls, which round their operands anyway) nothing moves at all.
struct AllCase {
  const char* config;
  std::vector<std::string> overrides;  // three layers where the fixture allows: two blocks packed
  bool norm_reads_residual;
};

class PackedAllResidual : public testing::TestWithParam<AllCase> {};

TEST_P(PackedAllResidual, ForwardKeepsItsBitsAndGradientsMoveByBf16Rounding) {
  const AllCase& c = GetParam();
  const TwoSteps packed = run(c.config, Bf16Activations::Packed, Recompute::None, 2, 8, c.overrides);
  const TwoSteps all = run(c.config, Bf16Activations::All, Recompute::None, 2, 8, c.overrides);
  two_steps::expect_same_forward(packed, all);
  EXPECT_GT(all.packed_fp32, packed.packed_fp32);
  ASSERT_EQ(packed.grads.size(), all.grads.size());
  size_t differ = 0;
  for (size_t i = 0; i < all.grads.size(); ++i) {
    ASSERT_TRUE(std::isfinite(all.grads[i])) << i;  // a dropped tensor read back would be NaN
    differ += all.grads[i] != packed.grads[i];
  }
  if (c.norm_reads_residual) {
    EXPECT_GT(differ, 0u) << "the residual copies were not rounded";
  } else {
    EXPECT_EQ(differ, 0u);
  }
  EXPECT_LT(relative_distance(all.grads, packed.grads), 1e-2);  // measured 1e-4 .. 2.7e-3 on Zen 5
  // The same bound holds against fp32 slots, the bit-exact storage.
  const TwoSteps slots = run(c.config, Bf16Activations::Fp32, Recompute::None, 2, 8, c.overrides);
  EXPECT_LT(relative_distance(all.grads, slots.grads), 1e-2);
  // Under recomputation each block's input is kept in bf16, and the forward reads it rounded so
  // that the recomputation starts from the forward's values: attention and blocks run the same
  // forward, bit for bit, which rounding the residual stream between blocks moves off "packed"'s
  // a little; the gradients stay within the same bound.
  const TwoSteps fp32 = two_steps::run_two_steps(c.config, [](TransformerModel&) {}, 2, 8, c.overrides);
  const TwoSteps all_attention = run(c.config, Bf16Activations::All, Recompute::Attention, 2, 8, c.overrides);
  const TwoSteps all_blocks = run(c.config, Bf16Activations::All, Recompute::Blocks, 2, 8, c.overrides);
  two_steps::expect_same_forward(all_attention, all_blocks);
  for (const TwoSteps* r : {&all_attention, &all_blocks}) {
    SCOPED_TRACE(r == &all_attention ? "attention" : "blocks");
    ASSERT_EQ(r->grads.size(), packed.grads.size());
    EXPECT_TRUE(std::all_of(r->grads.begin(), r->grads.end(), [](float g) { return std::isfinite(g); }));
    EXPECT_NE(r->ce, packed.ce);  // the forward read rounded block inputs
    EXPECT_LT(std::abs(r->ce - packed.ce), 1e-3 * std::abs(packed.ce));  // measured 2e-6 .. 7e-5
    // About what bf16's own products move them from fp32 (0.6-1.3x that on these fixtures).
    EXPECT_LT(relative_distance(r->grads, packed.grads), 2 * relative_distance(packed.grads, fp32.grads));
    EXPECT_LT(relative_distance(r->grads, packed.grads), 2e-2);  // measured 2.3e-3 .. 1.3e-2
  }
}

const std::vector<std::string> kThreeLayers = {"num_hidden_layers=3"};
INSTANTIATE_TEST_SUITE_P(
    Families, PackedAllResidual,
    testing::Values(AllCase{"tests/fixtures/qwen3/config.json", kThreeLayers, true},
                    AllCase{"tests/fixtures/gpt2/config.json", kThreeLayers, true},
                    AllCase{"tests/fixtures/deepseek_v3/config.json", kThreeLayers, true},
                    AllCase{"tests/fixtures/gpt_oss/config.json", {}, true},  // layer_types fixes 2 layers
                    AllCase{"tests/fixtures/llama_sandwich/config.json", kThreeLayers, true},
                    AllCase{"tests/fixtures/gemma2/config.json", kThreeLayers, true},
                    AllCase{"tests/fixtures/llama_layernorm_post/config.json", kThreeLayers, true},
                    AllCase{"tests/fixtures/olmo2/config.json", kThreeLayers, false},
                    AllCase{"tests/fixtures/mla_no_q_lora/config.json", kThreeLayers, true},
                    AllCase{"tests/fixtures/mixtral/config.json", kThreeLayers, true},
                    AllCase{"tests/fixtures/qwen3_gate/config.json", kThreeLayers, true},
                    AllCase{"tests/fixtures/qwen3_sinks/config.json", kThreeLayers, true}));

// What "all" saves, counted by hand for qwen3_small at 2 x 128 tokens. Every sublayer runs on a
// copy of its input made inside its own stretch (the attentions of all four blocks and the MLPs
// of the first three are packed): "all" rounds those copies (hidden more fp32 values per token
// and packed stretch in packed_fp32), stores each in 2 bytes instead of 4, and the arena is
// smaller by just that, since the peak (the last block's MLP phase) sits above every compacted
// copy.
TEST(PackedAllResidual, HoldsNoFp32ResidualBetweenSublayersCountedByHand) {
  const std::string config = "bench/configs/qwen3_small.json";
  const TwoSteps packed = run(config, Bf16Activations::Packed, Recompute::None, 2, 128);
  const TwoSteps all = run(config, Bf16Activations::All, Recompute::None, 2, 128);
  const arch::ModelSpec s = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + config);
  const double hidden_bytes = 256.0 * double(s.hidden_size) * sizeof(float);  // one fp32 tensor
  const double packed_stretches = double(2 * s.num_layers - 1);
  EXPECT_EQ(double(all.packed_fp32) - double(packed.packed_fp32), hidden_bytes * packed_stretches);
  EXPECT_EQ(double(packed.compacted) - double(all.compacted), hidden_bytes / 2 * packed_stretches);
  EXPECT_EQ(double(packed.arena) - double(all.arena), hidden_bytes / 2 * packed_stretches);
}

// The arena's growth per token (bytes) of a bf16 step at Qwen3-0.6B's depth (28 layers) and
// proportions, every width an eighth (hidden 128, 16 query heads and 8 KV heads of 16,
// intermediate 384): the slope between 1 x 256 and 1 x 512 tokens leaves out what does not grow
// with the tokens (the lean blocks' MLP runs of 256 rows among it). setup: switches on the model
// before its first step.
double arena_per_token_at_qwen3_proportions(const std::function<void(TransformerModel&)>& setup) {
  const std::string config = "configs/hf/qwen3-0.6b.json";
  const std::vector<std::string> eighth = {"hidden_size=128",     "intermediate_size=384", "num_attention_heads=16",
                                           "num_key_value_heads=8", "head_dim=16",          "vocab_size=512"};
  const double short_arena = double(two_steps::run_two_steps(config, setup, 1, 256, eighth).arena);
  const double long_arena = double(two_steps::run_two_steps(config, setup, 1, 512, eighth).arena);
  return (long_arena - short_arena) / 256.0;
}

// What issue 17 asks of bf16 storage: activation memory halved. At Qwen3-0.6B's proportions
// and depth (28 layers), the arena's growth per token under "all", the default, against fp32's.
// Since fp32 shares one buffer among its pre-norms' outputs (SharedNormed), both store the same
// tensors, bf16 in half the bytes. With every block packed what keeps "all" above half is the
// top block expanded in fp32 with its temporaries, on top of all the others packed (0.514x at
// full width on an Intel Xeon, docs/performance.md); the lean top blocks keep two bf16 tensors
// and run with temporaries a kv head or a run of rows wide, so the peak moves down to the third
// block from the top, under half. "packed", which keeps the residual stream's copies in fp32,
// holds more. The slope between two lengths leaves out what does not grow with the tokens.
TEST(PackedAllResidual, ArenaPerTokenAgainstFp32AtQwen3Proportions) {
  const auto per_token = arena_per_token_at_qwen3_proportions;
  auto bf16 = [](Bf16Activations storage, size_t lean) {
    return [storage, lean](TransformerModel& m) {
      m.set_precision(kernels::Precision::Bf16);
      m.set_bf16_activations(storage);
      m.set_lean_top_blocks(lean);
    };
  };
  const double fp32 = per_token([](TransformerModel&) {});
  const double all = per_token([](TransformerModel& m) { m.set_precision(kernels::Precision::Bf16); }) / fp32;
  const double all_packed_whole = per_token(bf16(Bf16Activations::All, 0)) / fp32;
  const double packed = per_token(bf16(Bf16Activations::Packed, 0)) / fp32;
  std::printf("per token against fp32: all %.4f, all every block packed %.4f, packed %.4f\n", all, all_packed_whole,
              packed);
  EXPECT_LT(all, 0.50);
  EXPECT_GT(all, 0.45);  // the bf16 tensors at 2 bytes, the statistics and the third block's sublayer in fp32
  EXPECT_LT(all_packed_whole, 0.53);
  EXPECT_GT(all_packed_whole, all + 0.01);
  EXPECT_LT(packed, 0.60);
  EXPECT_GT(packed, all_packed_whole + 0.04);  // the input copies, 2 KiB more a token and sublayer at full width
}

// The recomputation under "all" starts from the values the forward read: an MoE layer's router,
// run again in the backward under recompute = blocks, leaves the entropy and loads the forward
// recorded, bit for bit. Were only the kept copy rounded (the forward reading the fp32 input),
// the recomputed router probabilities would differ. 17 x 128 tokens of hidden 32 are enough for
// the team to share the rounding pass (parallel_chunks).
TEST(PackedAllResidual, RecomputationSeesTheForwardsValues) {
  for (const char* config : {"tests/fixtures/mixtral/config.json", "tests/fixtures/deepseek_v3/config.json"}) {
    SCOPED_TRACE(config);
    TransformerModel model(
        arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + config, {"num_hidden_layers=3"}));
    model.initialize(5);
    model.set_precision(kernels::Precision::Bf16);
    model.set_bf16_activations(Bf16Activations::All);
    model.set_recompute(Recompute::Blocks);
    const int64_t batch = 17, seq = 128;
    const two_steps::FixedBatch data(model, batch * seq);
    model.forward_backward(data.tokens.data(), data.targets.data(), batch, seq, 1.0f / float(batch * seq));
    int moe_layers = 0;
    for (int64_t l = 0; l < model.spec().num_layers; ++l) {
      const Moe* m = model.moe_layer(l);
      if (m == nullptr) continue;
      ++moe_layers;
      EXPECT_EQ(static_cast<float>(m->entropy()), model.router_entropy()[size_t(l)]) << "layer " << l;
      const std::vector<float> forward_load(model.expert_load().begin() + l * m->experts(),
                                            model.expert_load().begin() + (l + 1) * m->experts());
      expect_same_bits(m->load(), forward_load, "expert load");
    }
    EXPECT_GE(moe_layers, 2);
  }
}

// Under recomputation "all" keeps each block's input in 2 bytes, with the stream between blocks in
// two fp32 residual buffers, and recompute = attention its MLP's input copy in the packed stretch
// instead of the attention's output in fp32; the backward's recomputation then goes right above
// the block's kept input, over what is dead. At Qwen3-0.6B's depth L = 28 and proportions (the
// test above), counted per token in hidden-wide bf16 tensors (u = 2 bytes x hidden; a hidden fp32
// tensor is 2u, q 4u, k and v 2u, gate and up 6u; the recomputed block 32u and its backward's
// temporaries 16u, the attention half 16u and 16u; ActivationArena's count):
//   blocks, "packed": the embedding and L block outputs in fp32, the final norm's output (the
//     gradient's buffer), then a block recomputed a sublayer at a time (the next test's count):
//     the MLP's input (2u) and the larger of the two phases, the attention's 30u:
//     2(L + 1) + 2 + 2 + 30 = 2L + 36.
//   blocks, "all": two residual buffers, L inputs in bf16, one input expanded, the MLP's input
//     in the residual buffer the gradient is not in, and the attention's input gradient in it
//     after the MLP's backward: both phases 28u: 4 + L + 2 + 28 = L + 34; L + 2 fewer.
//   attention, "packed": the embedding; a block's kept attention output and output (2u each) and
//     its packed MLP (gate and up, 6u); the last block's MLP in fp32 (16u) and its attention
//     recomputed above the final norm's output: 2 + 10(L - 1) + 18 + 2 + 32 = 10L + 44.
//   attention, "all": two residual buffers; a block's input (1u) and packed MLP with its input
//     copy (7u); the last block's input, then its attention recomputed over its dead MLP, its
//     input gradient in the residual buffer the gradient is not in:
//     4 + 8(L - 1) + 1 + 2 + 30 = 8L + 29; 2L + 15 fewer.
// Measured: 30 and 71 (before the branches' input gradients went to the spare residual buffer:
// 28 and 69; with the whole block recomputed in fp32 slots, as before 2026-12-07's third
// session: 26; with the recomputation above the last MLP, before that: 24 and 49).
TEST(PackedAllResidual, RecomputationKeepsTheBlockInputsInTwoBytes) {
  auto per_token = [&](Bf16Activations storage, Recompute r) {
    return arena_per_token_at_qwen3_proportions([&](TransformerModel& m) {
      m.set_precision(kernels::Precision::Bf16);
      m.set_bf16_activations(storage);
      m.set_recompute(r);
    });
  };
  const double hidden_bf16 = 128 * 2;
  const double layers = 28;
  for (Recompute r : {Recompute::Blocks, Recompute::Attention}) {
    SCOPED_TRACE(std::string(recompute_name(r)));
    const double packed = per_token(Bf16Activations::Packed, r), all = per_token(Bf16Activations::All, r);
    const double fewer = (packed - all) / hidden_bf16;
    EXPECT_NEAR(fewer, r == Recompute::Blocks ? layers + 2 : 2 * layers + 15, 0.5);
  }
}

// A block recomputed a sublayer at a time, counted per token at the test above's model (u = 2
// bytes x hidden): under the MLP's backward, the attention's compacted stretch (q before
// QK-Norm and the attention output at 2u, k and v at 1u: 6u), the MLP's activations in fp32
// (its normed input, gate and up: 14u; its output, dead, is where the temporaries start) and its
// backward's temporaries (the norm's input gradient and dh: 8u), 28u; under the attention's
// backward, its stretch expanded (the normed input, q, k, v and the attention output: 14u; its
// output is dead too) and those temporaries (16u, ActivationArena's count), 30u, or 28u under
// "all", where the attention's input gradient (2u) goes to the MLP's input's buffer, dead by
// then. Beside them what the step holds anyway (the count above). The whole block recomputed in fp32 slots held both sublayers
// (32u) and the larger temporaries: 48u, 16u more than "packed"'s 32u (the MLP's input with the
// attention's phase) and 20u more than "all"'s 28u, and its forward held the attention under
// the MLP.
TEST(PackedAllResidual, RecomputedBlocksHoldOneSublayerExpandedCountedByHand) {
  auto per_token_u = [&](Bf16Activations storage, bool whole) {
    return arena_per_token_at_qwen3_proportions([&](TransformerModel& m) {
             m.set_precision(kernels::Precision::Bf16);
             m.set_bf16_activations(storage);
             m.set_recompute(Recompute::Blocks);
             m.set_recompute_whole_blocks(whole);
           }) /
           (128 * 2);
  };
  const double L = 28;
  // Per-row statistics (norm rstd, log-sum-exps) and padding are the rest: under 1u.
  EXPECT_NEAR(per_token_u(Bf16Activations::Packed, false), 2 * L + 36, 1.0);
  EXPECT_NEAR(per_token_u(Bf16Activations::All, false), L + 34, 1.0);
  EXPECT_NEAR(per_token_u(Bf16Activations::Packed, true), 2 * L + 52, 1.0);
  EXPECT_NEAR(per_token_u(Bf16Activations::All, true), L + 54, 1.0);
}

// The peak of a packed step without recomputation, counted by hand (qwen3_small, 2 x 128
// tokens, floats per token): the two residual buffers (2 x hidden) under every stretch, every
// compacted sublayer (the step's own count), and above them the last block's MLP, never packed:
// in its forward, its stretch in fp32 (the input's copy, the normed input, up, gate and its
// output) and the hidden activation, a temporary (h x width) until the down projection has read
// it. Its backward phase was as high (the output dead, where the temporaries start: the norm's
// input gradient and dh) until the norm's input gradient went to the residual buffer that the
// gradient is not in, dead through the backward (TransformerModel::spare_residual): now a
// hidden-wide tensor lower. (The recomputed activation h takes up's place, and the bf16
// operands the products share are not in the arena.)
// Per-row statistics and padding are the rest, under 1%. The block's attention phase is lower: its stretch expands over its own
// compacted copy and the dead MLP. With both sublayers of the top block expanded at once, or
// the temporaries above the furthest stretch as before, the peak is 15-25% higher.
TEST(PackedActivations, PeakIsTheCompactedSublayersAndOneSublayerExpandedCountedByHand) {
  const std::string config = "bench/configs/qwen3_small.json";
  const arch::ModelSpec s = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + config);
  const double h = double(s.hidden_size), I = double(s.mlp.intermediate_size);
  for (Bf16Activations storage : {Bf16Activations::Packed, Bf16Activations::All}) {
    SCOPED_TRACE(std::string(bf16_activations_name(storage)));
    const TwoSteps r = run(config, storage, Recompute::None, 2, 128);
    const double mlp_stretch = 3 * h + 2 * I;
    const double mlp_forward_temporary = I;
    const double counted = double(r.compacted) + (2 * h + mlp_stretch + mlp_forward_temporary) * 256 * sizeof(float);
    EXPECT_GE(double(r.arena), 0.99 * counted);
    EXPECT_LE(double(r.arena), 1.01 * counted) << double(r.arena) / counted;
  }
}

// What gets packed, counted by hand for qwen3_small (QK-Norm, GQA) at 2 x 128 tokens: per token
// and block, q before QK-Norm and the attention output (2 x heads x head_dim), k before QK-Norm
// and v (2 x kv_heads x head_dim), and gate and up (2 x intermediate). q and k after
// QK-Norm/RoPE and the FFN's hidden activation are recomputed by the backward, not kept.
// Dropped, per packed sublayer: its output in its stretch (1 x hidden; the residual sums take the
// places of the projections' outputs), copied out to a residual buffer, and its normed input
// (1 x hidden), which the backward writes again from the norm's input and statistics.
TEST(PackedActivations, PackWhatEachDenseBlockRoundsToBf16) {
  const TwoSteps r = run("bench/configs/qwen3_small.json", Bf16Activations::Packed, Recompute::None, 2, 128);
  const arch::ModelSpec s = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/bench/configs/qwen3_small.json");
  const double hd = double(s.attention.head_dim);
  const double floats_per_token = 2.0 * double(s.attention.num_heads) * hd +
                                  2.0 * double(s.attention.num_kv_heads) * hd + 2.0 * double(s.mlp.intermediate_size);
  // Every sublayer but the last MLP, whose backward comes first (it is never packed): per token,
  // the attention's q, k, v and its output in every block, and the MLP's gate and up in all but
  // the last.
  const double mlp_floats = 2.0 * double(s.mlp.intermediate_size);
  const double layers = double(s.num_layers);
  EXPECT_EQ(double(r.packed_fp32), (floats_per_token * layers - mlp_floats) * 256.0 * sizeof(float));
  EXPECT_EQ(double(r.dropped), 2.0 * double(s.hidden_size) * (2 * layers - 1) * 256.0 * sizeof(float));
  // Compacted and expanded stretches of megabytes, the next block laid over the freed space:
  const TwoSteps slots = run("bench/configs/qwen3_small.json", Bf16Activations::Fp32, Recompute::None, 2, 128);
  EXPECT_EQ(slots.ce, r.ce);
  expect_same_bits(slots.grads, r.grads, "gradients");
  // The arena: the compacted blocks plus one block expanded, against every block in fp32.
  EXPECT_LT(double(r.arena), 0.85 * double(slots.arena)) << slots.arena << " -> " << r.arena;
}

}  // namespace
}  // namespace keel::nn
