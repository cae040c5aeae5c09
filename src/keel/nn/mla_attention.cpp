// Multi-head Latent Attention: HF modeling_deepseek_v3.py DeepseekV3Attention (DeepSeek-V3
// arXiv:2412.19437 §2.1.1, eqs. 1-11), forward and a hand-written backward.
#include "keel/nn/mla_attention.hpp"

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"
#include "keel/kernels/attention.hpp"
#include "keel/kernels/linear.hpp"
#include "keel/kernels/norm.hpp"
#include "keel/kernels/precision.hpp"

namespace keel::nn {

namespace {
const float* opt(ParameterStore& s, ParamRef r) { return r.valid() ? s.data(r) : nullptr; }
float* opt_grad(ParameterStore& s, ParamRef r) { return r.valid() ? s.grad(r) : nullptr; }
}  // namespace

double mla_softmax_scale(const arch::ModelSpec& spec) {
  const auto& a = spec.attention;
  double scale = 1.0 / std::sqrt(static_cast<double>(a.qk_nope_head_dim + a.qk_rope_head_dim));
  // HF DeepseekV3Attention: scaling *= mscale² whenever rope_scaling sets mscale_all_dim (YaRN
  // context extension; DeepSeek-V3 §4.3, "sqrt(t) = 0.1 ln s + 1"). Absent or 0: no change, which
  // is the 4K pretraining setting.
  const auto& sc = a.rope.scaling;
  if (!sc.is_object() || !sc.contains("mscale_all_dim") || sc["mscale_all_dim"].is_null()) return scale;
  if (!sc["mscale_all_dim"].is_number()) throw Error(spec.source, "rope_scaling.mscale_all_dim", "must be a number");
  const double m = sc["mscale_all_dim"].get<double>();
  if (m == 0.0) return scale;
  if (!sc.contains("factor") || !sc["factor"].is_number())
    throw Error(spec.source, "rope_scaling.factor", "is required when mscale_all_dim is set");
  const double mscale = kernels::yarn_mscale(sc["factor"].get<double>(), m);
  return scale * mscale * mscale;
}

MlaAttention::MlaAttention(ParameterStore& store, const std::string& p, const arch::ModelSpec& spec,
                           const kernels::RopeTable* rope)
    : hidden_(spec.hidden_size),
      heads_(spec.attention.num_heads),
      q_rank_(spec.attention.q_lora_rank),
      kv_rank_(spec.attention.kv_lora_rank),
      nope_(spec.attention.qk_nope_head_dim),
      rope_dim_(spec.attention.qk_rope_head_dim),
      v_dim_(spec.attention.v_head_dim),
      norm_eps_(static_cast<float>(spec.norm_eps)),
      scale_(static_cast<float>(mla_softmax_scale(spec))),
      softcap_(static_cast<float>(spec.attention.softcap)),
      latent_norms_(spec.attention.mla_latent_norms),
      rope_(rope) {
  const auto& a = spec.attention;
  KEEL_CHECK(a.kind == arch::AttentionKind::Mla && rope != nullptr && rope->rotary_dim == rope_dim_);
  const int64_t qk = nope_ + rope_dim_;
  // Registration follows HF's module order (and hf_tensors.cpp): q path, kv path, o_proj. HF
  // builds q_a_proj and kv_a_proj_with_mqa with bias=attention_bias and the other three
  // projections of the q/kv paths without bias.
  if (q_rank_ > 0) {
    wq_a_ = store.add(p + ".q_a_proj.weight", {q_rank_, hidden_}, Init::Normal, true, true);
    if (a.qkv_bias) bq_a_ = store.add(p + ".q_a_proj.bias", {q_rank_}, Init::Zeros, false);
    if (latent_norms_) q_norm_ = store.add(p + ".q_a_layernorm.weight", {q_rank_}, Init::Ones, false);
    wq_b_ = store.add(p + ".q_b_proj.weight", {heads_ * qk, q_rank_}, Init::Normal, true, true);
  } else {
    wq_ = store.add(p + ".q_proj.weight", {heads_ * qk, hidden_}, Init::Normal, true, true);
  }
  wkv_a_ = store.add(p + ".kv_a_proj_with_mqa.weight", {kv_rank_ + rope_dim_, hidden_}, Init::Normal, true, true);
  if (a.qkv_bias) bkv_a_ = store.add(p + ".kv_a_proj_with_mqa.bias", {kv_rank_ + rope_dim_}, Init::Zeros, false);
  if (latent_norms_) kv_norm_ = store.add(p + ".kv_a_layernorm.weight", {kv_rank_}, Init::Ones, false);
  wkv_b_ = store.add(p + ".kv_b_proj.weight", {heads_ * (nope_ + v_dim_), kv_rank_}, Init::Normal, true, true);
  wo_ = store.add(p + ".o_proj.weight", {hidden_, heads_ * v_dim_}, Init::Normal, true, true);
  if (a.o_bias) bo_ = store.add(p + ".o_proj.bias", {hidden_}, Init::Zeros, false);
}

// x: (n, hidden) -> y: (n, hidden)
float* MlaAttention::forward(ParameterStore& store, Arena& arena, const float* x, const StepShape& s,
                             float* max_logit) {
  const int64_t n = s.tokens(), H = heads_, qk = nope_ + rope_dim_, kva_w = kv_rank_ + rope_dim_;
  const int64_t kvb_w = nope_ + v_dim_;
  x_ = x;
  auto alloc = [&](int64_t count) { return arena.alloc(static_cast<size_t>(count)); };

  // Queries: (n, H, qk), each head [q^C (nope) | q^R (rope)].
  q_ = alloc(n * H * qk);
  if (q_rank_ > 0) {
    q_a_ = alloc(n * q_rank_);
    kernels::linear_forward(x, store.data(wq_a_), opt(store, bq_a_), q_a_, n, hidden_, q_rank_);
    if (latent_norms_) {
      c_q_ = alloc(n * q_rank_);
      q_rstd_ = alloc(n);
      kernels::rmsnorm_forward(q_a_, store.data(q_norm_), c_q_, q_rstd_, n, q_rank_, norm_eps_);
    } else {
      c_q_ = q_a_;  // ablation: the latent goes straight into q_b_proj
    }
    kernels::linear_forward(c_q_, store.data(wq_b_), nullptr, q_, n, q_rank_, H * qk);
  } else {
    kernels::linear_forward(x, store.data(wq_), nullptr, q_, n, hidden_, H * qk);
  }
  // Viewing q_ + nope as heads of stride qk makes the kernel rotate exactly each head's q^R.
  kernels::rope_forward(q_ + nope_, *rope_, s.batch, s.seq, H, qk);

  // Keys and values: kv_a gives [c_pre (kv_rank) | k^R_pre (rope)] per token; only the latent is
  // normalized (kv_a_layernorm), k^R is rotated and shared by every head (MQA-style).
  float* kva = alloc(n * kva_w);
  kernels::linear_forward(x, store.data(wkv_a_), opt(store, bkv_a_), kva, n, hidden_, kva_w);
  c_pre_ = alloc(n * kv_rank_);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) std::memcpy(c_pre_ + t * kv_rank_, kva + t * kva_w, sizeof(float) * kv_rank_);
  if (latent_norms_) {
    c_kv_ = alloc(n * kv_rank_);
    kv_rstd_ = alloc(n);
    kernels::rmsnorm_forward(c_pre_, store.data(kv_norm_), c_kv_, kv_rstd_, n, kv_rank_, norm_eps_);
  } else {
    c_kv_ = c_pre_;
  }
  float* kvb = alloc(n * H * kvb_w);
  kernels::linear_forward(c_kv_, store.data(wkv_b_), nullptr, kvb, n, kv_rank_, H * kvb_w);
  kernels::rope_forward(kva + kv_rank_, *rope_, s.batch, s.seq, 1, kva_w);

  k_ = alloc(n * H * qk);
  v_ = alloc(n * H * v_dim_);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* k_rope = kva + t * kva_w + kv_rank_;
    for (int64_t h = 0; h < H; ++h) {
      const float* src = kvb + (t * H + h) * kvb_w;
      float* k = k_ + (t * H + h) * qk;
      std::memcpy(k, src, sizeof(float) * nope_);
      std::memcpy(k + nope_, k_rope, sizeof(float) * rope_dim_);
      std::memcpy(v_ + (t * H + h) * v_dim_, src + nope_, sizeof(float) * v_dim_);
    }
  }

  // bf16: the attention's matmul inputs stored rounded (as in Attention::forward).
  kernels::round_activation(q_, n * H * qk);
  kernels::round_activation(k_, n * H * qk);
  kernels::round_activation(v_, n * H * v_dim_);
  out_ = alloc(n * H * v_dim_);
  lse_ = alloc(s.batch * H * s.seq);
  const kernels::AttentionDims d{s.batch, s.seq, H, H, qk, v_dim_, scale_, softcap_};
  kernels::attention_forward(q_, k_, v_, out_, lse_, max_logit, d);
  kernels::round_activation(out_, n * H * v_dim_);
  float* y = alloc(n * hidden_);
  kernels::linear_forward(out_, store.data(wo_), opt(store, bo_), y, n, H * v_dim_, hidden_);
  return y;
}

// Accumulates dx (n, hidden) and every parameter gradient.
void MlaAttention::backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, const StepShape& s) {
  const int64_t n = s.tokens(), H = heads_, qk = nope_ + rope_dim_, kva_w = kv_rank_ + rope_dim_;
  const int64_t kvb_w = nope_ + v_dim_;
  auto zeroed = [&](int64_t count) { return arena.alloc_zeroed(static_cast<size_t>(count)); };

  float* d_out = zeroed(n * H * v_dim_);
  kernels::linear_backward(out_, store.data(wo_), dy, d_out, store.grad(wo_), opt_grad(store, bo_), n, H * v_dim_,
                           hidden_);
  float* dq = zeroed(n * H * qk);
  float* dk = zeroed(n * H * qk);
  float* dv = zeroed(n * H * v_dim_);
  const kernels::AttentionDims d{s.batch, s.seq, H, H, qk, v_dim_, scale_, softcap_};
  kernels::attention_backward(q_, k_, v_, out_, lse_, d_out, dq, dk, dv, d);
  kernels::rope_backward(dq + nope_, *rope_, s.batch, s.seq, H, qk);

  // Back through the head split: kv_b_proj's output gets [dk^C_h | dv_h]; the shared k^R sums
  // the gradient of every head.
  float* dkvb = arena.alloc(static_cast<size_t>(n * H * kvb_w));
  float* dkva = zeroed(n * kva_w);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    float* dk_rope = dkva + t * kva_w + kv_rank_;
    for (int64_t h = 0; h < H; ++h) {
      float* dst = dkvb + (t * H + h) * kvb_w;
      const float* dkh = dk + (t * H + h) * qk;
      std::memcpy(dst, dkh, sizeof(float) * nope_);
      std::memcpy(dst + nope_, dv + (t * H + h) * v_dim_, sizeof(float) * v_dim_);
      for (int64_t c = 0; c < rope_dim_; ++c) dk_rope[c] += dkh[nope_ + c];
    }
  }
  kernels::rope_backward(dkva + kv_rank_, *rope_, s.batch, s.seq, 1, kva_w);
  float* dc_kv = zeroed(n * kv_rank_);
  kernels::linear_backward(c_kv_, store.data(wkv_b_), dkvb, dc_kv, store.grad(wkv_b_), nullptr, n, kv_rank_,
                           H * kvb_w);
  float* dc_pre = dc_kv;
  if (latent_norms_) {
    dc_pre = zeroed(n * kv_rank_);
    kernels::rmsnorm_backward(c_pre_, store.data(kv_norm_), kv_rstd_, dc_kv, dc_pre, store.grad(kv_norm_), n, kv_rank_);
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) std::memcpy(dkva + t * kva_w, dc_pre + t * kv_rank_, sizeof(float) * kv_rank_);
  kernels::linear_backward(x_, store.data(wkv_a_), dkva, dx, store.grad(wkv_a_), opt_grad(store, bkv_a_), n, hidden_,
                           kva_w);

  if (q_rank_ > 0) {
    float* dc_q = zeroed(n * q_rank_);
    kernels::linear_backward(c_q_, store.data(wq_b_), dq, dc_q, store.grad(wq_b_), nullptr, n, q_rank_, H * qk);
    float* dq_a = dc_q;
    if (latent_norms_) {
      dq_a = zeroed(n * q_rank_);
      kernels::rmsnorm_backward(q_a_, store.data(q_norm_), q_rstd_, dc_q, dq_a, store.grad(q_norm_), n, q_rank_);
    }
    kernels::linear_backward(x_, store.data(wq_a_), dq_a, dx, store.grad(wq_a_), opt_grad(store, bq_a_), n, hidden_,
                             q_rank_);
  } else {
    kernels::linear_backward(x_, store.data(wq_), dq, dx, store.grad(wq_), nullptr, n, hidden_, H * qk);
  }
}

}  // namespace keel::nn
