#include "keel/nn/moe.hpp"

#include <algorithm>
#include <cstring>

#include "keel/core/error.hpp"
#include "keel/kernels/gemm.hpp"
#include "keel/kernels/linear.hpp"
#include "keel/kernels/precision.hpp"
#include "keel/nn/arena_temporaries.hpp"

namespace keel::nn {

kernels::RouterConfig router_config(const arch::MoeSpec& moe) {
  kernels::RouterConfig c;
  c.experts = moe.num_experts;
  c.top_k = moe.experts_per_token;
  c.normalize = moe.norm_topk_prob;
  switch (moe.router) {
    case arch::RouterKind::SoftmaxTopK:
      c.score = kernels::RouterScore::Softmax;
      return c;
    case arch::RouterKind::SoftmaxGrouped:  // DeepSeek-V2
      c.score = kernels::RouterScore::Softmax;
      break;
    case arch::RouterKind::SigmoidGrouped:  // DeepSeek-V3, Kimi K2, GLM-4.5
      c.score = kernels::RouterScore::Sigmoid;
      break;
  }
  // The grouped routers: routed_scaling_factor and the group limit.
  c.scaling = static_cast<float>(moe.routed_scaling_factor);
  c.n_group = moe.n_group;
  c.topk_group = moe.topk_group;
  return c;
}

Moe::Moe(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer)
    : router_(router_config(spec.moe)),
      hidden_(spec.hidden_size),
      width_(spec.moe.expert_intermediate_size),
      act_(to_kernel_activation(spec.mlp.activation)) {
  using arch::TensorKind;
  using arch::TensorPart;
  const auto& moe = spec.moe;
  const arch::TensorNameTable& names = *arch::family_row(spec).names;
  // The router is a matrix but not a hidden one: it stays with AdamW (is_hidden_matrix_kind).
  gate_ = store.add(names, {TensorKind::Router, TensorPart::Weight, layer}, {moe.num_experts, hidden_});
  load_.assign(static_cast<size_t>(moe.num_experts), 0.0f);
  pending_counts_.assign(static_cast<size_t>(moe.num_experts), 0);
  if (moe.gpt_oss_experts) {
    // GptOssTopKRouter and GptOssExperts, in the layout order of arch/hf_tensors.cpp.
    fused_ = true;
    swiglu_ = {static_cast<float>(moe.swiglu_alpha), static_cast<float>(moe.swiglu_limit)};
    const int64_t E = moe.num_experts, C = hidden_, F = width_;
    router_bias_ = store.add(names, {TensorKind::Router, TensorPart::Bias, layer}, {E});
    gate_up_ = store.add(names, {TensorKind::ExpertsGateUp, TensorPart::Bare, layer}, {E, C, 2 * F});
    gate_up_bias_ = store.add(names, {TensorKind::ExpertsGateUpBias, TensorPart::Bare, layer}, {E, 2 * F});
    down_ = store.add(names, {TensorKind::ExpertsDown, TensorPart::Bare, layer}, {E, F, C});
    down_bias_ = store.add(names, {TensorKind::ExpertsDownBias, TensorPart::Bare, layer}, {E, C});
    return;
  }
  if (moe.score_correction_bias) {
    bias_ = store.add(names, {TensorKind::Router, TensorPart::CorrectionBias, layer}, {moe.num_experts});
  }
  experts_.resize(static_cast<size_t>(moe.num_experts));
  for (int64_t e = 0; e < moe.num_experts; ++e) {
    Expert& x = experts_[static_cast<size_t>(e)];
    // Each expert's projections are separate HF tensors, so Muon orthogonalizes them one by one.
    x.gate = store.add(names, {TensorKind::ExpertGate, TensorPart::Weight, layer, e}, {width_, hidden_});
    x.up = store.add(names, {TensorKind::ExpertUp, TensorPart::Weight, layer, e}, {width_, hidden_});
    x.down = store.add(names, {TensorKind::ExpertDown, TensorPart::Weight, layer, e}, {hidden_, width_});
  }
  if (moe.num_shared_experts > 0) {
    shared_.emplace(store, spec, layer, /*shared=*/true, moe.shared_intermediate_size);
    auto ref = [&](TensorKind kind) {
      const ParamInfo* info = store.find(arch::TensorRole{kind, TensorPart::Weight, layer});
      KEEL_CHECK(info != nullptr);
      return ParamRef{info->offset, info->numel};
    };
    shared_refs_ = {ref(TensorKind::SharedGate), ref(TensorKind::SharedUp), ref(TensorKind::SharedDown)};
    shared_width_ = moe.shared_intermediate_size;
  }
}

Moe::FusedExpert Moe::fused_expert(const ParameterStore& store, int64_t e) const {
  const int64_t C = hidden_, F = width_;
  return {store.data(gate_up_) + e * C * 2 * F, store.data(gate_up_bias_) + e * 2 * F, store.data(down_) + e * F * C,
          store.data(down_bias_) + e * C};
}

// One expert's hidden activation over its m grouped rows: the clamped SwiGLU of gpt-oss's
// interleaved gate_up, or act(gate)·up; rounded under bf16 (a matmul operand only, as in Mlp).
void Moe::activate(const float* g, const float* u, float* h, int64_t m) const {
  if (fused_) {
    kernels::clamped_swiglu_forward(g, h, m, width_, swiglu_);
  } else {
    kernels::gated_forward(g, u, h, m * width_, act_);
  }
  kernels::round_activation(h, m * width_);
}

void Moe::route_and_run(const ParameterStore& store, const float* x, int64_t n, float* probs, float* weights,
                        Routing& r, float* xg, float* g, float* u, float* h, float* ye) const {
  const int64_t E = router_.experts, k = router_.top_k, C = hidden_, F = width_, rows = n * k;
  std::vector<float> logits(static_cast<size_t>(n * E));
  {
    // The router stays fp32 in bf16 mixed precision: a rounded logit can flip a top-k choice,
    // and DeepSeek-V3 keeps its gating in fp32 for the same reason (arXiv:2412.19437 §3.3.1).
    kernels::PrecisionScope fp32(kernels::Precision::Fp32);
    kernels::linear_forward(x, store.data(gate_), router_bias_.valid() ? store.data(router_bias_) : nullptr,
                            logits.data(), n, C, E);
  }
  r.indices.resize(static_cast<size_t>(rows));
  kernels::router_forward(router_, logits.data(), bias_.valid() ? store.data(bias_) : nullptr, probs, r.indices.data(),
                          weights, n);

  // Group: a counting sort of the n·k assignments by expert, stable in (token, slot) order, so
  // each expert's rows are contiguous and the layout is a pure function of the routing.
  r.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t a = 0; a < rows; ++a) ++r.offsets[static_cast<size_t>(r.indices[static_cast<size_t>(a)] + 1)];
  for (int64_t e = 0; e < E; ++e) r.offsets[static_cast<size_t>(e + 1)] += r.offsets[static_cast<size_t>(e)];
  r.row_token.resize(static_cast<size_t>(rows));
  r.slot_row.resize(static_cast<size_t>(rows));
  std::vector<int64_t> next(r.offsets.begin(), r.offsets.end() - 1);
  for (int64_t a = 0; a < rows; ++a) {
    const int64_t row = next[static_cast<size_t>(r.indices[static_cast<size_t>(a)])]++;
    r.row_token[static_cast<size_t>(row)] = static_cast<int32_t>(a / k);
    r.slot_row[static_cast<size_t>(a)] = row;
  }
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    std::memcpy(xg + row * C, x + static_cast<int64_t>(r.row_token[static_cast<size_t>(row)]) * C, C * sizeof(float));
  }
  // One GEMM per projection and expert over that expert's rows.
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = r.offsets[static_cast<size_t>(e)], m = r.offsets[static_cast<size_t>(e + 1)] - r0;
    if (m == 0) continue;
    if (fused_) {  // gu = x·W_gu + b (interleaved gate/up), h = clamped SwiGLU, y = h·W_d + b
      const FusedExpert w = fused_expert(store, e);
      kernels::linear_forward(xg + r0 * C, w.gate_up, w.gate_up_bias, g + r0 * 2 * F, m, C, 2 * F, true);
      activate(g + r0 * 2 * F, nullptr, h + r0 * F, m);
      kernels::linear_forward(h + r0 * F, w.down, w.down_bias, ye + r0 * C, m, F, C, true);
      continue;
    }
    const Expert& w = experts_[static_cast<size_t>(e)];
    {
      const kernels::SharedBf16Operand shared_x(xg + r0 * C, m, C);  // read by gate and up
      kernels::linear_forward(xg + r0 * C, store.data(w.gate), nullptr, g + r0 * F, m, C, F);
      kernels::linear_forward(xg + r0 * C, store.data(w.up), nullptr, u + r0 * F, m, C, F);
    }
    activate(g + r0 * F, u + r0 * F, h + r0 * F, m);
    kernels::linear_forward(h + r0 * F, store.data(w.down), nullptr, ye + r0 * C, m, F, C);
  }
}

void Moe::combine(const Routing& r, const float* weights, const float* ye, float* y, int64_t n) const {
  const int64_t k = router_.top_k, C = hidden_;
  // Per token, slots in order: a fixed summation order, no races.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    float* yt = y + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const float w = weights[t * k + j];
      const float* src = ye + r.slot_row[static_cast<size_t>(t * k + j)] * C;
      for (int64_t c = 0; c < C; ++c) yt[c] += w * src[c];
    }
  }
}

float* Moe::forward(ParameterStore& store, Arena& arena, const float* x, int64_t n) {
  const int64_t E = router_.experts, k = router_.top_k, C = hidden_, F = width_, rows = n * k;
  x_ = x;
  probs_ = arena.alloc(static_cast<size_t>(n * E));
  weights_ = arena.alloc(static_cast<size_t>(rows));
  xg_ = arena.alloc(static_cast<size_t>(rows * C));
  g_ = arena.alloc(static_cast<size_t>(rows * gate_cols()));
  u_ = fused_ ? nullptr : arena.alloc(static_cast<size_t>(rows * F));  // gpt-oss: gate and up interleaved in g_
  ye_ = arena.alloc(static_cast<size_t>(rows * C));
  // The experts' hidden activations are not kept: the backward recomputes them from g and u
  // (as Mlp does), so they sit above everything kept and their place is given back.
  {
    ArenaTemporaries temporaries(arena);
    route_and_run(store, x, n, probs_, weights_, routing_, xg_, g_, u_, temporaries.alloc(rows * F), ye_);
  }
  entropy_ = kernels::router_entropy(router_, probs_, n);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t count = routing_.offsets[static_cast<size_t>(e + 1)] - routing_.offsets[static_cast<size_t>(e)];
    load_[static_cast<size_t>(e)] = rows ? static_cast<float>(count) / static_cast<float>(rows) : 0.f;
  }
  float* y = shared_ ? shared_->forward(store, arena, x, n) : arena.alloc_zeroed(static_cast<size_t>(n * C));
  // The shared expert's output was a rounded projection; with the routed outputs added it is
  // not bf16, and a post-sublayer norm keeps it as its input: off the packed list.
  if (shared_) kernels::unround_activation(y, n * C);
  combine(routing_, weights_, ye_, y, n);
  return y;
}

void Moe::infer(const ParameterStore& store, const float* x, float* y, int64_t n) const {
  const int64_t E = router_.experts, k = router_.top_k, C = hidden_, F = width_, rows = n * k;
  auto buf = [](int64_t count) { return std::vector<float>(static_cast<size_t>(count)); };
  auto probs = buf(n * E), weights = buf(rows), xg = buf(rows * C), g = buf(rows * gate_cols()), u = buf(rows * F),
       h = buf(rows * F), ye = buf(rows * C);
  Routing r;
  route_and_run(store, x, n, probs.data(), weights.data(), r, xg.data(), g.data(), u.data(), h.data(), ye.data());
  std::fill(y, y + n * C, 0.0f);
  if (shared_) {
    const int64_t S = shared_width_;
    auto sg = buf(n * S), su = buf(n * S), sh = buf(n * S);
    kernels::linear_forward(x, store.data(shared_refs_.gate), nullptr, sg.data(), n, C, S);
    kernels::linear_forward(x, store.data(shared_refs_.up), nullptr, su.data(), n, C, S);
    kernels::gated_forward(sg.data(), su.data(), sh.data(), n * S, act_);
    kernels::round_activation(sh.data(), n * S);  // as Mlp::activate rounds it in training
    kernels::linear_forward(sh.data(), store.data(shared_refs_.down), nullptr, y, n, S, C);
  }
  combine(r, weights.data(), ye.data(), y, n);
}

void Moe::backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, int64_t n) {
  const int64_t E = router_.experts, k = router_.top_k, C = hidden_, F = width_, rows = n * k;
  const Routing& r = routing_;
  if (shared_) shared_->backward(store, arena, dy, dx, n);

  // y_t = Σ_j w_tj·ye_r(t,j): dye_r = w·dy_t, dw_tj = dy_t·ye_r.
  float* dye = arena.alloc(static_cast<size_t>(rows * C));
  float* dweights = arena.alloc(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static)
  for (int64_t a = 0; a < rows; ++a) {
    const int64_t row = r.slot_row[static_cast<size_t>(a)];
    const float* d = dy + (a / k) * C;
    const float* ye = ye_ + row * C;
    float* out = dye + row * C;
    const float w = weights_[a];
    float dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      out[c] = w * d[c];
      dot += d[c] * ye[c];
    }
    dweights[a] = dot;
  }

  // h again, expert by expert as the forward made it: the same bits. The clamped SwiGLU recomputes
  // it here; the gated experts below in the pass of the activation's backward.
  float* h = arena.alloc(static_cast<size_t>(rows * F));
  if (fused_) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = r.offsets[static_cast<size_t>(e)], m = r.offsets[static_cast<size_t>(e + 1)] - r0;
      if (m > 0) activate(g_ + r0 * gate_cols(), nullptr, h + r0 * F, m);
    }
  }
  // Every row belongs to one expert, whose first writer of dh, dg and dxg overwrites them (the
  // down projection's dx, the activation's backward, the gate's dx): no zeroing pass.
  constexpr kernels::GradWrite kFirst = kernels::GradWrite::Overwrite;
  float* dh = arena.alloc(static_cast<size_t>(rows * F));
  float* dg = arena.alloc(static_cast<size_t>(rows * gate_cols()));
  // du takes dh's place: each element of dh is read before du's is written.
  float* du = dh;
  float* dxg = arena.alloc(static_cast<size_t>(rows * C));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = r.offsets[static_cast<size_t>(e)], m = r.offsets[static_cast<size_t>(e + 1)] - r0;
    if (m == 0) continue;
    if (fused_) {
      const FusedExpert w = fused_expert(store, e);
      float* d_gate_up = store.grad(gate_up_) + e * C * 2 * F;
      float* d_gate_up_bias = store.grad(gate_up_bias_) + e * 2 * F;
      float* d_down = store.grad(down_) + e * F * C;
      float* d_down_bias = store.grad(down_bias_) + e * C;
      kernels::linear_backward(h + r0 * F, w.down, dye + r0 * C, dh + r0 * F, d_down, d_down_bias, m, F, C, true, 0,
                               kFirst);
      kernels::clamped_swiglu_backward(g_ + r0 * 2 * F, dh + r0 * F, dg + r0 * 2 * F, m, F, swiglu_);
      kernels::linear_backward(xg_ + r0 * C, w.gate_up, dg + r0 * 2 * F, dxg + r0 * C, d_gate_up, d_gate_up_bias, m, C,
                               2 * F, true, 0, kFirst);
      continue;
    }
    const Expert& w = experts_[static_cast<size_t>(e)];
    // dye is read by the down projection's two products, xg_ by gate's and up's weight gradients.
    const kernels::SharedBf16Operand shared_dy(dye + r0 * C, m, C);
    const kernels::SharedBf16Operand shared_x(xg_ + r0 * C, m, C);
    // dh first (it does not read h), then h, dg and du in one pass (as Mlp::backward), then the
    // down projection's weight gradient.
    kernels::linear_backward(nullptr, store.data(w.down), dye + r0 * C, dh + r0 * F, nullptr, nullptr, m, F, C, false,
                             0, kFirst);
    kernels::gated_backward_and_output(g_ + r0 * F, u_ + r0 * F, dh + r0 * F, h + r0 * F, dg + r0 * F, du + r0 * F,
                                       m * F, act_);
    kernels::round_activation(h + r0 * F, m * F);
    kernels::linear_backward(h + r0 * F, store.data(w.down), dye + r0 * C, nullptr, store.grad(w.down), nullptr, m, F,
                             C);
    kernels::linear_backward(xg_ + r0 * C, store.data(w.gate), dg + r0 * F, dxg + r0 * C, store.grad(w.gate), nullptr,
                             m, C, F, false, 0, kFirst);
    kernels::linear_backward(xg_ + r0 * C, store.data(w.up), du + r0 * F, dxg + r0 * C, store.grad(w.up), nullptr, m,
                             C, F);
  }
  // Scatter back per token, slots in order.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    float* d = dx + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const float* src = dxg + r.slot_row[static_cast<size_t>(t * k + j)] * C;
      for (int64_t c = 0; c < C; ++c) d[c] += src[c];
    }
  }

  // Router: through the selected weights only; the correction bias gets no gradient.
  float* dlogits = arena.alloc_zeroed(static_cast<size_t>(n * E));
  kernels::router_backward(router_, probs_, r.indices.data(), weights_, dweights, dlogits, n);
  kernels::PrecisionScope fp32(kernels::Precision::Fp32);  // the router is fp32 (see route_and_run)
  kernels::linear_backward(x_, store.data(gate_), dlogits, dx, store.grad(gate_),
                           router_bias_.valid() ? store.grad(router_bias_) : nullptr, n, C, E);
}

void Moe::accumulate_counts() {
  for (int64_t e = 0; e < router_.experts; ++e) {
    const auto& o = routing_.offsets;
    pending_counts_[static_cast<size_t>(e)] += o.empty() ? 0 : o[static_cast<size_t>(e + 1)] - o[static_cast<size_t>(e)];
  }
}

void Moe::update_score_bias(ParameterStore& store, float speed) {
  if (bias_.valid() && speed != 0.0f) {
    int64_t total = 0;
    for (int64_t c : pending_counts_) total += c;
    float* b = store.data(bias_);
    const int64_t E = router_.experts;
    // sign(mean − count_e) compared as E·count_e vs total: exact in integers.
    for (int64_t e = 0; e < E; ++e) {
      const int64_t scaled = E * pending_counts_[static_cast<size_t>(e)];
      if (scaled < total) b[e] += speed;
      else if (scaled > total) b[e] -= speed;
    }
  }
  std::fill(pending_counts_.begin(), pending_counts_.end(), 0);
}

}  // namespace keel::nn
