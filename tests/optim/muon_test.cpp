// Newton–Schulz and Muon: singular-value band, update RMS under both scalings, routing by name on
// a tiny Qwen3, decay with the base lr, one hand-checked step and the Nesterov momentum over two.
#include <gtest/gtest.h>

#include <cstring>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "keel/arch/config_file.hpp"
#include "keel/core/error.hpp"
#include "keel/nn/model.hpp"
#include "keel/nn/parameters.hpp"
#include "keel/optim/muon.hpp"
#include "keel/optim/newton_schulz.hpp"

namespace keel::optim {
namespace {

using Mat = std::vector<double>;  // row-major

std::vector<float> gaussian(int64_t n, uint32_t seed, float std = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// Eigenvalues of a symmetric n×n matrix by cyclic Jacobi rotations, in double.
std::vector<double> jacobi_eigenvalues(Mat a, int64_t n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) off += a[p * n + q] * a[p * n + q];
    if (off < 1e-30) break;
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (std::abs(apq) < 1e-300) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
      }
    }
  }
  std::vector<double> ev(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ev[i] = a[i * n + i];
  std::sort(ev.begin(), ev.end());
  return ev;
}

// Singular values (ascending) of a (rows, cols) matrix via the eigenvalues of the smaller Gram matrix.
std::vector<double> singular_values(const float* x, int64_t rows, int64_t cols) {
  const int64_t r = std::min(rows, cols);
  Mat gram(static_cast<size_t>(r * r), 0.0);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j) {
      double s = 0;
      if (rows <= cols)
        for (int64_t k = 0; k < cols; ++k) s += static_cast<double>(x[i * cols + k]) * x[j * cols + k];
      else
        for (int64_t k = 0; k < rows; ++k) s += static_cast<double>(x[k * cols + i]) * x[k * cols + j];
      gram[i * r + j] = s;
    }
  std::vector<double> ev = jacobi_eigenvalues(gram, r);
  for (double& e : ev) e = std::sqrt(std::max(e, 0.0));
  return ev;
}

// The same iteration in double with plain loops and no transpose trick: X ← aX + b(XXᵀ)X + c(XXᵀ)²X.
Mat newton_schulz_reference(const Mat& g, int64_t rows, int64_t cols, int steps = 5) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  double norm = 0;
  for (double v : g) norm += v * v;
  norm = std::sqrt(norm) + 1e-7;
  Mat x(g);
  for (double& v : x) v /= norm;
  for (int s = 0; s < steps; ++s) {
    Mat gram(static_cast<size_t>(rows * rows), 0.0), gram2(gram.size(), 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < rows; ++j)
        for (int64_t k = 0; k < cols; ++k) gram[i * rows + j] += x[i * cols + k] * x[j * cols + k];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < rows; ++j)
        for (int64_t k = 0; k < rows; ++k) gram2[i * rows + j] += gram[i * rows + k] * gram[k * rows + j];
    Mat y(x.size(), 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double acc = a * x[i * cols + j];
        for (int64_t k = 0; k < rows; ++k) acc += (b * gram[i * rows + k] + c * gram2[i * rows + k]) * x[k * cols + j];
        y[i * cols + j] = acc;
      }
    x = y;
  }
  return x;
}

std::vector<float> run_ns(const std::vector<float>& g, int64_t rows, int64_t cols) {
  std::vector<float> out(g.size()), ws(static_cast<size_t>(newton_schulz_workspace_floats(rows, cols)));
  newton_schulz5(g.data(), out.data(), rows, cols, ws.data());
  return out;
}

struct Shape {
  int64_t rows, cols, rank;  // rank < min: the product of (rows, rank) and (rank, cols) Gaussians
};

std::vector<float> test_matrix(const Shape& s, uint32_t seed) {
  if (s.rank >= std::min(s.rows, s.cols)) return gaussian(s.rows * s.cols, seed);
  std::vector<float> l = gaussian(s.rows * s.rank, seed), r = gaussian(s.rank * s.cols, seed + 1), m(s.rows * s.cols);
  for (int64_t i = 0; i < s.rows; ++i)
    for (int64_t j = 0; j < s.cols; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < s.rank; ++k) acc += static_cast<double>(l[i * s.rank + k]) * r[k * s.cols + j];
      m[i * s.cols + j] = static_cast<float>(acc);
    }
  return m;
}

TEST(NewtonSchulz, SingularValuesInBand) {
  for (const Shape& s : {Shape{64, 64, 64}, Shape{64, 256, 64}, Shape{256, 64, 64}, Shape{96, 160, 12},
                         Shape{160, 96, 12}}) {
    std::vector<float> g = test_matrix(s, 7);
    std::vector<double> in_sv = singular_values(g.data(), s.rows, s.cols);
    std::vector<double> sv = singular_values(run_ns(g, s.rows, s.cols).data(), s.rows, s.cols);
    const int64_t r = std::min(s.rows, s.cols);
    // Directions with a usable input singular value (σ/σ_max > 1e-2) land in the band; for a
    // square Gaussian the few smallest σ sit below that and need more than 5 steps.
    double lo = 1e9, hi = 0;
    int64_t counted = 0;
    for (int64_t i = 0; i < r; ++i) {
      if (in_sv[i] < 1e-2 * in_sv.back()) {
        if (s.rank < r && i < r - s.rank) {
          EXPECT_LT(sv[i], 1e-3) << "null direction " << i;
        }
        continue;
      }
      lo = std::min(lo, sv[i]);
      hi = std::max(hi, sv[i]);
      ++counted;
    }
    std::printf("NS5 %ldx%ld rank %ld: %ld of %ld singular values in [%.3f, %.3f]; output σ range [%.3g, %.3f]\n",
                static_cast<long>(s.rows), static_cast<long>(s.cols), static_cast<long>(std::min(s.rank, r)),
                static_cast<long>(counted), static_cast<long>(r), lo, hi, sv.front(), sv.back());
    EXPECT_GE(counted, std::min(s.rank, r) - 2);
    EXPECT_GT(lo, 0.5);
    EXPECT_LT(hi, 1.5);
  }
}

TEST(NewtonSchulz, MatchesDoubleReference) {
  for (const Shape& s : {Shape{16, 40, 16}, Shape{40, 16, 16}, Shape{3, 2, 2}, Shape{1, 7, 1}}) {
    std::vector<float> g = test_matrix(s, 11);
    std::vector<float> out = run_ns(g, s.rows, s.cols);
    Mat ref = newton_schulz_reference(Mat(g.begin(), g.end()), s.rows, s.cols);
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(out[i] - ref[i]));
    EXPECT_LT(worst, 2e-5) << s.rows << "x" << s.cols;
  }
}

TEST(NewtonSchulz, DeterministicAcrossCalls) {
  // Same input, same bits: Muon steps must not depend on thread timing (exact resume).
  const int64_t rows = 256, cols = 768;
  std::vector<float> g = gaussian(rows * cols, 3), first(g.size()), again(g.size());
  std::vector<float> ws(static_cast<size_t>(newton_schulz_workspace_floats(rows, cols)));
  newton_schulz5(g.data(), first.data(), rows, cols, ws.data());
  for (int i = 0; i < 3; ++i) {
    newton_schulz5(g.data(), again.data(), rows, cols, ws.data());
    ASSERT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * sizeof(float))) << "call " << i;
  }
}

// A store with a single Muon matrix.
nn::ParameterStore one_matrix(int64_t rows, int64_t cols, bool decay = true) {
  nn::ParameterStore store;
  store.add("model.layers.0.mlp.up_proj.weight", {rows, cols}, nn::Init::Normal, decay, true);
  store.finalize();
  return store;
}

// Update RMS of one step from W = 0 (lr 1, no decay), and sqrt(mean σ'²) of NS5(G): the factor
// by which NS5's inexact orthogonalization (σ' in ≈[0.68, 1.14], not 1) scales the ideal RMS.
std::pair<double, double> update_rms(MuonScaling scaling, int64_t rows, int64_t cols) {
  nn::ParameterStore store = one_matrix(rows, cols);
  std::vector<float> g = gaussian(rows * cols, 5);
  std::copy(g.begin(), g.end(), store.grads().begin());
  MuonConfig cfg;
  cfg.scaling = scaling;
  cfg.weight_decay = 0;
  Muon muon(store, cfg);
  muon.step(store, 1.0f);  // W was 0, so W is now −update
  double s = 0;
  for (float v : store.values()) s += static_cast<double>(v) * v;
  std::vector<double> sv = singular_values(run_ns(g, rows, cols).data(), rows, cols);
  double s2 = 0;
  for (double x : sv) s2 += x * x;
  return {std::sqrt(s / static_cast<double>(rows * cols)), std::sqrt(s2 / static_cast<double>(sv.size()))};
}

TEST(Muon, UpdateRmsMoonlight) {
  for (auto [r, c] : {std::pair<int64_t, int64_t>{128, 512}, {512, 128}, {256, 256}}) {
    const auto [rms, sv_rms] = update_rms(MuonScaling::Moonlight, r, c);
    std::printf("Moonlight update RMS %ldx%ld: %.4f (target 0.2; 0.2 x sqrt(mean sigma'^2) = %.4f)\n",
                static_cast<long>(r), static_cast<long>(c), rms, 0.2 * sv_rms);
    // Exactly 0.2 for a perfect orthogonalization; NS5's singular values fall short of 1.
    EXPECT_NEAR(rms, 0.2 * sv_rms, 0.2 * 0.01) << r << "x" << c;
    EXPECT_GT(rms, 0.2 * 0.8);
    EXPECT_LT(rms, 0.2 * 1.05);
  }
}

TEST(Muon, UpdateRmsIsExactlyPointTwoWithUpdateNorm) {
  // Moonlight §3.1's "Update Norm": full-rank inputs of every shape get update RMS 0.2.
  for (auto [r, c] : {std::pair<int64_t, int64_t>{128, 512}, {512, 128}, {256, 256}, {96, 40}}) {
    const auto [rms, sv_rms] = update_rms(MuonScaling::UpdateNorm, r, c);
    std::printf("UpdateNorm update RMS %ldx%ld: %.6f (sqrt(mean sigma'^2) = %.4f)\n", static_cast<long>(r),
                static_cast<long>(c), rms, sv_rms);
    EXPECT_NEAR(rms, 0.2, 0.2 * 1e-5) << r << "x" << c;
  }
}

TEST(Muon, ScalingNamesParse) {
  EXPECT_EQ(parse_muon_scaling("moonlight"), MuonScaling::Moonlight);
  EXPECT_EQ(parse_muon_scaling("keller_jordan"), MuonScaling::KellerJordan);
  EXPECT_EQ(parse_muon_scaling("update_norm"), MuonScaling::UpdateNorm);
  EXPECT_THROW(parse_muon_scaling("spectral"), Error);
}

TEST(Muon, UpdateRmsKellerJordan) {
  for (auto [r, c] : {std::pair<int64_t, int64_t>{128, 512}, {512, 128}}) {
    const auto [rms, sv_rms] = update_rms(MuonScaling::KellerJordan, r, c);
    const double want = 1.0 / std::sqrt(static_cast<double>(c));
    std::printf("KJ update RMS %ldx%ld: %.4f (1/sqrt(B) = %.4f; x sqrt(mean sigma'^2) = %.4f)\n",
                static_cast<long>(r), static_cast<long>(c), rms, want, want * sv_rms);
    EXPECT_NEAR(rms, want * sv_rms, want * 0.01) << r << "x" << c;
    EXPECT_GT(rms, want * 0.8);
    EXPECT_LT(rms, want * 1.05);
  }
}

arch::ModelSpec tiny_qwen3() {
  return arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/qwen3.json", {"tie_word_embeddings=false"});
}

TEST(Muon, RoutesHiddenMatricesByName) {
  nn::TransformerModel model(tiny_qwen3());
  const nn::ParameterStore& store = model.parameters();
  Muon muon(store, MuonConfig{});
  int64_t n_muon = 0;
  for (const nn::ParamInfo& p : store.entries()) {
    bool want_muon = false;
    for (const char* proj : {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                             ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"})
      if (p.name.ends_with(proj)) want_muon = true;
    EXPECT_EQ(muon.uses_muon(p.name), want_muon) << p.name;
    n_muon += want_muon;
  }
  EXPECT_EQ(n_muon, 2 * 7);
  EXPECT_FALSE(muon.uses_muon("model.embed_tokens.weight"));
  EXPECT_FALSE(muon.uses_muon("lm_head.weight"));
  EXPECT_FALSE(muon.uses_muon("model.norm.weight"));
  EXPECT_FALSE(muon.uses_muon("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_EQ(muon.muon_entries().size() + muon.adamw_entries().size(), store.entries().size());
  ASSERT_NE(store.find("lm_head.weight"), nullptr);
}

TEST(Muon, OverridePatterns) {
  nn::TransformerModel model(tiny_qwen3());
  const nn::ParameterStore& store = model.parameters();
  MuonConfig cfg;
  cfg.force_adamw = {"*.q_proj.*", "layers.1.mlp"};
  cfg.force_muon = {"lm_head"};
  Muon muon(store, cfg);
  EXPECT_FALSE(muon.uses_muon("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(muon.uses_muon("model.layers.0.self_attn.k_proj.weight"));
  EXPECT_TRUE(muon.uses_muon("model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(muon.uses_muon("model.layers.1.mlp.up_proj.weight"));
  EXPECT_TRUE(muon.uses_muon("lm_head.weight"));
  MuonConfig bad;
  bad.force_muon = {"*norm*"};
  EXPECT_THROW(Muon(store, bad), Error);
  EXPECT_TRUE(name_matches("model.*.weight", "model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(name_matches("*.bias", "model.layers.0.mlp.up_proj.weight"));
  EXPECT_TRUE(name_matches("up_proj", "model.layers.0.mlp.up_proj.weight"));
}

TEST(Muon, WeightDecayUsesBaseLr) {
  // Zero gradients: NS5(0) = 0 and Adam's update is 0, so only the decay moves the weights.
  nn::ParameterStore store;
  store.add("model.layers.0.mlp.up_proj.weight", {8, 32}, nn::Init::Normal, true, true);
  store.add("lm_head.weight", {16, 8}, nn::Init::Normal, true, false);
  store.add("model.norm.weight", {8}, nn::Init::Ones, false);
  store.finalize();
  store.initialize(1, 0.5f);
  std::vector<float> before(store.values().begin(), store.values().end());
  MuonConfig cfg;
  cfg.weight_decay = 0.1f;
  cfg.adamw.weight_decay = 0.1f;
  Muon muon(store, cfg);
  const float lr = 0.05f;
  muon.step(store, lr);
  for (const nn::ParamInfo& p : store.entries()) {
    const float factor = p.weight_decay ? 1.0f - lr * 0.1f : 1.0f;
    for (int64_t i = 0; i < p.numel; ++i)
      EXPECT_FLOAT_EQ(store.values()[p.offset + i], before[p.offset + i] * factor) << p.name << "[" << i << "]";
  }
}

TEST(Muon, HandComputedStep2x2) {
  // G = R(θ)·diag(3, 4)·R(φ)ᵀ, so NS5 acts on 0.6 and 0.8 by the scalar quintic p(σ) = aσ + bσ³ + cσ⁵,
  // applied 5 times: O = R(θ)·diag(p⁵(0.6), p⁵(0.8))·R(φ)ᵀ.
  auto rot = [](double t) { return Mat{std::cos(t), -std::sin(t), std::sin(t), std::cos(t)}; };
  const Mat r = rot(0.3), q = rot(-1.1);
  const double s0 = 3, s1 = 4;
  auto poly5 = [](double x) {
    for (int i = 0; i < 5; ++i) x = 3.4445 * x - 4.7750 * x * x * x + 2.0315 * x * x * x * x * x;
    return x;
  };
  const double norm = std::sqrt(s0 * s0 + s1 * s1) + 1e-7;
  const double p0 = poly5(s0 / norm), p1 = poly5(s1 / norm);
  nn::ParameterStore store = one_matrix(2, 2);
  const float w0[4] = {0.5f, -0.25f, 1.0f, 0.75f};
  for (int i = 0; i < 4; ++i) store.values()[i] = w0[i];
  double o[4];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      store.grads()[i * 2 + j] = static_cast<float>(r[i * 2 + 0] * s0 * q[j * 2 + 0] + r[i * 2 + 1] * s1 * q[j * 2 + 1]);
      o[i * 2 + j] = r[i * 2 + 0] * p0 * q[j * 2 + 0] + r[i * 2 + 1] * p1 * q[j * 2 + 1];
    }
  MuonConfig cfg;
  cfg.weight_decay = 0.1f;
  Muon muon(store, cfg);
  const double lr = 0.01;
  muon.step(store, static_cast<float>(lr));
  // First step: buf = G, U = G + 0.95·G = 1.95·G, and NS5 ignores the scalar.
  const double scale = 0.2 * std::sqrt(2.0);
  for (int i = 0; i < 4; ++i) {
    const double want = w0[i] * (1 - lr * 0.1) - lr * scale * o[i];
    EXPECT_NEAR(store.values()[i], want, 1e-6) << i;
  }
}

TEST(Muon, OneStep3x2AgainstDoubleReference) {
  nn::ParameterStore store = one_matrix(3, 2);
  const float w0[6] = {0.1f, -0.2f, 0.3f, 0.05f, -0.4f, 0.2f};
  const float g[6] = {1.0f, 0.5f, -0.3f, 2.0f, 0.7f, -1.2f};
  for (int i = 0; i < 6; ++i) store.values()[i] = w0[i], store.grads()[i] = g[i];
  MuonConfig cfg;
  cfg.weight_decay = 0.2f;
  Muon muon(store, cfg);
  const double lr = 0.02;
  muon.step(store, static_cast<float>(lr));
  Mat u(6);
  for (int i = 0; i < 6; ++i) u[i] = g[i] + 0.95 * g[i];
  const Mat o = newton_schulz_reference(u, 3, 2);
  const double scale = 0.2 * std::sqrt(3.0);
  for (int i = 0; i < 6; ++i)
    EXPECT_NEAR(store.values()[i], w0[i] * (1 - lr * 0.2) - lr * scale * o[i], 1e-6) << i;
}

TEST(Muon, NesterovMomentumTwoSteps) {
  nn::ParameterStore store = one_matrix(3, 2);
  const float g1[6] = {1.0f, 0.5f, -0.3f, 2.0f, 0.7f, -1.2f};
  const float g2[6] = {-0.4f, 0.9f, 1.1f, 0.2f, -0.6f, 0.3f};
  MuonConfig cfg;
  cfg.weight_decay = 0;
  cfg.scaling = MuonScaling::KellerJordan;
  Muon muon(store, cfg);
  const double lr = 0.02, beta = 0.95;
  for (int i = 0; i < 6; ++i) store.grads()[i] = g1[i];
  muon.step(store, static_cast<float>(lr));
  std::vector<float> after1(store.values().begin(), store.values().end());
  for (int i = 0; i < 6; ++i) store.grads()[i] = g2[i];
  muon.step(store, static_cast<float>(lr));
  Mat buf(6), u(6);
  for (int i = 0; i < 6; ++i) {
    buf[i] = beta * g1[i] + g2[i];  // SGD-sum: buf₂ = β·G₁ + G₂
    u[i] = g2[i] + beta * buf[i];   // Nesterov: U₂ = G₂ + β·buf₂
    EXPECT_NEAR(muon.momentum_buffer().data()[i], buf[i], 1e-6) << i;
  }
  const Mat o = newton_schulz_reference(u, 3, 2);
  const double scale = std::sqrt(3.0 / 2.0);  // KJ: sqrt(max(1, A/B))
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(store.values()[i], after1[i] - lr * scale * o[i], 1e-6) << i;
  EXPECT_EQ(muon.steps_taken(), 2);
  EXPECT_GE(muon.last_ns_seconds(), 0.0);
}

}  // namespace
}  // namespace keel::optim

namespace keel::optim {
namespace {

// MoE: each expert's gate/up/down is its own HF tensor and so its own Muon matrix (one
// Newton–Schulz per expert, never over a stack of experts); the router and the correction
// bias stay out of Muon, the bias out of every optimizer.
TEST(MuonMoe, EachExpertIsOrthogonalizedOnItsOwnAndTheRouterUsesAdamW) {
  arch::ModelSpec spec = arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/glm4_moe.json");
  nn::TransformerModel model(spec);
  model.initialize(1);
  auto& store = model.parameters();
  Muon muon(store, MuonConfig{});
  const std::string m = "model.layers.1.mlp.";
  EXPECT_FALSE(muon.uses_muon(m + "gate.weight"));
  EXPECT_TRUE(muon.uses_muon(m + "experts.0.gate_proj.weight"));
  EXPECT_TRUE(muon.uses_muon(m + "experts.7.down_proj.weight"));
  EXPECT_TRUE(muon.uses_muon(m + "shared_experts.up_proj.weight"));
  auto in = [&](const std::vector<size_t>& list, const std::string& name) {
    return std::any_of(list.begin(), list.end(), [&](size_t i) { return store.entries()[i].name == name; });
  };
  EXPECT_TRUE(in(muon.adamw_entries(), m + "gate.weight"));
  EXPECT_FALSE(in(muon.adamw_entries(), m + "gate.e_score_correction_bias"));
  EXPECT_FALSE(in(muon.muon_entries(), m + "gate.e_score_correction_bias"));

  // One step from zero momentum: expert 3's up_proj moves by exactly -lr·scale·NS5(G·(1+β))
  // of its own gradient, whatever the other experts' gradients are.
  auto grads = gaussian(store.size(), 9);
  std::copy(grads.begin(), grads.end(), store.grads().begin());
  const std::string name = m + "experts.3.up_proj.weight";
  const nn::ParamInfo* p = store.find(name);
  const int64_t rows = p->shape[0], cols = p->shape[1];
  std::vector<float> before(store.data(name), store.data(name) + p->numel);
  float* bias = store.data(m + "gate.e_score_correction_bias");
  bias[2] = 0.25f;
  std::vector<float> u(static_cast<size_t>(p->numel)), o(u.size()),
      ws(static_cast<size_t>(newton_schulz_workspace_floats(rows, cols)));
  for (int64_t i = 0; i < p->numel; ++i) u[static_cast<size_t>(i)] = store.grad(name)[i] * (1.0f + 0.95f);
  newton_schulz5(u.data(), o.data(), rows, cols, ws.data(), 5);
  const float lr = 0.01f;
  muon.step(store, lr);
  const float scale = muon.update_scale(rows, cols), decay = 1.0f - lr * 0.1f;
  double worst = 0;
  for (int64_t i = 0; i < p->numel; ++i) {
    const double want = before[static_cast<size_t>(i)] * decay - lr * scale * o[static_cast<size_t>(i)];
    worst = std::max(worst, std::fabs(store.data(name)[i] - want));
  }
  EXPECT_LT(worst, 1e-6);
  EXPECT_EQ(bias[2], 0.25f) << "the optimizer must not touch the correction bias";
}

}  // namespace
}  // namespace keel::optim
