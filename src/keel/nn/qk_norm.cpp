#include "keel/nn/qk_norm.hpp"

#include "keel/kernels/norm.hpp"

namespace keel::nn {

QkNorm::QkNorm(ParameterStore& store, const arch::TensorNameTable& names, int64_t layer, int64_t heads,
               int64_t kv_heads, int64_t head_dim, float eps)
    : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps) {
  q_gain_ = store.add(names, {arch::TensorKind::QNorm, arch::TensorPart::Weight, layer}, {head_dim});
  k_gain_ = store.add(names, {arch::TensorKind::KNorm, arch::TensorPart::Weight, layer}, {head_dim});
}

QkNorm::Saved QkNorm::forward(const ParameterStore& store, Arena& arena, const float* q_raw, const float* k_raw,
                              float* q, float* k, int64_t n) const {
  Saved s{q_raw, k_raw, arena.alloc(static_cast<size_t>(n * heads_)), arena.alloc(static_cast<size_t>(n * kv_heads_))};
  // Each head's vector is one row of the RMSNorm kernel.
  kernels::rmsnorm_forward(q_raw, store.data(q_gain_), q, s.q_rstd, n * heads_, head_dim_, eps_);
  kernels::rmsnorm_forward(k_raw, store.data(k_gain_), k, s.k_rstd, n * kv_heads_, head_dim_, eps_);
  return s;
}

void QkNorm::backward(ParameterStore& store, const Saved& s, const float* dq, const float* dk, float* dq_raw,
                      float* dk_raw, int64_t n) const {
  kernels::rmsnorm_backward(s.q_raw, store.data(q_gain_), s.q_rstd, dq, dq_raw, store.grad(q_gain_), n * heads_,
                            head_dim_);
  kernels::rmsnorm_backward(s.k_raw, store.data(k_gain_), s.k_rstd, dk, dk_raw, store.grad(k_gain_), n * kv_heads_,
                            head_dim_);
}

}  // namespace keel::nn
