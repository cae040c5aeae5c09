#pragma once
// Logit soft-capping y = cap·tanh(x/cap) (Gemma 2 attention and final logits).
#include <cstdint>

namespace keel::kernels {

// x: (n) -> y: (n)
void softcap_forward(const float* x, float* y, int64_t n, float cap);
// Accumulates dx += (1 - tanh²(x/cap))·dy.
void softcap_backward(const float* x, const float* dy, float* dx, int64_t n, float cap);

}  // namespace keel::kernels
