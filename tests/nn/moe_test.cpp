// The MoE module on its own: grouped expert GEMMs against a per-token loop, backward against
// central differences for the input, the router and the experts, and the auxiliary-loss-free
// correction-bias update.
#include "keel/nn/moe.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "keel/arch/config_file.hpp"
#include "keel/arch/families.hpp"
#include "keel/kernels/activation.hpp"

namespace keel::nn {
namespace {

struct Case {
  const char* name;
  const char* config;
  std::vector<std::string> sets;
};
std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }


struct Harness {
  arch::ModelSpec spec;
  ParameterStore store;
  std::unique_ptr<Moe> moe;
  Arena arena;
  explicit Harness(const Case& c) {
    spec = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/" + c.config, c.sets);
    moe = std::make_unique<Moe>(store, spec, 1);
    store.finalize();
    std::mt19937 gen(7);
    std::normal_distribution<float> noise(0.f, 1.f);
    for (const ParamInfo& p : store.entries()) {
      float* v = store.data(p.name);
      // Large router weights so the top-k margins are wide; small correction biases.
      const float std = p.buffer ? 0.02f : (p.name.find(".gate.weight") != std::string::npos ? 0.5f : 0.2f);
      for (int64_t i = 0; i < p.numel; ++i) v[i] = std * noise(gen);
    }
  }
  std::vector<float> forward(const std::vector<float>& x, int64_t n) {
    arena.reset();
    float* y = moe->forward(store, arena, x.data(), n);
    return {y, y + n * spec.hidden_size};
  }
  // Names by role, as the family's table spells them (Mixtral: block_sparse_moe.experts.E.w1 ...).
  std::string name(arch::TensorKind kind, arch::TensorPart part = arch::TensorPart::Weight, int64_t e = -1) const {
    return arch::tensor_name(spec, {kind, part, 1, e});
  }
  std::string expert_name(int64_t e, const char* which) const {
    const std::string w(which);
    return name(w == "gate" ? arch::TensorKind::ExpertGate : w == "up" ? arch::TensorKind::ExpertUp
                                                                      : arch::TensorKind::ExpertDown,
                arch::TensorPart::Weight, e);
  }
};

class MoeModule : public ::testing::TestWithParam<Case> {};

// gpt-oss's expert e on one token, in double, written from GptOssExperts: gate_up = x·W[e] + b
// with gate/up interleaved, gate clamped above, up on both sides, (up + 1)·g·σ(α·g), then down.
void gpt_oss_expert(Harness& h, int64_t e, const float* xt, double scale, std::vector<double>& out) {
  const auto& m = h.spec.moe;
  const int64_t C = h.spec.hidden_size, F = m.expert_intermediate_size;
  const float* wgu = h.store.data(h.name(arch::TensorKind::ExpertsGateUp, arch::TensorPart::Bare)) + e * C * 2 * F;
  const float* bgu = h.store.data(h.name(arch::TensorKind::ExpertsGateUpBias, arch::TensorPart::Bare)) + e * 2 * F;
  const float* wd = h.store.data(h.name(arch::TensorKind::ExpertsDown, arch::TensorPart::Bare)) + e * F * C;
  const float* bd = h.store.data(h.name(arch::TensorKind::ExpertsDownBias, arch::TensorPart::Bare)) + e * C;
  const double limit = m.swiglu_limit, alpha = m.swiglu_alpha;
  std::vector<double> hidden(static_cast<size_t>(F));
  for (int64_t f = 0; f < F; ++f) {
    double g = bgu[2 * f], u = bgu[2 * f + 1];
    for (int64_t c = 0; c < C; ++c) {
      g += double(wgu[c * 2 * F + 2 * f]) * xt[c];
      u += double(wgu[c * 2 * F + 2 * f + 1]) * xt[c];
    }
    g = std::min(g, limit);
    u = std::max(-limit, std::min(u, limit));
    hidden[static_cast<size_t>(f)] = (u + 1) * g / (1 + std::exp(-alpha * g));
  }
  for (int64_t c = 0; c < C; ++c) {
    double acc = bd[c];
    for (int64_t f = 0; f < F; ++f) acc += double(wd[f * C + c]) * hidden[static_cast<size_t>(f)];
    out[static_cast<size_t>(c)] += scale * acc;
  }
}

// Per token, in double: route with the same kernel, run each chosen expert on that token alone.
std::vector<double> naive_moe(Harness& h, const std::vector<float>& x, int64_t n) {
  const auto& m = h.spec.moe;
  const int64_t C = h.spec.hidden_size, E = m.num_experts, k = m.experts_per_token, F = m.expert_intermediate_size;
  const kernels::RouterConfig rc = router_config(m);
  const float* gate = h.store.data(h.name(arch::TensorKind::Router));
  const float* bias = m.score_correction_bias ? h.store.data(h.name(arch::TensorKind::Router, arch::TensorPart::CorrectionBias)) : nullptr;
  auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  auto mlp = [&](const float* wg, const float* wu, const float* wd, int64_t width, const float* xt, double scale,
                 std::vector<double>& out) {
    std::vector<double> hidden(static_cast<size_t>(width));
    for (int64_t f = 0; f < width; ++f) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < C; ++c) {
        g += double(wg[f * C + c]) * xt[c];
        u += double(wu[f * C + c]) * xt[c];
      }
      hidden[static_cast<size_t>(f)] = silu(g) * u;
    }
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t f = 0; f < width; ++f) acc += double(wd[c * width + f]) * hidden[static_cast<size_t>(f)];
      out[static_cast<size_t>(c)] += scale * acc;
    }
  };
  std::vector<double> y(static_cast<size_t>(n * C), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x.data() + t * C;
    std::vector<float> logits(static_cast<size_t>(E)), p(static_cast<size_t>(E)), w(static_cast<size_t>(k));
    std::vector<int32_t> idx(static_cast<size_t>(k));
    for (int64_t e = 0; e < E; ++e) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += double(gate[e * C + c]) * xt[c];
      logits[static_cast<size_t>(e)] = static_cast<float>(acc);
    }
    if (m.gpt_oss_experts) {  // GptOssTopKRouter's bias is part of the logits
      const float* rb = h.store.data(h.name(arch::TensorKind::Router, arch::TensorPart::Bias));
      for (int64_t e = 0; e < E; ++e) logits[static_cast<size_t>(e)] += rb[e];
    }
    kernels::router_forward(rc, logits.data(), bias, p.data(), idx.data(), w.data(), 1);
    std::vector<double> out(static_cast<size_t>(C), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = idx[static_cast<size_t>(j)];
      if (m.gpt_oss_experts) {
        gpt_oss_expert(h, e, xt, w[static_cast<size_t>(j)], out);
        continue;
      }
      mlp(h.store.data(h.expert_name(e, "gate")), h.store.data(h.expert_name(e, "up")),
          h.store.data(h.expert_name(e, "down")), F, xt, w[static_cast<size_t>(j)], out);
    }
    if (m.num_shared_experts > 0) {
      mlp(h.store.data(h.name(arch::TensorKind::SharedGate)), h.store.data(h.name(arch::TensorKind::SharedUp)),
          h.store.data(h.name(arch::TensorKind::SharedDown)), m.shared_intermediate_size, xt, 1.0, out);
    }
    std::copy(out.begin(), out.end(), y.begin() + t * C);
  }
  return y;
}

TEST_P(MoeModule, GroupedForwardMatchesPerTokenLoop) {
  Harness h(GetParam());
  const int64_t n = 23, C = h.spec.hidden_size;
  std::mt19937 gen(1);
  std::normal_distribution<float> noise(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * C));
  for (float& v : x) v = noise(gen);
  auto y = h.forward(x, n);
  auto want = naive_moe(h, x, n);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    worst = std::max(worst, std::fabs(y[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  EXPECT_LE(worst, 1e-5 * std::max(1.0, scale)) << "scale " << scale;
  // Load: shares of the n·k assignments, summing to 1; entropy within (0, ln E].
  double total = 0;
  for (float l : h.moe->load()) total += l;
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_GT(h.moe->entropy(), 0.0);
  EXPECT_LE(h.moe->entropy(), std::log(static_cast<double>(h.spec.moe.num_experts)) + 1e-9);
}

TEST_P(MoeModule, BackwardMatchesFiniteDifferences) {
  Harness h(GetParam());
  const int64_t n = 9, C = h.spec.hidden_size;
  std::mt19937 gen(2);
  std::normal_distribution<float> noise(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * C)), g(static_cast<size_t>(n * C));
  for (float& v : x) v = noise(gen);
  for (float& v : g) v = noise(gen);
  h.store.zero_grad();
  std::vector<float> dx(x.size(), 0.f);
  {
    h.arena.reset();
    h.moe->forward(h.store, h.arena, x.data(), n);
    h.moe->backward(h.store, h.arena, g.data(), dx.data(), n);
  }
  const std::vector<int32_t> chosen = h.moe->selected();
  auto loss = [&] {
    auto y = h.forward(x, n);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += double(y[i]) * g[i];
    return s;
  };
  // The loss has a kink wherever a top-k choice changes: probes that change any token's
  // selection are skipped (and counted; only a few may be).
  const double eps = 1e-2;
  double worst = 0;
  int skipped = 0, probes = 0;
  auto probe = [&](float* v, float analytic, const std::string& what) {
    const float old = *v;
    ++probes;
    *v = static_cast<float>(old + eps);
    const double lp = loss();
    bool same = h.moe->selected() == chosen;
    *v = static_cast<float>(old - eps);
    const double lm = loss();
    same = same && h.moe->selected() == chosen;
    *v = old;
    if (!same) {
      ++skipped;
      return;
    }
    const double fd = (lp - lm) / (2 * eps);
    worst = std::max(worst, std::fabs(fd - analytic) / std::max(1.0, std::fabs(fd)));
    EXPECT_NEAR(analytic, fd, 2e-3 + 1e-2 * std::fabs(fd)) << what;
  };
  for (int64_t i = 0; i < n * C; i += 7) probe(&x[static_cast<size_t>(i)], dx[static_cast<size_t>(i)], "x[" + std::to_string(i) + "]");
  std::vector<std::string> names = {h.name(arch::TensorKind::Router)};
  if (h.spec.moe.gpt_oss_experts) {
    names.push_back(h.name(arch::TensorKind::Router, arch::TensorPart::Bias));
    for (auto kind : {arch::TensorKind::ExpertsGateUp, arch::TensorKind::ExpertsGateUpBias, arch::TensorKind::ExpertsDown,
                      arch::TensorKind::ExpertsDownBias}) {
      names.push_back(h.name(kind, arch::TensorPart::Bare));
    }
  } else {
    for (int64_t e = 0; e < h.spec.moe.num_experts; ++e) {
      for (const char* w : {"gate", "up", "down"}) names.push_back(h.expert_name(e, w));
    }
  }
  if (h.spec.moe.num_shared_experts > 0) {
    for (auto kind : {arch::TensorKind::SharedGate, arch::TensorKind::SharedUp, arch::TensorKind::SharedDown})
      names.push_back(h.name(kind));
  }
  double router_grad = 0;
  for (const std::string& name : names) {
    const ParamInfo* p = h.store.find(name);
    ASSERT_NE(p, nullptr) << name;
    float* v = h.store.data(name);
    const float* d = h.store.grad(name);
    for (int64_t i = 0; i < p->numel; i += std::max<int64_t>(1, p->numel / 6)) probe(v + i, d[i], name + "[" + std::to_string(i) + "]");
    if (name == h.name(arch::TensorKind::Router)) {
      for (int64_t i = 0; i < p->numel; ++i) router_grad += std::fabs(d[i]);
    }
  }
  EXPECT_GT(router_grad, 0.0) << "the router must learn through the routing weights";
  EXPECT_LE(skipped, probes / 10) << "too many probes changed the routing";
  if (h.spec.moe.score_correction_bias) {
    const float* db = h.store.grad(h.name(arch::TensorKind::Router, arch::TensorPart::CorrectionBias));
    for (int64_t e = 0; e < h.spec.moe.num_experts; ++e) EXPECT_EQ(db[e], 0.0f) << "the correction bias gets no gradient";
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(
    Routers, MoeModule,
    ::testing::Values(Case{"mixtral", "mixtral.json", {}}, Case{"qwen3_moe", "qwen3_moe.json", {}},
                      Case{"qwen3_moe_raw_topk3", "qwen3_moe.json", {"norm_topk_prob=false", "num_experts_per_tok=3"}},
                      Case{"glm4_moe", "glm4_moe.json", {}},
                      Case{"glm4_moe_grouped", "glm4_moe.json", {"n_group=4", "topk_group=2", "norm_topk_prob=false"}},
                      Case{"deepseek_router_grouped", "glm4_moe.json", {"n_group=2", "topk_group=1", "n_shared_experts=2"}},
                      Case{"deepseek_v2", "deepseek_v2.json", {}},
                      Case{"deepseek_v2_greedy", "deepseek_v2.json", {"topk_method=\"greedy\""}},
                      // The released limit 7 rarely binds here: a clamp's kink inside a probe's step
                      // would spoil the central difference. The clamps' gradients are checked by
                      // ClampedSwiglu.* and, composed, by the gpt_oss PyTorch fixture (limit 1).
                      Case{"gpt_oss", "gpt_oss.json", {}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(MoeBias, AuxLossFreeUpdateFollowsTheSignOfTheLoadGap) {
  Harness h(Case{"glm4", "glm4_moe.json", {}});
  const int64_t n = 40, C = h.spec.hidden_size, E = h.spec.moe.num_experts;
  std::mt19937 gen(3);
  std::normal_distribution<float> noise(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * C));
  for (float& v : x) v = noise(gen);
  float* bias = h.store.data(h.name(arch::TensorKind::Router, arch::TensorPart::CorrectionBias));
  const std::vector<float> before(bias, bias + E);
  h.forward(x, n);
  const std::vector<float> load = h.moe->load();
  h.moe->accumulate_counts();
  h.forward(x, n);  // the same batch twice: counts double, shares unchanged
  h.moe->accumulate_counts();
  h.moe->update_score_bias(h.store, 0.01f);
  int moved = 0;
  for (int64_t e = 0; e < E; ++e) {
    const float share = load[static_cast<size_t>(e)], mean = 1.0f / static_cast<float>(E);
    const float want = before[static_cast<size_t>(e)] + (share < mean ? 0.01f : share > mean ? -0.01f : 0.0f);
    EXPECT_FLOAT_EQ(bias[e], want) << "expert " << e << " load " << share;
    moved += bias[e] != before[static_cast<size_t>(e)];
  }
  EXPECT_GT(moved, 0);
  // Counts were cleared: a second update without forwards moves nothing.
  const std::vector<float> after(bias, bias + E);
  h.moe->update_score_bias(h.store, 0.01f);
  for (int64_t e = 0; e < E; ++e) EXPECT_EQ(bias[e], after[static_cast<size_t>(e)]);
}

TEST(MoeBias, SteersSelectionTowardsTheUnderloaded) {
  // Many updates at a high speed flatten the load of a fixed batch.
  Harness h(Case{"glm4", "glm4_moe.json", {}});
  const int64_t n = 64, C = h.spec.hidden_size, E = h.spec.moe.num_experts;
  // Start badly unbalanced: a bias that sends most tokens to experts 0 and 1.
  float* bias = h.store.data(h.name(arch::TensorKind::Router, arch::TensorPart::CorrectionBias));
  bias[0] = 0.6f;
  bias[1] = 0.5f;
  std::mt19937 gen(4);
  std::normal_distribution<float> noise(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * C));
  for (float& v : x) v = noise(gen);
  auto spread = [&] {
    h.forward(x, n);
    float lo = 1, hi = 0;
    for (float l : h.moe->load()) {
      lo = std::min(lo, l);
      hi = std::max(hi, l);
    }
    return hi - lo;
  };
  const float first = spread();
  for (int i = 0; i < 200; ++i) {
    h.forward(x, n);
    h.moe->accumulate_counts();
    h.moe->update_score_bias(h.store, 0.01f);
  }
  const float last = spread();
  EXPECT_GT(first, 0.3f);
  EXPECT_LT(last, 0.5f * first) << "load spread " << first << " -> " << last << " over " << E << " experts";
}

}  // namespace
}  // namespace keel::nn
