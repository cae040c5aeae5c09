#pragma once
// Language-model head fused with softmax cross-entropy (and z-loss), computed over chunks of
// rows so the full (n, vocab) logit matrix never exists at once. Under bf16 matmul precision the
// three products take bf16 operands; logits, softmax, loss and z-loss stay fp32 (logits are not
// rounded: the loss is a reduction over the whole vocabulary, docs/precision.md).
#include <cstdint>

namespace keel::kernels {

// Sums over non-ignored rows; z_sum = Σ logZ² with logZ the row's log-sum-exp.
struct LmHeadLoss {
  double ce_sum = 0;
  double z_sum = 0;
  int64_t count = 0;
};

// h: (n, c); w: (vocab, c); targets: (n), -1 = ignore. logits = h·wᵀ, soft-capped to
// final_softcap·tanh(logits/final_softcap) when final_softcap > 0.
// When dh or dw is non-null, accumulates (dh += , dw += ) the gradient of
// grad_scale · (Σ CE + z_loss · Σ logZ²) into dh: (n, c) and dw: (vocab, c).
// z-loss: PaLM (Chowdhery et al. 2022), §5 "Training instability".
LmHeadLoss lm_head_cross_entropy(const float* h, const float* w, const int32_t* targets, int64_t n, int64_t c,
                                 int64_t vocab, float z_loss, float final_softcap, float grad_scale, float* dh,
                                 float* dw);

// h: (n, c); w: (vocab, c) -> logits: (n, vocab), soft-capped when final_softcap > 0.
void lm_head_logits(const float* h, const float* w, float* logits, int64_t n, int64_t c, int64_t vocab,
                    float final_softcap);

}  // namespace keel::kernels
