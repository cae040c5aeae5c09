// Multi-head Latent Attention: HF modeling_deepseek_v3.py DeepseekV3Attention (DeepSeek-V3
// arXiv:2412.19437 §2.1.1, eqs. 1-11), forward and a hand-written backward.
#include "keel/nn/mla_attention.hpp"

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"
#include "keel/kernels/attention.hpp"
#include "keel/kernels/gemm.hpp"
#include "keel/kernels/linear.hpp"
#include "keel/kernels/norm.hpp"
#include "keel/kernels/precision.hpp"

namespace keel::nn {

namespace {
const float* opt(const ParameterStore& s, ParamRef r) { return r.valid() ? s.data(r) : nullptr; }
float* opt_grad(ParameterStore& s, ParamRef r) { return r.valid() ? s.grad(r) : nullptr; }
}  // namespace

MlaAttention::MlaAttention(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer,
                           const kernels::RopeTable* rope)
    : hidden_(spec.hidden_size),
      heads_(spec.attention.num_heads),
      q_rank_(spec.attention.q_lora_rank),
      kv_rank_(spec.attention.kv_lora_rank),
      nope_(spec.attention.qk_nope_head_dim),
      rope_dim_(spec.attention.qk_rope_head_dim),
      v_dim_(spec.attention.v_head_dim),
      scale_(static_cast<float>(arch::attention_softmax_scale(spec))),
      softcap_(static_cast<float>(spec.attention.softcap)),
      latent_norms_(spec.attention.mla_latent_norms),
      rope_(rope) {
  using arch::TensorKind;
  using arch::TensorPart;
  const auto& a = spec.attention;
  KEEL_CHECK(a.kind == arch::AttentionKind::Mla && rope != nullptr && rope->rotary_dim == rope_dim_);
  const arch::TensorNameTable& names = *arch::family_row(spec).names;
  auto add = [&](TensorKind kind, TensorPart part, std::vector<int64_t> shape) {
    return store.add(names, {kind, part, layer}, std::move(shape));
  };
  const int64_t qk = nope_ + rope_dim_;
  // Registration follows HF's module order (and hf_tensors.cpp): q path, kv path, o_proj. HF
  // builds q_a_proj and kv_a_proj_with_mqa with bias=attention_bias and the other three
  // projections of the q/kv paths without bias.
  if (q_rank_ > 0) {
    wq_a_ = add(TensorKind::QA, TensorPart::Weight, {q_rank_, hidden_});
    if (a.qkv_bias) bq_a_ = add(TensorKind::QA, TensorPart::Bias, {q_rank_});
    if (latent_norms_) q_norm_ = add(TensorKind::QANorm, TensorPart::Weight, {q_rank_});
    wq_b_ = add(TensorKind::QB, TensorPart::Weight, {heads_ * qk, q_rank_});
  } else {
    wq_ = add(TensorKind::Q, TensorPart::Weight, {heads_ * qk, hidden_});
  }
  wkv_a_ = add(TensorKind::KvA, TensorPart::Weight, {kv_rank_ + rope_dim_, hidden_});
  if (a.qkv_bias) bkv_a_ = add(TensorKind::KvA, TensorPart::Bias, {kv_rank_ + rope_dim_});
  if (latent_norms_) kv_norm_ = add(TensorKind::KvANorm, TensorPart::Weight, {kv_rank_});
  wkv_b_ = add(TensorKind::KvB, TensorPart::Weight, {heads_ * (nope_ + v_dim_), kv_rank_});
  wo_ = add(TensorKind::O, TensorPart::Weight, {hidden_, heads_ * v_dim_});
  if (a.o_bias) bo_ = add(TensorKind::O, TensorPart::Bias, {hidden_});
}

float* MlaAttention::project_q(const ParameterStore& store, Arena& arena, const float* x, const StepShape& s,
                               float*& q_a, float*& q_rstd, float*& c_q) const {
  const int64_t n = s.tokens(), H = heads_, qk = nope_ + rope_dim_;
  auto alloc = [&](int64_t count) { return arena.alloc(static_cast<size_t>(count)); };
  // Queries: (n, H, qk), each head [q^C (nope) | q^R (rope)].
  float* q = alloc(n * H * qk);
  if (q_rank_ > 0) {
    q_a = alloc(n * q_rank_);
    kernels::linear_forward(x, store.data(wq_a_), opt(store, bq_a_), q_a, n, hidden_, q_rank_);
    if (latent_norms_) {
      c_q = alloc(n * q_rank_);
      q_rstd = alloc(n);
      kernels::rmsnorm_forward(q_a, store.data(q_norm_), c_q, q_rstd, n, q_rank_, kLatentNormEps);
    } else {
      c_q = q_a;  // ablation: the latent goes straight into q_b_proj
    }
    kernels::linear_forward(c_q, store.data(wq_b_), nullptr, q, n, q_rank_, H * qk);
  } else {
    kernels::linear_forward(x, store.data(wq_), nullptr, q, n, hidden_, H * qk);
  }
  // Viewing q + nope as heads of stride qk makes the kernel rotate exactly each head's q^R.
  rope_at(q + nope_, *rope_, s, H, qk);
  return q;
}

float* MlaAttention::project_kv_a(const ParameterStore& store, Arena& arena, const float* x, const StepShape& s,
                                  float*& c_pre, float*& kv_rstd, float*& c_kv) const {
  const int64_t n = s.tokens(), kva_w = kv_rank_ + rope_dim_;
  // kv_a gives [c_pre (kv_rank) | k^R_pre (rope)] per token; only the latent is normalized
  // (kv_a_layernorm), k^R is rotated and shared by every head (MQA-style).
  float* kva = arena.alloc(static_cast<size_t>(n * kva_w));
  kernels::linear_forward(x, store.data(wkv_a_), opt(store, bkv_a_), kva, n, hidden_, kva_w);
  c_pre = arena.alloc(static_cast<size_t>(n * kv_rank_));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) std::memcpy(c_pre + t * kv_rank_, kva + t * kva_w, sizeof(float) * kv_rank_);
  if (latent_norms_) {
    c_kv = arena.alloc(static_cast<size_t>(n * kv_rank_));
    kv_rstd = arena.alloc(static_cast<size_t>(n));
    kernels::rmsnorm_forward(c_pre, store.data(kv_norm_), c_kv, kv_rstd, n, kv_rank_, kLatentNormEps);
  } else {
    c_kv = c_pre;
  }
  rope_at(kva + kv_rank_, *rope_, s, 1, kva_w);
  return kva;
}

// x: (n, hidden) -> y: (n, hidden)
float* MlaAttention::forward(ParameterStore& store, Arena& arena, const float* x, const StepShape& s,
                             float* max_logit) {
  const int64_t n = s.tokens(), H = heads_, qk = nope_ + rope_dim_, kva_w = kv_rank_ + rope_dim_;
  const int64_t kvb_w = nope_ + v_dim_;
  x_ = x;
  auto alloc = [&](int64_t count) { return arena.alloc(static_cast<size_t>(count)); };
  float* kva = nullptr;
  {
    const kernels::SharedBf16Operand shared_x(x, n, hidden_);  // read by the q and kv_a products
    q_ = project_q(store, arena, x, s, q_a_, q_rstd_, c_q_);
    kva = project_kv_a(store, arena, x, s, c_pre_, kv_rstd_, c_kv_);
  }
  float* kvb = alloc(n * H * kvb_w);
  kernels::linear_forward(c_kv_, store.data(wkv_b_), nullptr, kvb, n, kv_rank_, H * kvb_w);

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

KvCache MlaAttention::make_cache(int64_t max_rows) const { return KvCache(kv_rank_ + rope_dim_, 0, max_rows); }

float* MlaAttention::forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n,
                                         KvCache& cache) const {
  const StepShape s{1, n, cache.rows()};
  const int64_t H = heads_, qk = nope_ + rope_dim_, row = kv_rank_ + rope_dim_, kvb_w = nope_ + v_dim_;
  auto alloc = [&](int64_t count) { return arena.alloc(static_cast<size_t>(count)); };
  float *q_a = nullptr, *q_rstd = nullptr, *c_q = nullptr, *c_pre = nullptr, *kv_rstd = nullptr, *c_kv = nullptr;
  const float* q = project_q(store, arena, x, s, q_a, q_rstd, c_q);
  const float* kva = project_kv_a(store, arena, x, s, c_pre, kv_rstd, c_kv);
  // The cache rows [c_KV | k^R] of the new tokens.
  float* rows = alloc(n * row);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(rows + t * row, c_kv + t * kv_rank_, sizeof(float) * kv_rank_);
    std::memcpy(rows + t * row + kv_rank_, kva + t * row + kv_rank_, sizeof(float) * rope_dim_);
  }
  cache.append(rows, nullptr, n);

  // Absorbed queries (n, H, kv_rank + dr): [W^UK_hᵀ q^C_h | q^R_h].
  const float* wkv_b = store.data(wkv_b_);
  float* q_abs = alloc(n * H * row);
#pragma omp parallel for schedule(static) if (n * H > 1)
  for (int64_t task = 0; task < n * H; ++task) {
    const int64_t h = task % H;
    const float* qh = q + task * qk;
    float* dst = q_abs + task * row;
    std::fill(dst, dst + kv_rank_, 0.f);
    for (int64_t i = 0; i < nope_; ++i) {
      const float a = qh[i];
      const float* w = wkv_b + (h * kvb_w + i) * kv_rank_;  // row i of W^UK_h
#pragma omp simd
      for (int64_t r = 0; r < kv_rank_; ++r) dst[r] += a * w[r];
    }
    std::memcpy(dst + kv_rank_, qh + nope_, sizeof(float) * rope_dim_);
  }
  // MQA over the cache: one kv head whose keys are the whole rows and whose values are their
  // first kv_rank floats.
  kernels::AttentionDims d{1, n, H, 1, row, kv_rank_, scale_, softcap_};
  d.q_offset = s.first_position;
  d.k_stride = row;
  d.v_stride = row;
  float* mixed = alloc(n * H * kv_rank_);
  float* lse = alloc(H * n);
  float* max_logit = alloc(H);
  std::fill(max_logit, max_logit + H, 0.f);
  kernels::attention_forward(q_abs, cache.keys(), cache.keys(), mixed, lse, max_logit, d);
  // o_h = W^UV_h · mixed_h, W^UV_h the value rows of kv_b_proj for head h: (v_dim, kv_rank).
  float* out = alloc(n * H * v_dim_);
#pragma omp parallel for schedule(static) if (n * H > 1)
  for (int64_t task = 0; task < n * H; ++task) {
    const int64_t h = task % H;
    const float* m = mixed + task * kv_rank_;
    for (int64_t j = 0; j < v_dim_; ++j) {
      const float* w = wkv_b + (h * kvb_w + nope_ + j) * kv_rank_;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t r = 0; r < kv_rank_; ++r) acc += w[r] * m[r];
      out[task * v_dim_ + j] = acc;
    }
  }
  float* y = alloc(n * hidden_);
  kernels::linear_forward(out, store.data(wo_), opt(store, bo_), y, n, H * v_dim_, hidden_);
  return y;
}

// Accumulates every parameter gradient, and dx (n, hidden) as dx_write says: its first writer,
// kv_a_proj's product, overwrites it or adds to it.
void MlaAttention::backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, const StepShape& s,
                            kernels::GradWrite dx_write) {
  const int64_t n = s.tokens(), H = heads_, qk = nope_ + rope_dim_, kva_w = kv_rank_ + rope_dim_;
  const int64_t kvb_w = nope_ + v_dim_;
  auto zeroed = [&](int64_t count) { return arena.alloc_zeroed(static_cast<size_t>(count)); };
  auto uninitialized = [&](int64_t count) { return arena.alloc(static_cast<size_t>(count)); };
  // Buffers with one writer, which overwrites them: no zeroing pass.
  constexpr kernels::GradWrite kOnly = kernels::GradWrite::Overwrite;

  float* d_out = uninitialized(n * H * v_dim_);
  kernels::linear_backward(out_, store.data(wo_), dy, d_out, store.grad(wo_), opt_grad(store, bo_), n, H * v_dim_,
                           hidden_, false, 0, kOnly);
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
  float* dc_kv = uninitialized(n * kv_rank_);
  kernels::linear_backward(c_kv_, store.data(wkv_b_), dkvb, dc_kv, store.grad(wkv_b_), nullptr, n, kv_rank_,
                           H * kvb_w, false, 0, kOnly);
  float* dc_pre = dc_kv;
  if (latent_norms_) {
    dc_pre = uninitialized(n * kv_rank_);
    kernels::rmsnorm_backward(c_pre_, store.data(kv_norm_), kv_rstd_, dc_kv, dc_pre, store.grad(kv_norm_), n, kv_rank_,
                              kOnly);
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) std::memcpy(dkva + t * kva_w, dc_pre + t * kv_rank_, sizeof(float) * kv_rank_);
  const kernels::SharedBf16Operand shared_x(x_, n, hidden_);  // read by kv_a's and q's weight gradients
  kernels::linear_backward(x_, store.data(wkv_a_), dkva, dx, store.grad(wkv_a_), opt_grad(store, bkv_a_), n, hidden_,
                           kva_w, false, 0, dx_write);  // dx's first writer; q's product adds to it

  if (q_rank_ > 0) {
    float* dc_q = uninitialized(n * q_rank_);
    kernels::linear_backward(c_q_, store.data(wq_b_), dq, dc_q, store.grad(wq_b_), nullptr, n, q_rank_, H * qk, false,
                             0, kOnly);
    float* dq_a = dc_q;
    if (latent_norms_) {
      dq_a = uninitialized(n * q_rank_);
      kernels::rmsnorm_backward(q_a_, store.data(q_norm_), q_rstd_, dc_q, dq_a, store.grad(q_norm_), n, q_rank_, kOnly);
    }
    kernels::linear_backward(x_, store.data(wq_a_), dq_a, dx, store.grad(wq_a_), opt_grad(store, bq_a_), n, hidden_,
                             q_rank_);
  } else {
    kernels::linear_backward(x_, store.data(wq_), dq, dx, store.grad(wq_), nullptr, n, hidden_, H * qk);
  }
}

}  // namespace keel::nn
