#include "keel/optim/newton_schulz.hpp"
#include "keel/core/fixed_order_sum.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "keel/core/error.hpp"
#include "keel/kernels/gemm.hpp"

namespace keel::optim {

int64_t newton_schulz_workspace_floats(int64_t rows, int64_t cols) {
  const int64_t r = std::min(rows, cols), c = std::max(rows, cols);
  return 2 * r * c + 2 * r * r;
}

void newton_schulz5(const float* g, float* out, int64_t rows, int64_t cols, float* workspace, int steps) {
  KEEL_CHECK(rows > 0 && cols > 0 && g != out);
  const bool transposed = rows > cols;  // make X wide: (r, c) with r <= c
  const int64_t r = transposed ? cols : rows, c = transposed ? rows : cols;
  float* x = workspace;
  float* y = x + r * c;
  float* a = y + r * c;
  float* b = a + r * r;

  // X = G or Gᵀ, then X / (‖X‖_F + eps) so that σ_max(X) <= 1.
  double sumsq = 0;
  if (transposed) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) x[i * c + j] = g[j * cols + i];
  } else {
    std::memcpy(x, g, static_cast<size_t>(r * c) * sizeof(float));
  }
  sumsq = fixed_order_sum<1>(r * c, [&](int64_t i0, int64_t i1) {
    double s = 0;
    for (int64_t i = i0; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
    return std::array<double, 1>{s};
  })[0];
  const float inv = static_cast<float>(1.0 / (std::sqrt(sumsq) + kNewtonSchulzEps));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < r * c; ++i) x[i] *= inv;

  for (int s = 0; s < steps; ++s) {
    // A = X Xᵀ: (r, r)
    kernels::gemm(false, true, r, r, c, 1.0f, x, c, x, c, 0.0f, a, r);
    // B = c·A·A + b·A
    std::memcpy(b, a, static_cast<size_t>(r * r) * sizeof(float));
    kernels::gemm(false, false, r, r, r, kNewtonSchulzC, a, r, a, r, kNewtonSchulzB, b, r);
    // Y = a·X + B·X
    std::memcpy(y, x, static_cast<size_t>(r * c) * sizeof(float));
    kernels::gemm(false, false, r, c, r, 1.0f, b, r, x, c, kNewtonSchulzA, y, c);
    std::swap(x, y);
  }

  if (transposed) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = x[j * c + i];
  } else {
    std::memcpy(out, x, static_cast<size_t>(r * c) * sizeof(float));
  }
}

}  // namespace keel::optim
