#pragma once
// Causal multi-head self-attention (MHA, GQA, MQA) without materialising the B×H×T×T scores.
#include <cstdint>

namespace keel::kernels {

struct AttentionDims {
  int64_t batch, seq, heads, kv_heads, qk_dim, v_dim;
  float scale;          // multiplies q·k, usually 1/sqrt(qk_dim)
  float softcap = 0.f;  // > 0: softmax input is softcap·tanh(s/softcap) (Gemma 2)
};

// q: (B,T,Hq,Dqk), k: (B,T,Hkv,Dqk), v: (B,T,Hkv,Dv) -> out: (B,T,Hq,Dv) (overwritten),
// lse: (B,Hq,T) log-sum-exp of each softmax row, saved for backward.
// Query head h reads kv head h / (Hq/Hkv). max_logit: (Hq), updated in place with the max of
// every unmasked scaled logit scale·q·k before soft-capping (the QK-Clip / monitoring signal).
// Blockwise online softmax: Dao 2023, FlashAttention-2, Algorithm 1.
void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse, float* max_logit,
                       const AttentionDims& d);

// Accumulates dq += ∂L/∂q, dk += ∂L/∂k, dv += ∂L/∂v. Scores are recomputed block by block from q,
// k and lse (FlashAttention-2, Algorithm 2).
void attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, const AttentionDims& d);

// Same contract as attention_forward; builds each head's full T×T score matrix. Tests only.
void attention_reference_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                                 float* max_logit, const AttentionDims& d);

}  // namespace keel::kernels
