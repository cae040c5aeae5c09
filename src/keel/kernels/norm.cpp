#include "keel/core/stage_timer.hpp"
#include "keel/kernels/norm.hpp"

#include <algorithm>
#include <cmath>

namespace keel::kernels {

namespace {

// Column-sliced reduction over rows: out[j] += Σ_r term(r, j). Threads own column slices and
// walk rows in order, so weight gradients are race-free and independent of the thread count.
template <class Term>
void accumulate_columns(float* out, int64_t rows, int64_t dim, Term term) {
  constexpr int64_t kCols = 64;
  const int64_t slices = (dim + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t j0 = s * kCols, j1 = std::min(dim, j0 + kCols);
    double acc[kCols] = {};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += term(r, j);
    for (int64_t j = j0; j < j1; ++j) out[j] += float(acc[j - j0]);
  }
}

}  // namespace

// x: (rows, dim), w: (dim) -> y: (rows, dim), rstd: (rows)
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Norm);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    // Sum of squares in double: dims of several thousand lose digits in fp32.
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < dim; ++j) ss += double(xr[j]) * xr[j];
    const float rs = float(1.0 / std::sqrt(ss / double(dim) + double(eps)));
    rstd[r] = rs;
    if (w != nullptr)
      for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * rs * w[j];
    else
      for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * rs;
  }
}

// x, dy: (rows, dim), rstd: (rows); accumulates dx: (rows, dim), dw: (dim)
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                      int64_t rows, int64_t dim) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Norm);
  if (dx != nullptr) {
    // y_j = x_j·r·w_j with r = (mean(x²)+eps)^-½, ∂r/∂x_k = -r³·x_k/dim, hence
    // dx_k = r·w_k·dy_k - x_k·r³/dim · Σ_j dy_j·w_j·x_j.
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * dim;
      const float* gr = dy + r * dim;
      float* dxr = dx + r * dim;
      const float rs = rstd[r];
      double dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < dim; ++j) dot += double(gr[j]) * (w != nullptr ? w[j] : 1.f) * xr[j];
      const float coef = float(dot * double(rs) * rs * rs / double(dim));
      for (int64_t j = 0; j < dim; ++j) dxr[j] += rs * (w != nullptr ? w[j] : 1.f) * gr[j] - xr[j] * coef;
    }
  }
  if (dw != nullptr && w != nullptr)
    accumulate_columns(dw, rows, dim,
                       [&](int64_t r, int64_t j) { return double(dy[r * dim + j]) * x[r * dim + j] * rstd[r]; });
}

// x: (rows, dim), w, b: (dim) -> y: (rows, dim), mean, rstd: (rows)
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                       int64_t rows, int64_t dim, float eps) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Norm);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    // Two passes in double: the one-pass E[x²]-E[x]² form cancels badly for large means.
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < dim; ++j) s += xr[j];
    const double mu = s / double(dim);
    double v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < dim; ++j) v += (xr[j] - mu) * (xr[j] - mu);
    const float rs = float(1.0 / std::sqrt(v / double(dim) + double(eps)));
    const float m = float(mu);
    mean[r] = m;
    rstd[r] = rs;
    for (int64_t j = 0; j < dim; ++j) {
      const float xh = (xr[j] - m) * rs;
      yr[j] = xh * (w != nullptr ? w[j] : 1.f) + (b != nullptr ? b[j] : 0.f);
    }
  }
}

// x, dy: (rows, dim), mean, rstd: (rows); accumulates dx: (rows, dim), dw, db: (dim)
void layernorm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                        float* dx, float* dw, float* db, int64_t rows, int64_t dim) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Norm);
  if (dx != nullptr) {
    // With x̂ = (x-μ)·r and g = dy·w: dx = r·(g - mean(g) - x̂·mean(g·x̂)).
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * dim;
      const float* gr = dy + r * dim;
      float* dxr = dx + r * dim;
      const float m = mean[r], rs = rstd[r];
      double sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t j = 0; j < dim; ++j) {
        const double g = double(gr[j]) * (w != nullptr ? w[j] : 1.f);
        sg += g;
        sgx += g * ((xr[j] - m) * rs);
      }
      const float mg = float(sg / double(dim)), mgx = float(sgx / double(dim));
      for (int64_t j = 0; j < dim; ++j) {
        const float g = gr[j] * (w != nullptr ? w[j] : 1.f);
        dxr[j] += rs * (g - mg - (xr[j] - m) * rs * mgx);
      }
    }
  }
  if (dw != nullptr && w != nullptr)
    accumulate_columns(dw, rows, dim, [&](int64_t r, int64_t j) {
      return double(dy[r * dim + j]) * ((x[r * dim + j] - mean[r]) * rstd[r]);
    });
  if (db != nullptr) accumulate_columns(db, rows, dim, [&](int64_t r, int64_t j) { return double(dy[r * dim + j]); });
}

}  // namespace keel::kernels
