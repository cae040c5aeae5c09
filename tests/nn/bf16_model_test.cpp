// bf16 mixed precision against fp32 on whole models: the fixture families (dense, MoE, MLA) with
// the fixtures' initial weights (std 0.15, tools/make_fixtures.py) on random tokens. bf16 has an
// 8-bit significand (relative rounding 2⁻⁹ ≈ 2e-3), so the two precisions agree only to what
// the tolerances below state (measured values in docs/precision.md); the checks also make sure
// bf16 really changed the arithmetic and that switching back to fp32 leaves nothing behind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "keel/arch/config_file.hpp"
#include "keel/core/error.hpp"
#include "keel/core/rng.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/kernels/gemm.hpp"
#include "keel/nn/model.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/grad_clip.hpp"

namespace keel::nn {
namespace {

namespace fs = std::filesystem;
using kernels::Precision;

// Tolerances; the measured worst cases are in docs/precision.md ("Agreement with fp32").
constexpr double kLossRel = 1e-3;  // |loss_bf16 − loss_fp32| / loss_fp32 (measured <= 3.9e-4)
struct GradTolerance {
  double cosine;    // per-tensor cosine similarity of the gradients, at least
  double rel_norm;  // per-tensor ‖g_bf16 − g_fp32‖ / ‖g_fp32‖, at most
};
// Dense fixtures. Measured worst: per tensor cosine 0.99969, rel 2.5e-2; all parameters
// cosine 0.99989, rel 1.6e-2.
constexpr GradTolerance kGrad{0.999, 5e-2}, kGradAll{0.9995, 3e-2};
// llama_caps_zloss is the stress fixture: q/k drawn with std 0.5 and a std-1 LM head give
// attention logits far beyond the soft-cap, so a bf16 rounding of q or k moves a near-one-hot
// softmax. Measured worst: per tensor cosine 0.9955, rel 9.6e-2; all cosine 0.9969, rel 8.0e-2.
constexpr GradTolerance kGradStress{0.99, 0.15}, kGradStressAll{0.995, 0.12};
// MoE fixtures: a token whose top-k choice flips between the precisions (a near tie moved by
// bf16 noise upstream of the fp32 router) runs a different function, and its gradient reaches
// every tensor upstream of that layer. The flipped experts and router are left to the global
// check; the rest, measured worst: per tensor cosine 0.9900, rel 0.141 (kimi_k2, 1 flip);
// all parameters cosine 0.9976, rel 7.0e-2.
constexpr GradTolerance kGradMoe{0.98, 0.2}, kGradMoeAll{0.995, 0.1};

struct Fixture {
  arch::ModelSpec spec;
  std::unique_ptr<TransformerModel> model;
  int64_t batch = 2, seq = 0;
  std::vector<int32_t> tokens, targets;
};

Fixture load_fixture(const std::string& name) {
  const fs::path dir = fs::path(KEEL_SOURCE_DIR) / "tests" / "fixtures" / name;
  Fixture s;
  s.spec = arch::load_model_spec((dir / "config.json").string());
  s.model = std::make_unique<TransformerModel>(s.spec);
  const auto ref = io::SafetensorsFile::open((dir / "reference.safetensors").string());
  for (const ParamInfo& p : s.model->parameters().entries()) {
    auto v = ref.read_f32("param." + p.name);
    KEEL_CHECK(static_cast<int64_t>(v.size()) == p.numel);
    std::copy(v.begin(), v.end(), s.model->parameters().data(p.name));
  }
  // Sequences longer than one 64-key attention block where the context allows.
  s.seq = std::min<int64_t>(80, s.spec.max_position_embeddings);
  const int64_t n = s.batch * s.seq;
  for (int64_t i = 0; i < n; ++i) {
    s.tokens.push_back(static_cast<int32_t>(uniform_int_at(5, 1, uint64_t(i), uint64_t(s.spec.vocab_size))));
  }
  for (int64_t i = 0; i < n; ++i) s.targets.push_back(i % s.seq == s.seq - 1 ? -1 : s.tokens[size_t(i + 1)]);
  return s;
}

struct Pass {
  double loss = 0;
  std::vector<float> grads;
};

Pass run(Fixture& s, Precision p) {
  s.model->set_precision(p);
  auto& store = s.model->parameters();
  store.zero_grad();
  const auto r = s.model->forward_backward(s.tokens.data(), s.targets.data(), s.batch, s.seq, 1.0f);
  Pass out;
  out.loss = r.mean_ce() + s.spec.z_loss * (r.count ? r.z_sum / double(r.count) : 0.0);
  out.grads.assign(store.grads().begin(), store.grads().end());
  return out;
}

// Every (layer, token, slot) routing choice of the last pass, in layer order.
std::vector<int32_t> routing(const Fixture& s) {
  std::vector<int32_t> out;
  for (int64_t l = 0; l < s.spec.num_layers; ++l) {
    if (const Moe* m = s.model->moe_layer(l)) out.insert(out.end(), m->selected().begin(), m->selected().end());
  }
  return out;
}

// The experts (and so the router) whose gradients a routing flip makes incomparable:
// "<layer prefix>.experts.E." of every expert chosen differently, and the layer's router.
std::vector<std::string> flipped_prefixes(const Fixture& s, const std::vector<int32_t>& a,
                                          const std::vector<int32_t>& b) {
  std::vector<std::string> out;
  size_t at = 0;
  for (int64_t l = 0; l < s.spec.num_layers; ++l) {
    const Moe* m = s.model->moe_layer(l);
    if (!m) continue;
    const std::string layer = "model.layers." + std::to_string(l) + ".";
    for (size_t i = 0; i < m->selected().size(); ++i, ++at) {
      if (a[at] == b[at]) continue;
      for (int32_t e : {a[at], b[at]}) out.push_back(layer + "experts." + std::to_string(e) + ".");  // matched as infix
      out.push_back(layer + "gate.weight");  // as infix: ".mlp.gate.weight" / ".block_sparse_moe.gate.weight"
    }
  }
  return out;
}

bool matches_any(const std::string& name, const std::string& layer_prefix_infix) {
  // "model.layers.L." must prefix the name and the rest ("experts.E." / "gate.weight") appear in it.
  const size_t dot = layer_prefix_infix.find('.', std::string("model.layers.").size());
  const std::string layer = layer_prefix_infix.substr(0, dot + 1), rest = layer_prefix_infix.substr(dot + 1);
  return name.rfind(layer, 0) == 0 && name.find("." + rest) != std::string::npos;
}

struct Case {
  const char* fixture;
  GradTolerance grad, all;  // per tensor; over all parameters at once
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture; }

class Bf16Model : public ::testing::TestWithParam<Case> {};

TEST_P(Bf16Model, LossAndGradientsTrackFp32) {
  const Case& c = GetParam();
  Fixture s = load_fixture(c.fixture);
  const Pass fp32 = run(s, Precision::Fp32);
  const auto route32 = routing(s);
  const Pass bf16 = run(s, Precision::Bf16);
  const auto route16 = routing(s);
  const double loss_rel = std::fabs(bf16.loss - fp32.loss) / std::fabs(fp32.loss);
  EXPECT_LE(loss_rel, kLossRel) << "fp32 " << fp32.loss << " bf16 " << bf16.loss;
  EXPECT_NE(bf16.grads, fp32.grads);  // bf16 really rounded something

  // A token whose top-k choice differs between the precisions (a near tie moved by bf16 noise
  // upstream of the fp32 router) trains other experts: those experts' and that router's
  // gradients are then compared only within the global check.
  const auto flipped = flipped_prefixes(s, route32, route16);
  int64_t flips = 0;
  for (size_t i = 0; i < route32.size(); ++i) flips += route32[i] != route16[i];

  double worst_cos = 1, worst_rel = 0, g_dot = 0, g_f = 0, g_b = 0, g_d = 0;
  std::string worst_cos_name, worst_rel_name;
  int64_t skipped = 0;
  for (const ParamInfo& p : s.model->parameters().entries()) {
    double dot = 0, nf = 0, nb = 0, nd = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      const double f = fp32.grads[size_t(i)], b = bf16.grads[size_t(i)];
      dot += f * b;
      nf += f * f;
      nb += b * b;
      nd += (b - f) * (b - f);
    }
    g_dot += dot, g_f += nf, g_b += nb, g_d += nd;
    if (nf == 0) {  // buffers (e_score_correction_bias) get no gradient in either precision
      EXPECT_EQ(nb, 0.0) << p.name;
      continue;
    }
    bool incomparable = false;
    for (const auto& f : flipped) incomparable = incomparable || matches_any(p.name, f);
    if (incomparable) {
      ++skipped;
      continue;
    }
    const double cos = dot / std::sqrt(nf * nb), rel = std::sqrt(nd / nf);
    EXPECT_GE(cos, c.grad.cosine) << p.name;
    EXPECT_LE(rel, c.grad.rel_norm) << p.name;
    if (cos < worst_cos) worst_cos = cos, worst_cos_name = p.name;
    if (rel > worst_rel) worst_rel = rel, worst_rel_name = p.name;
  }
  const double global_cos = g_dot / std::sqrt(g_f * g_b), global_rel = std::sqrt(g_d / g_f);
  EXPECT_GE(global_cos, c.all.cosine);
  EXPECT_LE(global_rel, c.all.rel_norm);
  // Flips stay rare: a handful of the 2·80·k choices per layer (routing margins are bf16 noise).
  EXPECT_LE(flips, int64_t(route32.size() / 20)) << flips << " of " << route32.size() << " routing choices flipped";
  std::printf("[bf16 %s] loss fp32 %.6f bf16 %.6f rel %.2e; worst grad cosine %.5f (%s), worst rel norm %.2e (%s); "
              "all params: cosine %.6f rel %.2e; routing flips %lld of %zu (%lld tensors left to the global check)\n",
              c.fixture, fp32.loss, bf16.loss, loss_rel, worst_cos, worst_cos_name.c_str(), worst_rel,
              worst_rel_name.c_str(), global_cos, global_rel, static_cast<long long>(flips), route32.size(),
              static_cast<long long>(skipped));

  // Back to fp32: bit-identical to the first fp32 pass (no state leaks from bf16).
  const Pass again = run(s, Precision::Fp32);
  EXPECT_EQ(again.loss, fp32.loss);
  EXPECT_EQ(again.grads, fp32.grads);
}

// The native (oneDNN's bf16 gemm, forced wherever the CPU has it) and portable gemm paths differ
// only in fp32 summation order, so the whole model agrees far more tightly between them than with
// fp32.
TEST_P(Bf16Model, NativeAndPortablePathsAgree) {
  Fixture s = load_fixture(GetParam().fixture);
  const kernels::Bf16GemmChoiceScope restore;
  kernels::force_bf16_gemm_path(kernels::Bf16GemmChoice::Native);
  const Pass native = run(s, Precision::Bf16);
  kernels::force_bf16_gemm_path(kernels::Bf16GemmChoice::Portable);
  const Pass portable = run(s, Precision::Bf16);
  EXPECT_LE(std::fabs(native.loss - portable.loss) / std::fabs(portable.loss), 1e-4);
  double nd = 0, nn = 0;
  for (size_t i = 0; i < native.grads.size(); ++i) {
    nd += std::pow(double(native.grads[i]) - portable.grads[i], 2);
    nn += std::pow(double(portable.grads[i]), 2);
  }
  // A summation-order difference can flip a bf16 rounding of an activation, so this is not
  // 1e-7; it stays well below the bf16-vs-fp32 gap checked above.
  EXPECT_LE(std::sqrt(nd / nn), 1e-2);
  std::printf("[bf16 %s] native vs portable: loss %.3e, grads %.3e (relative)\n", GetParam().fixture,
              std::fabs(native.loss - portable.loss) / std::fabs(portable.loss), std::sqrt(nd / nn));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16Model,
                         ::testing::Values(Case{"qwen3", kGrad, kGradAll}, Case{"llama", kGrad, kGradAll},
                                           Case{"gpt2", kGrad, kGradAll}, Case{"mla_no_q_lora", kGrad, kGradAll},
                                           Case{"llama_caps_zloss", kGradStress, kGradStressAll},
                                           Case{"mixtral", kGradMoe, kGradMoeAll}, Case{"qwen3_moe", kGradMoe, kGradMoeAll},
                                           Case{"deepseek_v3", kGradMoe, kGradMoeAll},
                                           Case{"kimi_k2", kGradMoe, kGradMoeAll}),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.fixture); });

// 30 AdamW steps on a learnable sequence (a fixed permutation cycle) from the same weights: the
// bf16 loss curve follows the fp32 one.
TEST(Bf16Training, LossCurveTracksFp32) {
  auto train = [](Precision p) {
    Fixture s = load_fixture("qwen3");
    s.model->set_precision(p);
    const int64_t n = s.batch * s.seq, V = s.spec.vocab_size;
    for (int64_t i = 0; i < n; ++i) s.tokens[size_t(i)] = static_cast<int32_t>((7 * (i % s.seq) + 3 * (i / s.seq)) % V);
    for (int64_t i = 0; i < n; ++i) s.targets[size_t(i)] = i % s.seq == s.seq - 1 ? -1 : s.tokens[size_t(i + 1)];
    auto& store = s.model->parameters();
    optim::AdamW adamw(store, optim::AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f});
    std::vector<double> losses;
    for (int step = 0; step < 30; ++step) {
      store.zero_grad();
      const auto r = s.model->forward_backward(s.tokens.data(), s.targets.data(), s.batch, s.seq,
                                               1.0f / float(s.batch * (s.seq - 1)));
      losses.push_back(r.mean_ce());
      optim::clip_grad_norm(store.grads(), 1.0);
      adamw.step(store, 1e-2f);
    }
    return losses;
  };
  const auto fp32 = train(Precision::Fp32), bf16 = train(Precision::Bf16);
  double worst = 0;
  for (size_t i = 0; i < fp32.size(); ++i) worst = std::max(worst, std::fabs(bf16[i] - fp32[i]) / fp32[i]);
  std::printf("[bf16 training] loss %.4f -> fp32 %.4f, bf16 %.4f; worst relative gap over 30 steps %.3e\n", fp32[0],
              fp32.back(), bf16.back(), worst);
  EXPECT_LT(fp32.back(), 0.5 * fp32.front());  // the task is learnable: the curve has a shape to track
  EXPECT_LE(worst, 2e-2);  // measured 6.5e-3
}

}  // namespace
}  // namespace keel::nn
