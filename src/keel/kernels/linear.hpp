#pragma once
// Fully connected layer y = x·Wᵀ + b on top of gemm. Under bf16 matmul precision
// (kernels/precision.hpp) every product takes bf16-rounded operands with fp32 accumulation
// (weight gradients accumulate in fp32 into dw) and the forward output is rounded to bf16.
#include <cstdint>

#include "keel/kernels/grad_write.hpp"

namespace keel::kernels {

// x: (n, in); w: (out, in) PyTorch nn.Linear layout, or (in, out) when w_in_out (GPT-2 Conv1D);
// b: (out) or nullptr; y: (n, out), overwritten. ldw: w's row stride when it is a slice of a wider
// matrix (0: packed, in or out); GPT-2's c_attn computes q, k and v from column slices of its
// (in, 3·in) weight this way, with no split copy.
void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t in, int64_t out,
                    bool w_in_out = false, int64_t ldw = 0);

// Accumulates: dx += dy·W (skipped when dx is null; dx = dy·W with dx_write Overwrite),
// dw += dyᵀ·x in w's own layout, db += Σ_rows dy (skipped when db is null).
// ldw: the row stride of w and dw, as in linear_forward.
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t n,
                     int64_t in, int64_t out, bool w_in_out = false, int64_t ldw = 0,
                     GradWrite dx_write = GradWrite::Accumulate);

// linear_backward for a dy that the caller owns and never reads again (a gradient temporary of
// the backward: dq, dk, dv, an FFN's dgate and dup). Where bf16 products run on the fp32 kernels
// (the portable path) each product would round dy into a copy of its own size; here the bias
// gradient first sums dy's fp32 values, then dy is rounded in place and the products read it as
// it is. The same bits as linear_backward, without an n × out copy at the backward's peak. Under
// fp32 matmuls, and on the native path (which converts to bf16 words anyway), it is
// linear_backward.
void linear_backward_spent(const float* x, const float* w, float* dy, float* dx, float* dw, float* db, int64_t n,
                           int64_t in, int64_t out, bool w_in_out = false, int64_t ldw = 0,
                           GradWrite dx_write = GradWrite::Accumulate);

}  // namespace keel::kernels
