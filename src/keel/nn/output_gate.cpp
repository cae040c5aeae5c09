#include "keel/nn/output_gate.hpp"

#include <cmath>
#include <cstring>

namespace keel::nn {

namespace {
inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
}  // namespace

void split_query_gate(const float* qg, float* q, float* gate, int64_t n, int64_t heads, int64_t head_dim) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(head_dim);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* src = qg + (t * heads + h) * 2 * head_dim;
      std::memcpy(q + (t * heads + h) * head_dim, src, bytes);
      std::memcpy(gate + (t * heads + h) * head_dim, src + head_dim, bytes);
    }
  }
}

void merge_query_gate(const float* dq, const float* dgate, float* dqg, int64_t n, int64_t heads, int64_t head_dim) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(head_dim);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* dst = dqg + (t * heads + h) * 2 * head_dim;
      std::memcpy(dst, dq + (t * heads + h) * head_dim, bytes);
      std::memcpy(dst + head_dim, dgate + (t * heads + h) * head_dim, bytes);
    }
  }
}

void output_gate_forward(const float* attn, const float* gate, float* y, int64_t count) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) y[i] = attn[i] * sigmoid(gate[i]);
}

void output_gate_backward(const float* attn, const float* gate, const float* dy, float* dattn, float* dgate,
                          int64_t count) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float s = sigmoid(gate[i]);
    dattn[i] = dy[i] * s;
    dgate[i] = dy[i] * attn[i] * s * (1.f - s);
  }
}

}  // namespace keel::nn
