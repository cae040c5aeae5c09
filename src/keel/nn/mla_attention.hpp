#pragma once
// Multi-head Latent Attention (DeepSeek-V2/V3 §2.1.1, Kimi K2), as HF's modeling_deepseek_v3.py
// computes it for training (no weight absorption):
//   q   = q_b_proj(RMSNorm_q(q_a_proj(x)))   or q_proj(x) when q_lora_rank is null    (n, H, dn+dr)
//   kva = kv_a_proj_with_mqa(x) = [c_pre (kv_lora_rank) | kR_pre (dr)]
//   [kC_h | v_h] = kv_b_proj(RMSNorm_kv(c_pre)) per head                               (dn, dv)
//   qR = RoPE(q[..., dn:]), kR = RoPE(kR_pre) shared by all heads
//   o_h = softmax(scale · [qC_h; qR_h]·[kC_h; kR]) v_h, y = o_proj(concat_h o_h)
// scale = (dn + dr)^-1/2, times mscale(factor, mscale_all_dim)² when rope_scaling sets
// mscale_all_dim (HF DeepseekV3Attention). Per-head max logits come from the attention kernel.
//
// Incremental decoding caches only [c_KV | k^R] per token (kv_lora_rank + qk_rope_head_dim
// floats, the figure `keel inspect` reports) and never re-expands keys or values: with
// W^UK_h, W^UV_h the key and value rows of kv_b_proj for head h (DeepSeek-V2 §2.1.2, "absorb"),
//   qC_h·kC_h,j = qC_h·(W^UK_h c_j) = (W^UK_hᵀ qC_h)·c_j,   Σ_j p_j v_h,j = W^UV_h (Σ_j p_j c_j),
// so each head attends with query [W^UK_hᵀ qC_h | qR_h] over the shared rows [c_j | k^R_j]
// (MQA with one kv head), reads the values from the same rows' first kv_lora_rank floats, and
// W^UV_h maps the mixed latent to its v_head_dim output.
#include <string>

#include "keel/arch/model_spec.hpp"
#include "keel/core/arena.hpp"
#include "keel/kernels/rope.hpp"
#include "keel/nn/modules.hpp"
#include "keel/nn/parameters.hpp"

namespace keel::nn {

class MlaAttention {
 public:
  // rope: a table of rotary_dim = qk_rope_head_dim (interleaved when rope_interleave is set).
  MlaAttention(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer, const kernels::RopeTable* rope);
  // x: (n, hidden) -> returns y: (n, hidden). max_logit: (heads) running max, updated in place.
  float* forward(ParameterStore& store, Arena& arena, const float* x, const StepShape& s, float* max_logit);
  // Accumulates the parameter gradients; dx (n, hidden) is overwritten or added to as dx_write says.
  void backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, const StepShape& s,
                kernels::GradWrite dx_write = kernels::GradWrite::Accumulate);

  // n new tokens after the cache's rows, by the absorbed projections (file comment); appends
  // [c_KV | k^R] of each.
  float* forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n,
                             KvCache& cache) const;
  // Rows of kv_lora_rank + qk_rope_head_dim floats; values live in the key rows.
  KvCache make_cache(int64_t max_rows) const;

  int64_t heads() const { return heads_; }

 private:
  // Queries (n, H, dn + dr) with q^R rotated; the q_a path's intermediates go to the pointers.
  float* project_q(const ParameterStore& store, Arena& arena, const float* x, const StepShape& s, float*& q_a,
                   float*& q_rstd, float*& c_q) const;
  // kv_a_proj output (n, kv_rank + dr) with k^R rotated, and the normalized latent (n, kv_rank).
  float* project_kv_a(const ParameterStore& store, Arena& arena, const float* x, const StepShape& s, float*& c_pre,
                      float*& kv_rstd, float*& c_kv) const;
  int64_t hidden_, heads_, q_rank_, kv_rank_, nope_, rope_dim_, v_dim_;
  // q_a_layernorm / kv_a_layernorm eps: 1e-6 whatever rms_norm_eps says, as HF builds them
  // (DeepseekV3Attention: DeepseekV3RMSNorm(q_lora_rank), the class default) and DeepSeek's
  // inference code does; the block norms use rms_norm_eps.
  static constexpr float kLatentNormEps = 1e-6f;
  float scale_, softcap_;
  bool latent_norms_;  // q_a_layernorm / kv_a_layernorm present (keel.mla_latent_norms)
  const kernels::RopeTable* rope_;
  ParamRef wq_a_, bq_a_, q_norm_, wq_b_, wq_;  // q_lora_rank > 0: q_a/q_a_layernorm/q_b, else q_proj
  ParamRef wkv_a_, bkv_a_, kv_norm_, wkv_b_, wo_, bo_;
  // Saved for backward.
  const float* x_ = nullptr;
  float *q_a_ = nullptr, *q_rstd_ = nullptr, *c_q_ = nullptr;       // q_a_proj output, its rstd, normed
  float *c_pre_ = nullptr, *kv_rstd_ = nullptr, *c_kv_ = nullptr;  // latent before/after kv_a_layernorm
  float *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;                // attention inputs (n, H, ·)
  float *out_ = nullptr, *lse_ = nullptr;
};

}  // namespace keel::nn
