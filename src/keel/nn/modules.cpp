#include "keel/nn/modules.hpp"

#include <cmath>
#include <cstring>

#include "keel/core/error.hpp"
#include "keel/kernels/attention.hpp"
#include "keel/kernels/linear.hpp"
#include "keel/kernels/norm.hpp"
#include "keel/kernels/precision.hpp"

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

// ---------------------------------------------------------------------------------------------
// Norm

Norm::Norm(ParameterStore& store, const std::string& prefix, int64_t dim, arch::NormKind kind, float eps)
    : kind_(kind), dim_(dim), eps_(eps) {
  weight_ = store.add(prefix + ".weight", {dim}, Init::Ones, /*weight_decay=*/false);
  if (kind == arch::NormKind::LayerNorm) bias_ = store.add(prefix + ".bias", {dim}, Init::Zeros, false);
}

float* Norm::forward(ParameterStore& store, Arena& arena, const float* x, int64_t n) {
  x_ = x;
  float* y = arena.alloc(static_cast<size_t>(n * dim_));
  rstd_ = arena.alloc(static_cast<size_t>(n));
  switch (kind_) {
    case arch::NormKind::RmsNorm:
      kernels::rmsnorm_forward(x, store.data(weight_), y, rstd_, n, dim_, eps_);
      break;
    case arch::NormKind::LayerNorm:
      mean_ = arena.alloc(static_cast<size_t>(n));
      kernels::layernorm_forward(x, store.data(weight_), store.data(bias_), y, mean_, rstd_, n, dim_, eps_);
      break;
  }
  return y;
}

void Norm::backward(ParameterStore& store, const float* dy, float* dx, int64_t n) {
  switch (kind_) {
    case arch::NormKind::RmsNorm:
      kernels::rmsnorm_backward(x_, store.data(weight_), rstd_, dy, dx, store.grad(weight_), n, dim_);
      break;
    case arch::NormKind::LayerNorm:
      kernels::layernorm_backward(x_, store.data(weight_), mean_, rstd_, dy, dx, store.grad(weight_),
                                  store.grad(bias_), n, dim_);
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Attention

Attention::Attention(ParameterStore& store, const std::string& p, const arch::ModelSpec& spec,
                     const kernels::RopeTable* rope)
    : gpt2_(spec.family == arch::Family::Gpt2),
      hidden_(spec.hidden_size),
      heads_(spec.attention.num_heads),
      kv_heads_(spec.attention.num_kv_heads),
      head_dim_(spec.attention.head_dim),
      qk_norm_(spec.attention.qk_norm),
      norm_eps_(static_cast<float>(spec.norm_eps)),
      softcap_(static_cast<float>(spec.attention.softcap)),
      rope_(rope) {
  const auto& a = spec.attention;
  if (gpt2_) {
    w_qkv_ = store.add(p + ".c_attn.weight", {hidden_, 3 * hidden_}, Init::Normal, true, true);
    b_qkv_ = store.add(p + ".c_attn.bias", {3 * hidden_}, Init::Zeros, false);
    wo_ = store.add(p + ".c_proj.weight", {hidden_, hidden_}, Init::Normal, true, true);
    bo_ = store.add(p + ".c_proj.bias", {hidden_}, Init::Zeros, false);
    return;
  }
  const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_;
  wq_ = store.add(p + ".q_proj.weight", {q_out, hidden_}, Init::Normal, true, true);
  if (a.qkv_bias) bq_ = store.add(p + ".q_proj.bias", {q_out}, Init::Zeros, false);
  wk_ = store.add(p + ".k_proj.weight", {kv_out, hidden_}, Init::Normal, true, true);
  if (a.qkv_bias) bk_ = store.add(p + ".k_proj.bias", {kv_out}, Init::Zeros, false);
  wv_ = store.add(p + ".v_proj.weight", {kv_out, hidden_}, Init::Normal, true, true);
  if (a.qkv_bias) bv_ = store.add(p + ".v_proj.bias", {kv_out}, Init::Zeros, false);
  wo_ = store.add(p + ".o_proj.weight", {hidden_, q_out}, Init::Normal, true, true);
  if (a.o_bias) bo_ = store.add(p + ".o_proj.bias", {hidden_}, Init::Zeros, false);
  if (qk_norm_) {
    q_norm_ = store.add(p + ".q_norm.weight", {head_dim_}, Init::Ones, false);
    k_norm_ = store.add(p + ".k_norm.weight", {head_dim_}, Init::Ones, false);
  }
}

namespace {
const float* opt(ParameterStore& s, ParamRef r) { return r.valid() ? s.data(r) : nullptr; }
float* opt_grad(ParameterStore& s, ParamRef r) { return r.valid() ? s.grad(r) : nullptr; }
}  // namespace

float* Attention::forward(ParameterStore& store, Arena& arena, const float* x, const StepShape& s, float* max_logit) {
  const int64_t n = s.tokens();
  const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_;
  x_ = x;
  q_ = arena.alloc(static_cast<size_t>(n * q_out));
  k_ = arena.alloc(static_cast<size_t>(n * kv_out));
  v_ = arena.alloc(static_cast<size_t>(n * kv_out));
  if (gpt2_) {
    // c_attn gives [q | k | v] per token; split into the contiguous layout attention reads.
    float* qkv = arena.alloc(static_cast<size_t>(n * 3 * hidden_));
    kernels::linear_forward(x, store.data(w_qkv_), store.data(b_qkv_), qkv, n, hidden_, 3 * hidden_, true);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* row = qkv + t * 3 * hidden_;
      std::memcpy(q_ + t * hidden_, row, sizeof(float) * hidden_);
      std::memcpy(k_ + t * hidden_, row + hidden_, sizeof(float) * hidden_);
      std::memcpy(v_ + t * hidden_, row + 2 * hidden_, sizeof(float) * hidden_);
    }
  } else {
    float* q_dst = q_;
    float* k_dst = k_;
    if (qk_norm_) {
      q_raw_ = arena.alloc(static_cast<size_t>(n * q_out));
      k_raw_ = arena.alloc(static_cast<size_t>(n * kv_out));
      q_dst = q_raw_;
      k_dst = k_raw_;
    }
    kernels::linear_forward(x, store.data(wq_), opt(store, bq_), q_dst, n, hidden_, q_out);
    kernels::linear_forward(x, store.data(wk_), opt(store, bk_), k_dst, n, hidden_, kv_out);
    kernels::linear_forward(x, store.data(wv_), opt(store, bv_), v_, n, hidden_, kv_out);
    if (qk_norm_) {
      // QK-Norm (Qwen3): RMSNorm over each head's head_dim vector, before RoPE.
      q_rstd_ = arena.alloc(static_cast<size_t>(n * heads_));
      k_rstd_ = arena.alloc(static_cast<size_t>(n * kv_heads_));
      kernels::rmsnorm_forward(q_raw_, store.data(q_norm_), q_, q_rstd_, n * heads_, head_dim_, norm_eps_);
      kernels::rmsnorm_forward(k_raw_, store.data(k_norm_), k_, k_rstd_, n * kv_heads_, head_dim_, norm_eps_);
    }
    kernels::rope_forward(q_, *rope_, s.batch, s.seq, heads_, head_dim_);
    kernels::rope_forward(k_, *rope_, s.batch, s.seq, kv_heads_, head_dim_);
  }
  // bf16: q, k, v are the attention's matmul inputs (QKᵀ and PV), stored rounded as a bf16
  // attention kernel would read them; scores, softmax and their sums stay fp32 inside the kernel.
  kernels::round_activation(q_, n * q_out);
  kernels::round_activation(k_, n * kv_out);
  kernels::round_activation(v_, n * kv_out);
  out_ = arena.alloc(static_cast<size_t>(n * q_out));
  lse_ = arena.alloc(static_cast<size_t>(s.batch * heads_ * s.seq));
  kernels::AttentionDims d{s.batch, s.seq, heads_, kv_heads_, head_dim_, head_dim_,
                           static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim_))), softcap_};
  kernels::attention_forward(q_, k_, v_, out_, lse_, max_logit, d);
  kernels::round_activation(out_, n * q_out);
  float* y = arena.alloc(static_cast<size_t>(n * hidden_));
  kernels::linear_forward(out_, store.data(wo_), opt(store, bo_), y, n, q_out, hidden_, gpt2_);
  return y;
}

void Attention::backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, const StepShape& s) {
  const int64_t n = s.tokens();
  const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_;
  float* d_out = arena.alloc_zeroed(static_cast<size_t>(n * q_out));
  kernels::linear_backward(out_, store.data(wo_), dy, d_out, store.grad(wo_), opt_grad(store, bo_), n, q_out, hidden_,
                           gpt2_);
  float* dq = arena.alloc_zeroed(static_cast<size_t>(n * q_out));
  float* dk = arena.alloc_zeroed(static_cast<size_t>(n * kv_out));
  float* dv = arena.alloc_zeroed(static_cast<size_t>(n * kv_out));
  kernels::AttentionDims d{s.batch, s.seq, heads_, kv_heads_, head_dim_, head_dim_,
                           static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim_))), softcap_};
  kernels::attention_backward(q_, k_, v_, out_, lse_, d_out, dq, dk, dv, d);
  if (gpt2_) {
    float* dqkv = arena.alloc(static_cast<size_t>(n * 3 * hidden_));
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      float* row = dqkv + t * 3 * hidden_;
      std::memcpy(row, dq + t * hidden_, sizeof(float) * hidden_);
      std::memcpy(row + hidden_, dk + t * hidden_, sizeof(float) * hidden_);
      std::memcpy(row + 2 * hidden_, dv + t * hidden_, sizeof(float) * hidden_);
    }
    kernels::linear_backward(x_, store.data(w_qkv_), dqkv, dx, store.grad(w_qkv_), store.grad(b_qkv_), n, hidden_,
                             3 * hidden_, true);
    return;
  }
  kernels::rope_backward(dq, *rope_, s.batch, s.seq, heads_, head_dim_);
  kernels::rope_backward(dk, *rope_, s.batch, s.seq, kv_heads_, head_dim_);
  const float* dq_proj = dq;
  const float* dk_proj = dk;
  if (qk_norm_) {
    float* dq_raw = arena.alloc_zeroed(static_cast<size_t>(n * q_out));
    float* dk_raw = arena.alloc_zeroed(static_cast<size_t>(n * kv_out));
    kernels::rmsnorm_backward(q_raw_, store.data(q_norm_), q_rstd_, dq, dq_raw, store.grad(q_norm_), n * heads_, head_dim_);
    kernels::rmsnorm_backward(k_raw_, store.data(k_norm_), k_rstd_, dk, dk_raw, store.grad(k_norm_), n * kv_heads_,
                              head_dim_);
    dq_proj = dq_raw;
    dk_proj = dk_raw;
  }
  kernels::linear_backward(x_, store.data(wq_), dq_proj, dx, store.grad(wq_), opt_grad(store, bq_), n, hidden_, q_out);
  kernels::linear_backward(x_, store.data(wk_), dk_proj, dx, store.grad(wk_), opt_grad(store, bk_), n, hidden_, kv_out);
  kernels::linear_backward(x_, store.data(wv_), dv, dx, store.grad(wv_), opt_grad(store, bv_), n, hidden_, kv_out);
}

// ---------------------------------------------------------------------------------------------
// Mlp

Mlp::Mlp(ParameterStore& store, const std::string& p, const arch::ModelSpec& spec, int64_t width)
    : gpt2_(spec.family == arch::Family::Gpt2),
      gated_(spec.mlp.kind == arch::FfnKind::Gated),
      bias_(width > 0 ? false : spec.mlp.bias),
      hidden_(spec.hidden_size),
      width_(width > 0 ? width : spec.mlp.intermediate_size),
      act_(to_kernel_activation(spec.mlp.activation)) {
  if (gpt2_) {
    w_up_ = store.add(p + ".c_fc.weight", {hidden_, width_}, Init::Normal, true, true);
    b_up_ = store.add(p + ".c_fc.bias", {width_}, Init::Zeros, false);
    w_down_ = store.add(p + ".c_proj.weight", {width_, hidden_}, Init::Normal, true, true);
    b_down_ = store.add(p + ".c_proj.bias", {hidden_}, Init::Zeros, false);
    return;
  }
  if (gated_) {
    w_gate_ = store.add(p + ".gate_proj.weight", {width_, hidden_}, Init::Normal, true, true);
    if (bias_) b_gate_ = store.add(p + ".gate_proj.bias", {width_}, Init::Zeros, false);
  }
  w_up_ = store.add(p + ".up_proj.weight", {width_, hidden_}, Init::Normal, true, true);
  if (bias_) b_up_ = store.add(p + ".up_proj.bias", {width_}, Init::Zeros, false);
  w_down_ = store.add(p + ".down_proj.weight", {hidden_, width_}, Init::Normal, true, true);
  if (bias_) b_down_ = store.add(p + ".down_proj.bias", {hidden_}, Init::Zeros, false);
}

float* Mlp::forward(ParameterStore& store, Arena& arena, const float* x, int64_t n) {
  x_ = x;
  const size_t wide = static_cast<size_t>(n * width_);
  up_ = arena.alloc(wide);
  h_ = arena.alloc(wide);
  kernels::linear_forward(x, store.data(w_up_), opt(store, b_up_), up_, n, hidden_, width_, gpt2_);
  if (gated_) {
    gate_ = arena.alloc(wide);
    kernels::linear_forward(x, store.data(w_gate_), opt(store, b_gate_), gate_, n, hidden_, width_);
    kernels::gated_forward(gate_, up_, h_, n * width_, act_);
  } else {
    kernels::activation_forward(up_, h_, n * width_, act_);
  }
  float* y = arena.alloc(static_cast<size_t>(n * hidden_));
  kernels::linear_forward(h_, store.data(w_down_), opt(store, b_down_), y, n, width_, hidden_, gpt2_);
  return y;
}

void Mlp::backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, int64_t n) {
  const size_t wide = static_cast<size_t>(n * width_);
  float* dh = arena.alloc_zeroed(wide);
  kernels::linear_backward(h_, store.data(w_down_), dy, dh, store.grad(w_down_), opt_grad(store, b_down_), n, width_,
                           hidden_, gpt2_);
  float* dup = arena.alloc_zeroed(wide);
  if (gated_) {
    float* dgate = arena.alloc_zeroed(wide);
    kernels::gated_backward(gate_, up_, dh, dgate, dup, n * width_, act_);
    kernels::linear_backward(x_, store.data(w_gate_), dgate, dx, store.grad(w_gate_), opt_grad(store, b_gate_), n,
                             hidden_, width_);
  } else {
    kernels::activation_backward(up_, dh, dup, n * width_, act_);
  }
  kernels::linear_backward(x_, store.data(w_up_), dup, dx, store.grad(w_up_), opt_grad(store, b_up_), n, hidden_, width_,
                           gpt2_);
}

}  // namespace keel::nn
