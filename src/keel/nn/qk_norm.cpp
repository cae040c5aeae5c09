#include "keel/nn/qk_norm.hpp"

#include <vector>

#include "keel/core/error.hpp"
#include "keel/kernels/norm.hpp"

namespace keel::nn {

QkNorm::QkNorm(ParameterStore& store, const arch::TensorNameTable& names, int64_t layer, int64_t heads,
               int64_t kv_heads, int64_t head_dim, float eps, bool full_width, bool unit_offset)
    : q_rows_per_token_(full_width ? 1 : heads),
      k_rows_per_token_(full_width ? 1 : kv_heads),
      q_width_(full_width ? heads * head_dim : head_dim),
      k_width_(full_width ? kv_heads * head_dim : head_dim),
      eps_(eps),
      unit_offset_(unit_offset),
      full_width_(full_width) {
  q_gain_ = store.add(names, {arch::TensorKind::QNorm, arch::TensorPart::Weight, layer}, {q_width_});
  k_gain_ = store.add(names, {arch::TensorKind::KNorm, arch::TensorPart::Weight, layer}, {k_width_});
  if (unit_offset) {
    store.set_init(q_gain_, Init::Zeros);
    store.set_init(k_gain_, Init::Zeros);
  }
}

QkNorm QkNorm::for_heads(int64_t heads, int64_t kv_heads) const {
  KEEL_CHECK(!full_width_);  // a full-width norm's statistics span every head of a token
  QkNorm slice = *this;
  slice.q_rows_per_token_ = heads;
  slice.k_rows_per_token_ = kv_heads;
  return slice;
}

const float* QkNorm::gain(const ParameterStore& store, ParamRef r, int64_t width, float* scratch) const {
  const float* w = store.data(r);
  if (!unit_offset_) return w;
  for (int64_t i = 0; i < width; ++i) scratch[i] = 1.f + w[i];
  return scratch;
}

QkNorm::Saved QkNorm::forward(const ParameterStore& store, Arena& arena, const float* q_raw, const float* k_raw,
                              float* q, float* k, int64_t n) const {
  const Saved s = stats(arena, q_raw, k_raw, n);
  normalize(store, s, q, k, n);
  return s;
}

QkNorm::Saved QkNorm::stats(Arena& arena, const float* q_raw, const float* k_raw, int64_t n) const {
  return {q_raw, k_raw, arena.alloc(static_cast<size_t>(n * q_rows_per_token_)),
          arena.alloc(static_cast<size_t>(n * k_rows_per_token_))};
}

void QkNorm::normalize(const ParameterStore& store, const Saved& s, float* q, float* k, int64_t n) const {
  // Each normalized vector is one row of the RMSNorm kernel; q and k are (n, heads·head_dim)
  // either way, so the two widths are two views of the same memory.
  std::vector<float> qg(unit_offset_ ? static_cast<size_t>(q_width_) : 0), kg(unit_offset_ ? static_cast<size_t>(k_width_) : 0);
  kernels::rmsnorm_forward(s.q_raw, gain(store, q_gain_, q_width_, qg.data()), q, s.q_rstd, n * q_rows_per_token_,
                           q_width_, eps_);
  kernels::rmsnorm_forward(s.k_raw, gain(store, k_gain_, k_width_, kg.data()), k, s.k_rstd, n * k_rows_per_token_,
                           k_width_, eps_);
}

void QkNorm::backward(ParameterStore& store, const Saved& s, const float* dq, const float* dk, float* dq_raw,
                      float* dk_raw, int64_t n) const {
  // d(1 + w)/dw = 1: the gain's gradient is the weight's.
  std::vector<float> qg(unit_offset_ ? static_cast<size_t>(q_width_) : 0), kg(unit_offset_ ? static_cast<size_t>(k_width_) : 0);
  kernels::rmsnorm_backward(s.q_raw, gain(store, q_gain_, q_width_, qg.data()), s.q_rstd, dq, dq_raw,
                            store.grad(q_gain_), n * q_rows_per_token_, q_width_, kernels::GradWrite::Overwrite);
  kernels::rmsnorm_backward(s.k_raw, gain(store, k_gain_, k_width_, kg.data()), s.k_rstd, dk, dk_raw,
                            store.grad(k_gain_), n * k_rows_per_token_, k_width_, kernels::GradWrite::Overwrite);
}

}  // namespace keel::nn
