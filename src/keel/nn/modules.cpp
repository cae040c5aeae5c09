#include "keel/nn/modules.hpp"

#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "keel/core/error.hpp"
#include "keel/kernels/attention.hpp"
#include "keel/kernels/attention_sink.hpp"
#include "keel/kernels/gemm.hpp"
#include "keel/kernels/linear.hpp"
#include "keel/kernels/norm.hpp"
#include "keel/kernels/precision.hpp"
#include "keel/nn/arena_temporaries.hpp"
#include "keel/nn/output_gate.hpp"

namespace keel::nn {

kernels::Activation to_kernel_activation(arch::Activation a) {
  switch (a) {
    case arch::Activation::Silu: return kernels::Activation::Silu;
    case arch::Activation::Gelu: return kernels::Activation::Gelu;
    case arch::Activation::GeluTanh: return kernels::Activation::GeluTanh;
    case arch::Activation::Relu: return kernels::Activation::Relu;
  }
  return kernels::Activation::Silu;
}

void rope_at(float* x, const kernels::RopeTable& table, const StepShape& s, int64_t heads, int64_t head_dim) {
  if (s.first_position == 0) {
    kernels::rope_forward(x, table, s.batch, s.seq, heads, head_dim);
    return;
  }
  KEEL_CHECK(s.batch == 1);  // a cache continues one sequence
  kernels::rope_forward_at(x, table, s.seq, heads, head_dim, s.first_position);
}

namespace {
using arch::TensorKind;
using arch::TensorPart;
const float* opt(const ParameterStore& s, ParamRef r) { return r.valid() ? s.data(r) : nullptr; }
float* opt_grad(ParameterStore& s, ParamRef r) { return r.valid() ? s.grad(r) : nullptr; }
}  // namespace

// ---------------------------------------------------------------------------------------------
// Norm

Norm::Norm(ParameterStore& store, const arch::TensorNameTable& names, TensorKind kind, int64_t layer, int64_t dim,
           arch::NormKind norm_kind, float eps, bool unit_offset)
    : kind_(norm_kind), unit_offset_(unit_offset), dim_(dim), eps_(eps) {
  KEEL_CHECK(!unit_offset || norm_kind == arch::NormKind::RmsNorm);
  weight_ = store.add(names, {kind, TensorPart::Weight, layer}, {dim});
  if (unit_offset) store.set_init(weight_, Init::Zeros);  // 1 + 0: the identity gain at init
  if (norm_kind == arch::NormKind::LayerNorm) bias_ = store.add(names, {kind, TensorPart::Bias, layer}, {dim});
}

const float* Norm::gain(const ParameterStore& store, float* scratch) const {
  const float* w = store.data(weight_);
  if (!unit_offset_) return w;
  for (int64_t i = 0; i < dim_; ++i) scratch[i] = 1.f + w[i];
  return scratch;
}

float* Norm::compute(const ParameterStore& store, Arena& arena, const float* x, int64_t n, float* out,
                     float*& mean, float*& rstd) const {
  float* y = out != nullptr ? out : arena.alloc(static_cast<size_t>(n * dim_));
  rstd = arena.alloc(static_cast<size_t>(n));
  switch (kind_) {
    case arch::NormKind::RmsNorm:
      kernels::rmsnorm_forward(x, gain(store, unit_offset_ ? arena.alloc(static_cast<size_t>(dim_)) : nullptr), y,
                               rstd, n, dim_, eps_);
      break;
    case arch::NormKind::LayerNorm:
      mean = arena.alloc(static_cast<size_t>(n));
      kernels::layernorm_forward(x, store.data(weight_), store.data(bias_), y, mean, rstd, n, dim_, eps_);
      break;
  }
  return y;
}

float* Norm::forward(ParameterStore& store, Arena& arena, const float* x, int64_t n, float* out) {
  x_ = x;
  y_ = compute(store, arena, x, n, out, mean_, rstd_);
  output_gone_ = false;
  return y_;
}

void Norm::recompute_output(const ParameterStore& store, int64_t n) {
  output_gone_ = false;
  switch (kind_) {
    case arch::NormKind::RmsNorm: {
      std::vector<float> scratch(unit_offset_ ? static_cast<size_t>(dim_) : 0);
      kernels::rmsnorm_apply(x_, gain(store, scratch.data()), rstd_, y_, n, dim_);
      break;
    }
    case arch::NormKind::LayerNorm:
      kernels::layernorm_apply(x_, store.data(weight_), store.data(bias_), mean_, rstd_, y_, n, dim_);
      break;
  }
}

float* Norm::forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n) const {
  float *mean = nullptr, *rstd = nullptr;
  return compute(store, arena, x, n, nullptr, mean, rstd);
}

void Norm::backward(ParameterStore& store, const float* dy, float* dx, int64_t n) {
  switch (kind_) {
    case arch::NormKind::RmsNorm: {
      // d(1 + w)/dw = 1: the gain's gradient is the weight's.
      std::vector<float> scratch(unit_offset_ ? static_cast<size_t>(dim_) : 0);
      kernels::rmsnorm_backward(x_, gain(store, scratch.data()), rstd_, dy, dx, store.grad(weight_), n, dim_);
      break;
    }
    case arch::NormKind::LayerNorm:
      kernels::layernorm_backward(x_, store.data(weight_), mean_, rstd_, dy, dx, store.grad(weight_),
                                  store.grad(bias_), n, dim_);
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Attention

Attention::Attention(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer, const kernels::RopeTable* rope)
    : layout_(arch::family_row(spec).projections),
      hidden_(spec.hidden_size),
      heads_(spec.attention.num_heads),
      kv_heads_(spec.attention.num_kv_heads),
      head_dim_(spec.attention.head_dim),
      softcap_(static_cast<float>(spec.attention.softcap)),
      scale_(static_cast<float>(spec.attention.softmax_scale())),
      window_(spec.is_sliding_layer(layer) ? spec.attention.sliding_window : 0),
      rope_(rope) {
  const auto& a = spec.attention;
  const arch::TensorNameTable& names = *arch::family_row(spec).names;
  auto add = [&](TensorKind kind, TensorPart part, std::vector<int64_t> shape) {
    return store.add(names, {kind, part, layer}, std::move(shape));
  };
  const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_;
  switch (layout_) {
    case arch::ProjectionLayout::Gpt2Conv1D:
      w_qkv_ = add(TensorKind::Qkv, TensorPart::Weight, {hidden_, 3 * hidden_});
      b_qkv_ = add(TensorKind::Qkv, TensorPart::Bias, {3 * hidden_});
      wo_ = add(TensorKind::O, TensorPart::Weight, {hidden_, hidden_});
      bo_ = add(TensorKind::O, TensorPart::Bias, {hidden_});
      return;
    case arch::ProjectionLayout::Linear:
      break;
  }
  output_gate_ = a.output_gate;
  const int64_t q_proj_out = (output_gate_ ? 2 : 1) * q_out;
  wq_ = add(TensorKind::Q, TensorPart::Weight, {q_proj_out, hidden_});
  if (a.qkv_bias) bq_ = add(TensorKind::Q, TensorPart::Bias, {q_proj_out});
  wk_ = add(TensorKind::K, TensorPart::Weight, {kv_out, hidden_});
  if (a.qkv_bias) bk_ = add(TensorKind::K, TensorPart::Bias, {kv_out});
  wv_ = add(TensorKind::V, TensorPart::Weight, {kv_out, hidden_});
  if (a.qkv_bias) bv_ = add(TensorKind::V, TensorPart::Bias, {kv_out});
  wo_ = add(TensorKind::O, TensorPart::Weight, {hidden_, q_out});
  if (a.o_bias) bo_ = add(TensorKind::O, TensorPart::Bias, {hidden_});
  if (a.sinks) sinks_ = add(TensorKind::AttentionSink, TensorPart::Bare, {heads_});
  if (a.qk_norm) {
    qk_norm_.emplace(store, names, layer, heads_, kv_heads_, head_dim_, static_cast<float>(spec.norm_eps),
                     a.qk_norm_full_width, spec.norm_unit_offset);
  }
}

kernels::AttentionDims Attention::dims(const StepShape& s) const {
  kernels::AttentionDims d{s.batch, s.seq, heads_, kv_heads_, head_dim_, head_dim_, scale_, softcap_};
  d.window = window_;
  if (layout_ == arch::ProjectionLayout::Gpt2Conv1D) d.q_stride = d.k_stride = d.v_stride = 3 * hidden_;  // project()
  return d;
}

void Attention::round_inputs(const Inputs& in, int64_t n) const {
  // Under bf16 every projection's output is rounded by linear_forward (GPT-2's q|k|v, every v,
  // q and its output gate split from one rounded product), and QK-Norm's q and k where
  // normed_heads makes them: rounding those again would be a pass that changes no value. What
  // RoPE rotated after the rounding, q and k without QK-Norm, is rounded here.
  if (in.qkv != nullptr || qk_norm_) return;
  kernels::round_activation(in.q, n * heads_ * head_dim_);
  kernels::round_activation(in.k, n * kv_heads_ * head_dim_);
}

Attention::Inputs Attention::project(const ParameterStore& store, Arena& arena, const float* x, const StepShape& s,
                                     bool heads_now) const {
  const int64_t n = s.tokens();
  const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_;
  Inputs in;
  if (layout_ == arch::ProjectionLayout::Gpt2Conv1D) {
    // c_attn's (hidden, 3·hidden) weight holds [q | k | v] column blocks: one product gives
    // rows of [q | k | v], which attention reads in place with a row stride of 3·hidden (dims()).
    in.qkv = arena.alloc(static_cast<size_t>(n * 3 * hidden_));
    kernels::linear_forward(x, store.data(w_qkv_), store.data(b_qkv_), in.qkv, n, hidden_, 3 * hidden_, true);
    in.q = in.qkv;
    in.k = in.qkv + hidden_;
    in.v = in.qkv + 2 * hidden_;
    return in;
  }
  if (!qk_norm_) {
    in.q = arena.alloc(static_cast<size_t>(n * q_out));
    in.k = arena.alloc(static_cast<size_t>(n * kv_out));
  }
  in.v = arena.alloc(static_cast<size_t>(n * kv_out));
  float* q_dst = in.q;
  float* k_dst = in.k;
  const kernels::SharedBf16Operand shared_x(x, n, hidden_);  // read by q, k and v
  if (qk_norm_) {
    in.q_raw = q_dst = arena.alloc(static_cast<size_t>(n * q_out));
    in.k_raw = k_dst = arena.alloc(static_cast<size_t>(n * kv_out));
  }
  if (output_gate_) {
    in.gate = arena.alloc(static_cast<size_t>(n * q_out));
    {  // the joint product is read only by the split
      ArenaTemporaries temporaries(arena);
      float* qg = temporaries.alloc(n * 2 * q_out);
      kernels::linear_forward(x, store.data(wq_), opt(store, bq_), qg, n, hidden_, 2 * q_out);
      split_query_gate(qg, q_dst, in.gate, n, heads_, head_dim_);
    }
    // Copies of a rounded product: bf16 values already, recorded so packing holds them in 2 bytes.
    kernels::round_activation(q_dst, n * q_out);
    kernels::round_activation(in.gate, n * q_out);
  } else {
    kernels::linear_forward(x, store.data(wq_), opt(store, bq_), q_dst, n, hidden_, q_out);
  }
  kernels::linear_forward(x, store.data(wk_), opt(store, bk_), k_dst, n, hidden_, kv_out);
  kernels::linear_forward(x, store.data(wv_), opt(store, bv_), in.v, n, hidden_, kv_out);
  if (!qk_norm_) {
    rope_at(in.q, *rope_, s, heads_, head_dim_);
    rope_at(in.k, *rope_, s, kv_heads_, head_dim_);
    return in;
  }
  const QkNorm::Saved stats = qk_norm_->stats(arena, in.q_raw, in.k_raw, n);
  in.q_rstd = stats.q_rstd;
  in.k_rstd = stats.k_rstd;
  if (heads_now) {
    in.q = arena.alloc(static_cast<size_t>(n * q_out));
    in.k = arena.alloc(static_cast<size_t>(n * kv_out));
    normed_heads(store, in, s);
  }
  return in;
}

void Attention::normed_heads(const ParameterStore& store, const Inputs& in, const StepShape& s) const {
  qk_norm_->normalize(store, {in.q_raw, in.k_raw, in.q_rstd, in.k_rstd}, in.q, in.k, s.tokens());
  rope_at(in.q, *rope_, s, heads_, head_dim_);
  rope_at(in.k, *rope_, s, kv_heads_, head_dim_);
  // bf16: rounded here as well as by round_inputs (rounding is idempotent), so the backward's
  // recomputation cannot read q and k at a precision the forward's attention did not.
  kernels::round_activation(in.q, s.tokens() * heads_ * head_dim_);
  kernels::round_activation(in.k, s.tokens() * kv_heads_ * head_dim_);
}

float* Attention::output(const ParameterStore& store, Arena& arena, const float* attn, int64_t n) const {
  float* y = arena.alloc(static_cast<size_t>(n * hidden_));
  const bool conv1d = layout_ == arch::ProjectionLayout::Gpt2Conv1D;
  kernels::linear_forward(attn, store.data(wo_), opt(store, bo_), y, n, heads_ * head_dim_, hidden_, conv1d);
  return y;
}

const float* Attention::finish(const ParameterStore& store, Arena& arena, const Inputs& in, float* out, float* lse,
                              const kernels::AttentionDims& d) const {
  const int64_t count = d.batch * d.seq * heads_ * head_dim_;
  if (sinks_.valid()) kernels::attention_sink_forward(out, lse, store.data(sinks_), d);
  kernels::round_activation(out, count);
  if (!output_gate_) return out;
  float* gated = arena.alloc(static_cast<size_t>(count));
  output_gate_forward(out, in.gate, gated, count);
  kernels::round_activation(gated, count);
  return gated;
}

float* Attention::forward(ParameterStore& store, Arena& arena, const float* x, const StepShape& s, float* max_logit) {
  const int64_t n = s.tokens();
  const int64_t q_out = heads_ * head_dim_;
  x_ = x;
  const bool recomputed = qk_norm_.has_value();  // q, k are temporaries (Inputs)
  saved_ = project(store, arena, x, s, /*heads_now=*/!recomputed);
  out_ = arena.alloc(static_cast<size_t>(n * q_out));
  lse_ = arena.alloc(static_cast<size_t>(s.batch * heads_ * s.seq));
  {
    ArenaTemporaries temporaries(arena);
    Inputs in = saved_;
    if (recomputed) {
      in.q = temporaries.alloc(n * q_out);
      in.k = temporaries.alloc(n * kv_heads_ * head_dim_);
      normed_heads(store, in, s);
    }
    // bf16: q, k, v are the attention's matmul inputs (QKᵀ and PV), stored rounded as a bf16
    // attention kernel would read them; scores, softmax and their sums stay fp32 inside the kernel.
    round_inputs(in, n);
    kernels::attention_forward(in.q, in.k, in.v, out_, lse_, max_logit, dims(s));
  }
  o_input_ = finish(store, arena, saved_, out_, lse_, dims(s));
  return output(store, arena, o_input_, n);
}

bool Attention::splits_by_kv_head() const {
  return layout_ != arch::ProjectionLayout::Gpt2Conv1D && rope_ != nullptr && !output_gate_ && !sinks_.valid() &&
         (!qk_norm_ || qk_norm_->per_head());
}

kernels::AttentionDims Attention::kv_head_dims(const StepShape& s) const {
  kernels::AttentionDims d{s.batch, s.seq, heads_ / kv_heads_, 1, head_dim_, head_dim_, scale_, softcap_};
  d.window = window_;
  return d;
}

Attention::Inputs Attention::project_kv_head(const ParameterStore& store, Arena& arena, const float* xn,
                                             const StepShape& s, int64_t g, const std::optional<QkNorm>& qk_norm) const {
  // Query head h reads kv head h / group: kv head g's queries are the group heads from g·group
  // on, rows [g·group·head_dim, ...) of q_proj (nn.Linear's (out, in) layout), one slice of
  // contiguous rows, as k_proj's and v_proj's rows for head g are.
  const int64_t n = s.tokens(), group = heads_ / kv_heads_, q_width = group * head_dim_;
  const int64_t q_row = g * q_width, kv_row = g * head_dim_;
  auto rows = [&](ParamRef w, int64_t row) { return store.data(w) + row * hidden_; };
  auto bias = [&](ParamRef b, int64_t row) { return b.valid() ? store.data(b) + row : nullptr; };
  Inputs in;
  float* q_dst = arena.alloc(static_cast<size_t>(n * q_width));
  float* k_dst = arena.alloc(static_cast<size_t>(n * head_dim_));
  in.v = arena.alloc(static_cast<size_t>(n * head_dim_));
  kernels::linear_forward(xn, rows(wq_, q_row), bias(bq_, q_row), q_dst, n, hidden_, q_width);
  kernels::linear_forward(xn, rows(wk_, kv_row), bias(bk_, kv_row), k_dst, n, hidden_, head_dim_);
  kernels::linear_forward(xn, rows(wv_, kv_row), bias(bv_, kv_row), in.v, n, hidden_, head_dim_);
  if (qk_norm) {
    in.q_raw = q_dst;
    in.k_raw = k_dst;
    const QkNorm::Saved stats = qk_norm->stats(arena, q_dst, k_dst, n);
    in.q_rstd = stats.q_rstd;
    in.k_rstd = stats.k_rstd;
    in.q = arena.alloc(static_cast<size_t>(n * q_width));
    in.k = arena.alloc(static_cast<size_t>(n * head_dim_));
    qk_norm->normalize(store, stats, in.q, in.k, n);
  } else {
    in.q = q_dst;
    in.k = k_dst;
  }
  // As normed_heads and round_inputs leave them: rotated, then rounded under bf16.
  rope_at(in.q, *rope_, s, group, head_dim_);
  rope_at(in.k, *rope_, s, 1, head_dim_);
  kernels::round_activation(in.q, n * q_width);
  kernels::round_activation(in.k, n * head_dim_);
  return in;
}

void Attention::forward_by_kv_head(const ParameterStore& store, Arena& arena, const float* xn, const StepShape& s,
                                   float* max_logit, float* y) const {
  KEEL_CHECK(splits_by_kv_head());
  const int64_t n = s.tokens(), group = heads_ / kv_heads_, q_width = group * head_dim_;
  const std::optional<QkNorm> qk_norm = qk_norm_ ? std::optional<QkNorm>(qk_norm_->for_heads(group, 1)) : std::nullopt;
  const kernels::AttentionDims d = kv_head_dims(s);
  const kernels::SharedBf16Operand shared_x(xn, n, hidden_);  // read by every group's projections
  for (int64_t g = 0; g < kv_heads_; ++g) {
    const Arena::Mark mark = arena.mark();
    const Inputs in = project_kv_head(store, arena, xn, s, g, qk_norm);
    float* out = arena.alloc(static_cast<size_t>(n * q_width));
    float* lse = arena.alloc(static_cast<size_t>(s.batch * group * s.seq));
    kernels::attention_forward(in.q, in.k, in.v, out, lse, max_logit + g * group, d);
    kernels::round_activation(out, n * q_width);
    // o_proj over the group's columns of its weight, summed in fp32 over the groups and rounded
    // once at the end, as the one product of forward rounds its output.
    kernels::gemm_mixed(false, true, n, hidden_, q_width, 1.f, out, q_width, store.data(wo_) + g * q_width,
                        heads_ * head_dim_, g == 0 ? 0.f : 1.f, y, hidden_, g == 0 ? opt(store, bo_) : nullptr);
    arena.release(mark);
  }
  kernels::round_activation(y, n * hidden_);
}

void Attention::backward_by_kv_head(ParameterStore& store, Arena& arena, const float* xn, const float* dy, float* dxn,
                                    const StepShape& s) const {
  KEEL_CHECK(splits_by_kv_head());
  const int64_t n = s.tokens(), group = heads_ / kv_heads_, q_width = group * head_dim_, q_out = heads_ * head_dim_;
  const std::optional<QkNorm> qk_norm = qk_norm_ ? std::optional<QkNorm>(qk_norm_->for_heads(group, 1)) : std::nullopt;
  const kernels::AttentionDims d = kv_head_dims(s);
  // xn is read by every group's weight gradients: its bf16 words once. dy is not shared so: each
  // group's o_proj backward makes its own (linear_backward), only as long as that call.
  const kernels::SharedBf16Operand shared_x(xn, n, hidden_);
  std::vector<float> recomputed_max(static_cast<size_t>(group));  // the forward recorded the maxima
  auto grad_rows = [&](ParamRef w, int64_t row) { return store.grad(w) + row * hidden_; };
  auto bias_grad = [&](ParamRef b, int64_t row) { return b.valid() ? store.grad(b) + row : nullptr; };
  for (int64_t g = 0; g < kv_heads_; ++g) {
    const Arena::Mark mark = arena.mark();
    const int64_t q_row = g * q_width, kv_row = g * head_dim_;
    const Inputs in = project_kv_head(store, arena, xn, s, g, qk_norm);
    float* out = arena.alloc(static_cast<size_t>(n * q_width));
    float* lse = arena.alloc(static_cast<size_t>(s.batch * group * s.seq));
    kernels::attention_forward(in.q, in.k, in.v, out, lse, recomputed_max.data(), d);
    kernels::round_activation(out, n * q_width);
    // o_proj's columns of this group: their weight gradient, and ∂L/∂out; its bias once.
    float* d_out = arena.alloc(static_cast<size_t>(n * q_width));
    kernels::linear_backward(out, store.data(wo_) + q_row, dy, d_out, store.grad(wo_) + q_row,
                             g == 0 ? opt_grad(store, bo_) : nullptr, n, q_width, hidden_, false, q_out,
                             kernels::GradWrite::Overwrite);
    float* dq = out;  // read by the kernel's first pass only, then zeroed and written (attention.hpp)
    float* dk = arena.alloc_zeroed(static_cast<size_t>(n * head_dim_));
    float* dv = arena.alloc_zeroed(static_cast<size_t>(n * head_dim_));
    kernels::attention_backward(in.q, in.k, in.v, out, lse, d_out, dq, dk, dv, d);
    kernels::rope_backward(dq, *rope_, s.batch, s.seq, group, head_dim_);
    kernels::rope_backward(dk, *rope_, s.batch, s.seq, 1, head_dim_);
    float* dq_proj = dq;
    float* dk_proj = dk;
    if (qk_norm) {
      dq_proj = arena.alloc(static_cast<size_t>(n * q_width));
      dk_proj = arena.alloc(static_cast<size_t>(n * head_dim_));
      qk_norm->backward(store, {in.q_raw, in.k_raw, in.q_rstd, in.k_rstd}, dq, dk, dq_proj, dk_proj, n);
    }
    kernels::linear_backward_spent(xn, store.data(wq_) + q_row * hidden_, dq_proj, dxn, grad_rows(wq_, q_row),
                                   bias_grad(bq_, q_row), n, hidden_, q_width, false, 0,
                                   g == 0 ? kernels::GradWrite::Overwrite : kernels::GradWrite::Accumulate);
    kernels::linear_backward_spent(xn, store.data(wk_) + kv_row * hidden_, dk_proj, dxn, grad_rows(wk_, kv_row),
                                   bias_grad(bk_, kv_row), n, hidden_, head_dim_);
    kernels::linear_backward_spent(xn, store.data(wv_) + kv_row * hidden_, dv, dxn, grad_rows(wv_, kv_row),
                                   bias_grad(bv_, kv_row), n, hidden_, head_dim_);
    arena.release(mark);
  }
}

KvCache Attention::make_cache(int64_t max_rows) const {
  return KvCache(kv_heads_ * head_dim_, kv_heads_ * head_dim_, max_rows, window_);
}

float* Attention::forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n,
                                      KvCache& cache) const {
  // Positions are absolute (RoPE); rows are what the cache still holds (a sliding layer drops
  // rows that left its window), and the kernel's causal and window masks count in rows.
  const StepShape s{1, n, cache.positions()};
  const int64_t q_out = heads_ * head_dim_;
  Inputs in = project(store, arena, x, s);
  round_inputs(in, n);
  kernels::AttentionDims d = dims(s);
  cache.append(in.k, in.v, n, d.k_stride, d.v_stride);
  d.q_offset = cache.rows() - n;
  d.k_stride = d.v_stride = 0;  // the cache's rows are dense
  float* out = arena.alloc(static_cast<size_t>(n * q_out));
  float* lse = arena.alloc(static_cast<size_t>(heads_ * n));
  float* max_logit = arena.alloc(static_cast<size_t>(heads_));
  std::fill(max_logit, max_logit + heads_, 0.f);
  kernels::attention_forward(in.q, cache.keys(), cache.values(), out, lse, max_logit, d);
  return output(store, arena, finish(store, arena, in, out, lse, d), n);
}

void Attention::backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, const StepShape& s,
                         kernels::GradWrite dx_write) {
  const int64_t n = s.tokens();
  const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_;
  const bool conv1d = layout_ == arch::ProjectionLayout::Gpt2Conv1D;
  float* d_out = arena.alloc(static_cast<size_t>(n * q_out));  // o_proj's product is its only writer
  kernels::linear_backward(o_input_, store.data(wo_), dy, d_out, store.grad(wo_), opt_grad(store, bo_), n, q_out,
                           hidden_, conv1d, 0, kernels::GradWrite::Overwrite);
  float* d_gate = nullptr;
  if (output_gate_) {  // d_out holds ∂L/∂(out·σ(gate)) so far
    float* d_attn = arena.alloc(static_cast<size_t>(n * q_out));
    d_gate = arena.alloc(static_cast<size_t>(n * q_out));
    output_gate_backward(out_, saved_.gate, d_out, d_attn, d_gate, n * q_out);
    d_out = d_attn;
  }
  if (sinks_.valid()) {
    kernels::attention_sink_backward(out_, lse_, store.data(sinks_), d_out, store.grad(sinks_), dims(s));
  }
  if (layout_ == arch::ProjectionLayout::Gpt2Conv1D) {
    // dq, dk, dv land in rows of [dq | dk | dv], as q, k, v were read: c_attn's gradients are one
    // product each.
    float* dqkv = arena.alloc_zeroed(static_cast<size_t>(n * 3 * hidden_));
    kernels::attention_backward(saved_.q, saved_.k, saved_.v, out_, lse_, d_out, dqkv, dqkv + hidden_,
                                dqkv + 2 * hidden_, dims(s));
    kernels::linear_backward_spent(x_, store.data(w_qkv_), dqkv, dx, store.grad(w_qkv_), store.grad(b_qkv_), n, hidden_,
                             3 * hidden_, true, 0, dx_write);
    return;
  }
  // The attention output is read last by the kernel's first pass (the sinks' and the output
  // gate's backwards, and o_proj's weight gradient, come before): dq takes its place, and the
  // kernel zeroes it then.
  float* dq = out_;
  float* dk = arena.alloc_zeroed(static_cast<size_t>(n * kv_out));
  float* dv = arena.alloc_zeroed(static_cast<size_t>(n * kv_out));
  Inputs in = saved_;
  const Arena::Mark before_heads = arena.mark();
  if (qk_norm_) {  // q and k again, as the forward made and rounded them: the same bits
    in.q = arena.alloc(static_cast<size_t>(n * q_out));
    in.k = arena.alloc(static_cast<size_t>(n * kv_out));
    normed_heads(store, in, s);
  }
  kernels::attention_backward(in.q, in.k, in.v, out_, lse_, d_out, dq, dk, dv, dims(s));
  // The recomputed q and k sit above dq, dk and dv, so QK-Norm's dq_raw and dk_raw take their
  // place rather than going on top of them.
  arena.release(before_heads);
  kernels::rope_backward(dq, *rope_, s.batch, s.seq, heads_, head_dim_);
  kernels::rope_backward(dk, *rope_, s.batch, s.seq, kv_heads_, head_dim_);
  float* dq_proj = dq;
  float* dk_proj = dk;
  if (qk_norm_) {
    float* dq_raw = arena.alloc(static_cast<size_t>(n * q_out));  // overwritten by the norm's backward
    float* dk_raw = arena.alloc(static_cast<size_t>(n * kv_out));
    qk_norm_->backward(store, {saved_.q_raw, saved_.k_raw, saved_.q_rstd, saved_.k_rstd}, dq, dk, dq_raw, dk_raw, n);
    dq_proj = dq_raw;
    dk_proj = dk_raw;
  }
  const kernels::SharedBf16Operand shared_x(x_, n, hidden_);  // read by q's, k's and v's weight gradients
  if (output_gate_) {
    float* dqg = arena.alloc(static_cast<size_t>(n * 2 * q_out));
    merge_query_gate(dq_proj, d_gate, dqg, n, heads_, head_dim_);
    kernels::linear_backward_spent(x_, store.data(wq_), dqg, dx, store.grad(wq_), opt_grad(store, bq_), n, hidden_,
                             2 * q_out, false, 0, dx_write);
  } else {
    kernels::linear_backward_spent(x_, store.data(wq_), dq_proj, dx, store.grad(wq_), opt_grad(store, bq_), n, hidden_,
                             q_out, false, 0, dx_write);
  }  // q's product is dx's first writer; k's and v's add to it
  kernels::linear_backward_spent(x_, store.data(wk_), dk_proj, dx, store.grad(wk_), opt_grad(store, bk_), n, hidden_,
                                 kv_out);
  kernels::linear_backward_spent(x_, store.data(wv_), dv, dx, store.grad(wv_), opt_grad(store, bv_), n, hidden_, kv_out);
}

// ---------------------------------------------------------------------------------------------
// Mlp

Mlp::Mlp(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer, bool shared, int64_t width)
    : conv1d_(arch::family_row(spec).projections == arch::ProjectionLayout::Gpt2Conv1D),
      gated_(shared || spec.mlp.kind == arch::FfnKind::Gated),
      bias_(shared ? false : spec.mlp.bias),
      hidden_(spec.hidden_size),
      width_(shared ? width : spec.mlp.intermediate_size),
      act_(to_kernel_activation(spec.mlp.activation)) {
  const arch::TensorNameTable& names = *arch::family_row(spec).names;
  const TensorKind gate = shared ? TensorKind::SharedGate : TensorKind::MlpGate;
  const TensorKind up = shared ? TensorKind::SharedUp : TensorKind::MlpUp;
  const TensorKind down = shared ? TensorKind::SharedDown : TensorKind::MlpDown;
  auto add = [&](TensorKind kind, TensorPart part, std::vector<int64_t> shape) {
    return store.add(names, {kind, part, layer}, std::move(shape));
  };
  // GPT-2's Conv1D stores [in, out]; nn.Linear [out, in].
  auto matrix = [&](int64_t out, int64_t in) { return conv1d_ ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in}; };
  if (gated_) {
    w_gate_ = add(gate, TensorPart::Weight, matrix(width_, hidden_));
    if (bias_) b_gate_ = add(gate, TensorPart::Bias, {width_});
  }
  w_up_ = add(up, TensorPart::Weight, matrix(width_, hidden_));
  if (bias_) b_up_ = add(up, TensorPart::Bias, {width_});
  w_down_ = add(down, TensorPart::Weight, matrix(hidden_, width_));
  if (bias_) b_down_ = add(down, TensorPart::Bias, {hidden_});
}

// h = act(gate)·up (gated) or act(up), rounded under bf16 as the down projection would read it.
void Mlp::activate(const float* gate, const float* up, float* h, int64_t n) const {
  if (gated_) {
    kernels::gated_forward(gate, up, h, n * width_, act_);
  } else {
    kernels::activation_forward(up, h, n * width_, act_);
  }
  kernels::round_activation(h, n * width_);
}

float* Mlp::compute(const ParameterStore& store, Arena& arena, const float* x, int64_t n, float*& gate,
                    float*& up) const {
  const size_t wide = static_cast<size_t>(n * width_);
  up = arena.alloc(wide);
  if (gated_) gate = arena.alloc(wide);
  float* y = arena.alloc(static_cast<size_t>(n * hidden_));
  // The hidden activation is not kept: the backward recomputes it from gate and up, one
  // elementwise pass, instead of holding n × width floats per layer until then (a seventh to a
  // quarter of a dense block's activations; Korthikanti et al. 2022 recompute such cheap parts
  // selectively).
  ArenaTemporaries temporaries(arena);
  float* h = temporaries.alloc(n * width_);
  {
    const kernels::SharedBf16Operand shared_x(gated_ ? x : nullptr, n, hidden_);  // read by up and gate
    kernels::linear_forward(x, store.data(w_up_), opt(store, b_up_), up, n, hidden_, width_, conv1d_);
    if (gated_) kernels::linear_forward(x, store.data(w_gate_), opt(store, b_gate_), gate, n, hidden_, width_);
  }
  activate(gate, up, h, n);
  kernels::linear_forward(h, store.data(w_down_), opt(store, b_down_), y, n, width_, hidden_, conv1d_);
  return y;
}

float* Mlp::forward(ParameterStore& store, Arena& arena, const float* x, int64_t n) {
  x_ = x;
  return compute(store, arena, x, n, gate_, up_);
}

void Mlp::forward_for_backward(const ParameterStore& store, Arena& arena, const float* x, int64_t n) {
  // compute's products, with compute's arguments: the same bits of gate and up.
  const size_t wide = static_cast<size_t>(n * width_);
  x_ = x;
  up_ = arena.alloc(wide);
  gate_ = gated_ ? arena.alloc(wide) : nullptr;
  const kernels::SharedBf16Operand shared_x(gated_ ? x : nullptr, n, hidden_);
  kernels::linear_forward(x, store.data(w_up_), opt(store, b_up_), up_, n, hidden_, width_, conv1d_);
  if (gated_) kernels::linear_forward(x, store.data(w_gate_), opt(store, b_gate_), gate_, n, hidden_, width_);
}

float* Mlp::forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n) const {
  float *gate = nullptr, *up = nullptr;
  return compute(store, arena, x, n, gate, up);
}

void Mlp::backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, int64_t n,
                   kernels::GradWrite dx_write) {
  const size_t wide = static_cast<size_t>(n * width_);
  // dh, dgate and dup each have one writer, which overwrites them: no zeroing pass.
  constexpr kernels::GradWrite kOnly = kernels::GradWrite::Overwrite;
  float* dh = arena.alloc(wide);
  // dy is read by the down projection's two products, x_ by gate's and up's weight gradients.
  const kernels::SharedBf16Operand shared_dy(dy, n, hidden_);
  const kernels::SharedBf16Operand shared_x(gated_ ? x_ : nullptr, n, hidden_);
  // dh first: the down projection's input gradient does not read h. Then h again from the stored
  // gate and up, in the same pass as the activation's backward (one evaluation of the activation
  // per element, not two; the forward's bits, rounded under bf16 as activate rounds them); then
  // the weight gradient that reads h. h takes the stored up's place, dup dh's and dgate the
  // stored gate's, each element read before it is written: the backward's only n × width
  // temporary is dh (a second one would be the bf16 step's peak at Qwen3-0.6B's shape).
  kernels::linear_backward(nullptr, store.data(w_down_), dy, dh, nullptr, opt_grad(store, b_down_), n, width_, hidden_,
                           conv1d_, 0, kOnly);
  float* h = up_;
  float* dup = dh;
  float* dgate = gate_;
  if (gated_) kernels::gated_backward_and_output(gate_, up_, dh, h, dgate, dup, n * width_, act_);
  else kernels::activation_backward_and_output(up_, dh, h, dup, n * width_, act_);
  kernels::round_activation(h, n * width_);
  kernels::linear_backward(h, store.data(w_down_), dy, nullptr, store.grad(w_down_), nullptr, n, width_, hidden_,
                           conv1d_);
  // dx's first writer takes dx_write; the second adds to it.
  if (gated_)
    kernels::linear_backward_spent(x_, store.data(w_gate_), dgate, dx, store.grad(w_gate_), opt_grad(store, b_gate_), n,
                             hidden_, width_, false, 0, dx_write);
  kernels::linear_backward_spent(x_, store.data(w_up_), dup, dx, store.grad(w_up_), opt_grad(store, b_up_), n, hidden_,
                           width_, conv1d_, 0, gated_ ? kernels::GradWrite::Accumulate : dx_write);
}

}  // namespace keel::nn
