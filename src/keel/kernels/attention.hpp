#pragma once
// Causal multi-head self-attention (MHA, GQA, MQA) without materialising the B×H×T×T scores.
#include <cstdint>

namespace keel::kernels {

struct AttentionDims {
  int64_t batch, seq, heads, kv_heads, qk_dim, v_dim;
  float scale;          // multiplies q·k, usually 1/sqrt(qk_dim)
  float softcap = 0.f;  // > 0: softmax input is softcap·tanh(s/softcap) (Gemma 2)
  // Incremental decoding (forward only, batch 1 in practice): the queries are positions
  // q_offset.., the keys and values hold q_offset + seq rows per sequence (a KV cache), and
  // query i attends to keys 0..q_offset + i.
  int64_t q_offset = 0;
  // Floats between consecutive query (key, value) rows; 0: heads·qk_dim (kv_heads·qk_dim,
  // kv_heads·v_dim), dense. MLA's absorbed decoding reads values from the first v_dim floats of
  // each key row; GPT-2's q, k and v are column blocks of one (tokens, 3·hidden) product, so one
  // GEMM computes them and one GEMM each takes their gradients back (the backward writes dq, dk
  // and dv with the rows of q, k and v).
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  // > 0: sliding-window (local) attention; the query at position p sees keys u with
  // 0 <= p - u < window, the W most recent positions including its own (HF's sliding_window
  // mask in Mistral, Gemma 2/3, gpt-oss). Blocks wholly outside the band are never computed.
  int64_t window = 0;
};

// q: (B,T,Hq,Dqk), k: (B,Tk,Hkv,Dqk), v: (B,Tk,Hkv,Dv) with Tk = q_offset + T -> out: (B,T,Hq,Dv) (overwritten),
// lse: (B,Hq,T) log-sum-exp of each softmax row, saved for backward.
// Query head h reads kv head h / (Hq/Hkv). max_logit: (Hq), updated in place with the max of
// every unmasked scaled logit scale·q·k before soft-capping (the QK-Clip / monitoring signal).
// Blockwise online softmax: Dao 2023, FlashAttention-2, Algorithm 1.
void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse, float* max_logit,
                       const AttentionDims& d);

// Accumulates dq += ∂L/∂q, dk += ∂L/∂k, dv += ∂L/∂v (q_offset 0; dq, dk, dv have the row
// strides of q, k, v; out and dout are dense). Scores are recomputed block by block from q,
// k and lse (FlashAttention-2, Algorithm 2). dq may be out itself (Dqk == Dv, q dense): out is
// read only by a first pass, before dq is written, and dq is then zeroed here and set to ∂L/∂q,
// so a caller whose attention output is dead after the backward needs no buffer for dq.
void attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, const AttentionDims& d);

namespace detail {
// attention_backward copies the Q and dO rows of each task in chunks of about this many floats
// per thread (default 2^20; at least one query block of every head of the kv head, whatever the
// value). Tests set it low to reach several chunks at small shapes; returns
// the previous value. Not for concurrent use with a running backward.
int64_t set_attention_backward_chunk_floats(int64_t floats);
}  // namespace detail

// Same contract as attention_forward; builds each head's full T×T score matrix. Tests only.
void attention_reference_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                                 float* max_logit, const AttentionDims& d);

}  // namespace keel::kernels
