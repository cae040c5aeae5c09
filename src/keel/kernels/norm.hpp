#pragma once
// Row normalisations over the last dimension: RMSNorm and LayerNorm.
#include <cstdint>

#include "keel/kernels/grad_write.hpp"

namespace keel::kernels {

// x: (rows, dim); w: (dim) or nullptr (= ones) -> y: (rows, dim); rstd: (rows), saved for backward.
// y = x / sqrt(mean(x²) + eps) * w, the Hugging Face LlamaRMSNorm form (normalise, then scale).
// Models whose weight is stored as w-1 (Gemma) pass 1+w.
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps);

// y from x and the rstd rmsnorm_forward saved: its output again, the same bits (an output dropped
// between forward and backward is recomputed so).
void rmsnorm_apply(const float* x, const float* w, const float* rstd, float* y, int64_t rows, int64_t dim);

// Accumulates dx += ∂L/∂x (or overwrites dx with dx_write Overwrite) and dw += ∂L/∂w (dw skipped
// when w or dw is null; dx when dx is null).
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                      int64_t rows, int64_t dim, GradWrite dx_write = GradWrite::Accumulate);

// x: (rows, dim); w, b: (dim) or nullptr -> y: (rows, dim); mean, rstd: (rows), saved for backward.
// y = (x - mean) / sqrt(var + eps) * w + b, biased variance as torch.nn.LayerNorm.
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                       int64_t rows, int64_t dim, float eps);

// y from x and the mean and rstd layernorm_forward saved: its output again, the same bits.
void layernorm_apply(const float* x, const float* w, const float* b, const float* mean, const float* rstd, float* y,
                     int64_t rows, int64_t dim);

// Accumulates dx, dw, db (each skipped when null).
void layernorm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                        float* dx, float* dw, float* db, int64_t rows, int64_t dim);

}  // namespace keel::kernels
