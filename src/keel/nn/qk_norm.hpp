#pragma once
// QK-Norm (Qwen3, GLM-4.5 with use_qk_norm; Dehghani et al. 2023, "Scaling Vision Transformers
// to 22B", §3.1; algorithms.md): an RMSNorm over each head's head_dim vector of the query and
// key projections, one gain per dimension shared by all heads (q_norm, k_norm), applied before
// RoPE. It bounds |q·k| by the gains, so attention logits cannot grow with the weights' norm.
// OLMo 2 (arXiv:2501.00656 §3.2.1, modeling_olmo2.py) normalizes instead the whole projection,
// heads·head_dim wide, with one gain per element (`full_width`): every head's scale then
// depends on all heads of its token, which still bounds the sum of their logits.
#include <cstdint>

#include "keel/arch/tensor_names.hpp"
#include "keel/core/arena.hpp"
#include "keel/nn/parameters.hpp"

namespace keel::nn {

class QkNorm {
 public:
  // unit_offset: Gemma 3's (1 + w) gains, stored and initialized around 0 (Gemma3RMSNorm).
  QkNorm(ParameterStore& store, const arch::TensorNameTable& names, int64_t layer, int64_t heads, int64_t kv_heads,
         int64_t head_dim, float eps, bool full_width = false, bool unit_offset = false);

  // Per-row statistics of one call, for backward (rstd: (n·heads), (n·kv_heads); per head,
  // or (n), (n) full width).
  struct Saved {
    const float *q_raw = nullptr, *k_raw = nullptr;
    float *q_rstd = nullptr, *k_rstd = nullptr;
  };
  // q_raw: (n, heads, head_dim), k_raw: (n, kv_heads, head_dim) -> q, k (same shapes, overwritten).
  Saved forward(const ParameterStore& store, Arena& arena, const float* q_raw, const float* k_raw, float* q, float* k,
                int64_t n) const;
  // forward in two parts, so q and k can be allocated after the statistics (and given back
  // while they are kept): the rstd buffers from the arena, then q, k from saved's q_raw, k_raw,
  // writing its rstd. Again on the same input, the same bits (the backward recomputes q, k).
  Saved stats(Arena& arena, const float* q_raw, const float* k_raw, int64_t n) const;
  void normalize(const ParameterStore& store, const Saved& saved, float* q, float* k, int64_t n) const;
  // Overwrites dq_raw and dk_raw (their only writer: no zeroing first) and accumulates the q_norm /
  // k_norm gain gradients, from dq, dk.
  void backward(ParameterStore& store, const Saved& saved, const float* dq, const float* dk, float* dq_raw,
                float* dk_raw, int64_t n) const;

  // Per-head QK-Norm only (not full width): the same gains over q and k tensors of `heads` and
  // `kv_heads` heads a token, a slice of the layer's heads (Attention::forward_by_kv_head).
  bool per_head() const { return !full_width_; }
  QkNorm for_heads(int64_t heads, int64_t kv_heads) const;

 private:
  ParamRef q_gain_, k_gain_;
  // One normalized row: a head's vector (per head) or a token's whole projection (full width).
  int64_t q_rows_per_token_, k_rows_per_token_, q_width_, k_width_;
  float eps_;
  bool unit_offset_;
  bool full_width_;
  // The gain the kernel multiplies by: the weight, or 1 + weight written into `scratch`.
  const float* gain(const ParameterStore& store, ParamRef r, int64_t width, float* scratch) const;
};

}  // namespace keel::nn
