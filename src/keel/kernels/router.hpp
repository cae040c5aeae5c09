#pragma once
// MoE router math: expert scores from router logits, top-k selection, combine weights, and the
// backward from the combine weights to the logits. The selection itself is not differentiated.
//
//   softmax (Mixtral, Qwen3-MoE; HF MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock):
//     p = softmax(logits); pick the top-k of p; w = p_sel, divided by Σ p_sel when normalize.
//   sigmoid (DeepSeek-V3 / Kimi K2 / GLM-4.5; HF DeepseekV3TopkRouter, paper §2.1.2 eqs. 13-16):
//     s = sigmoid(logits); choice = s + bias (bias only for SELECTION); group score = sum of the
//     top-2 choices of each of n_group groups; keep the topk_group best groups; pick the top-k
//     choices inside them (experts of other groups count as 0.0, as HF's masked_fill does);
//     w = s_sel / (Σ s_sel + 1e-20) when normalize, times routed_scaling_factor.
//   softmax, group-limited (DeepSeek-V2 group_limited_greedy; HF DeepseekV2Moe): p = softmax;
//     group score = the group's largest p; keep the topk_group best groups (others count as 0.0),
//     pick the top-k; w = p_sel times routed_scaling_factor. n_group 1 is plain greedy top-k.
// Ties go to the lower index; slots are ordered by decreasing choice.
#include <cstdint>

namespace keel::kernels {

enum class RouterScore { Softmax, Sigmoid };

struct RouterConfig {
  RouterScore score = RouterScore::Softmax;
  int64_t experts = 0;
  int64_t top_k = 0;
  bool normalize = false;  // Mixtral: always; Qwen3-MoE / DeepSeek: norm_topk_prob
  float scaling = 1.0f;    // routed_scaling_factor (sigmoid routers, DeepSeek-V2)
  int64_t n_group = 1;     // group-limited routing (sigmoid routers, DeepSeek-V2)
  int64_t topk_group = 1;
};

// logits: (n, E); bias: (E) or null (selection only) -> probs: (n, E) softmax or sigmoid scores,
// indices: (n, k) selected experts, weights: (n, k) combine weights.
void router_forward(const RouterConfig& c, const float* logits, const float* bias, float* probs, int32_t* indices,
                    float* weights, int64_t n);

// probs, indices, weights from router_forward; dweights: (n, k). Accumulates dlogits: (n, E).
void router_backward(const RouterConfig& c, const float* probs, const int32_t* indices, const float* weights,
                     const float* dweights, float* dlogits, int64_t n);

// Mean over tokens of the entropy (nats) of the router's distribution: p for softmax, s / Σ s
// for sigmoid scores. probs: (n, E).
double router_entropy(const RouterConfig& c, const float* probs, int64_t n);

}  // namespace keel::kernels
