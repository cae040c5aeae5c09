#include "keel/core/stage_timer.hpp"
#include "keel/kernels/embedding.hpp"

#include <omp.h>

#include <algorithm>

namespace keel::kernels {

// ids: (n), table: (vocab, dim) -> out: (n, dim)
void embedding_forward(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim, float scale) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = table + int64_t(ids[i]) * dim;
    if (scale == 1.0f) {
      std::copy(row, row + dim, out + i * dim);
    } else {
      std::transform(row, row + dim, out + i * dim, [scale](float v) { return scale * v; });
    }
  }
}

// ids: (n), dout: (n, dim); accumulates dtable: (vocab, dim)
void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t dim, float scale) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
  // Column slices of 16 floats (one cache line) keep threads off each other's lines.
  constexpr int64_t kAlign = 16;
  const int64_t units = (dim + kAlign - 1) / kAlign;
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
    const int64_t j0 = std::min(dim, u0 * kAlign), j1 = std::min(dim, u1 * kAlign);
    for (int64_t i = 0; i < n && j0 < j1; ++i) {
      float* dst = dtable + int64_t(ids[i]) * dim;
      const float* src = dout + i * dim;
      if (scale == 1.0f) {
        for (int64_t j = j0; j < j1; ++j) dst[j] += src[j];
      } else {
        for (int64_t j = j0; j < j1; ++j) dst[j] += scale * src[j];
      }
    }
  }
}

}  // namespace keel::kernels
