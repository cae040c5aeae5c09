#pragma once
// Gated attention (Qwen3-Next; Qiu et al. 2025, "Gated Attention for Large Language Models",
// arXiv:2505.06708): the attention output of each head is multiplied elementwise by σ(g), where
// g comes from the same q_proj, made twice as wide. A head can then shut its output off without
// pushing its softmax onto a sink token, which the paper links to smaller attention logits and
// fewer loss spikes. Layout as HF's Qwen3NextAttention: q_proj's output viewed as
// (tokens, heads, 2·head_dim) holds each head's query first and its gate second.
#include <cstdint>

namespace keel::nn {

// qg: (n, heads, 2·head_dim) -> q: (n, heads·head_dim), gate: (n, heads·head_dim).
void split_query_gate(const float* qg, float* q, float* gate, int64_t n, int64_t heads, int64_t head_dim);
// The inverse, for gradients: dq and dgate into dqg (overwritten).
void merge_query_gate(const float* dq, const float* dgate, float* dqg, int64_t n, int64_t heads, int64_t head_dim);

// y = attn · σ(gate), elementwise over count values.
void output_gate_forward(const float* attn, const float* gate, float* y, int64_t count);
// From dy: dattn = dy · σ(gate) and dgate = dy · attn · σ(gate)(1 − σ(gate)), both overwritten.
void output_gate_backward(const float* attn, const float* gate, const float* dy, float* dattn, float* dgate,
                          int64_t count);

}  // namespace keel::nn
