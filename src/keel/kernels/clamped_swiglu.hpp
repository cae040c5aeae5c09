#pragma once
// gpt-oss's clamped SwiGLU (HF modeling_gpt_oss.py GptOssExperts; OpenAI's gpt-oss model card):
//   g = min(gate, limit),  u = clamp(up, −limit, limit),  h = (u + 1) · g · σ(α·g)
// with α = 1.702 (the sigmoid approximation of GELU) and limit 7. The clamps bound what one
// expert can add to the residual stream; the "+ 1" lets the up projection start as a pass-through
// of the gated branch. gate and up arrive interleaved, as the fused gate_up_proj gives them:
// column 2i is gate i, column 2i + 1 is up i.
#include <cstdint>

namespace keel::kernels {

struct ClampedSwiglu {
  float alpha = 1.702f;
  float limit = 7.0f;
};

// gate_up: (n, 2·width) interleaved -> h: (n, width).
void clamped_swiglu_forward(const float* gate_up, float* h, int64_t n, int64_t width, const ClampedSwiglu& c);

// dh: (n, width) -> dgate_up: (n, 2·width), overwritten. A clamped value passes no gradient
// (torch.clamp: the gradient flows where min ≤ x ≤ max).
void clamped_swiglu_backward(const float* gate_up, const float* dh, float* dgate_up, int64_t n, int64_t width,
                             const ClampedSwiglu& c);

}  // namespace keel::kernels
