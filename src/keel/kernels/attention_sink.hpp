#pragma once
// Attention sinks (gpt-oss): a learned logit per head that joins every softmax row's
// denominator and carries no value, so a head can put weight "nowhere" instead of on real keys
// (HF modeling_gpt_oss.py eager_attention_forward; Xiao et al. 2023, "Efficient Streaming
// Language Models with Attention Sinks"). With lse the log-sum-exp over the real keys, the row's
// normalizer becomes lse' = log(e^lse + e^sink) and every probability shrinks by e^(lse − lse').
// Applied after the blockwise kernel (kernels/attention.hpp), which needs no change: its
// backward, fed the adjusted output and lse', already gives the right dq, dk, dv.
#include <cstdint>

#include "keel/kernels/attention.hpp"

namespace keel::kernels {

// out: (B,T,Hq,Dv), lse: (B,Hq,T) as attention_forward wrote them; sinks: (Hq), raw logits
// (not scaled, not soft-capped). Rescales out and replaces lse by lse' in place.
void attention_sink_forward(float* out, float* lse, const float* sinks, const AttentionDims& d);

// Accumulates dsinks[h] += −Σ_{b,i} e^(sink_h − lse'_{b,h,i}) · ⟨dout, out'⟩_{b,i,h}: the sink's
// probability times the row's ⟨dO, O⟩ term of the softmax backward (FlashAttention-2's D).
// out and lse are the adjusted ones attention_sink_forward left.
void attention_sink_backward(const float* out, const float* lse, const float* sinks, const float* dout,
                             float* dsinks, const AttentionDims& d);

}  // namespace keel::kernels
