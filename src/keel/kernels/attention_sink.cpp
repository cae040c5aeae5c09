#include "keel/kernels/attention_sink.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <omp.h>

namespace keel::kernels {

void attention_sink_forward(float* out, float* lse, const float* sinks, const AttentionDims& d) {
  const int64_t rows = d.batch * d.seq;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / d.seq, i = r % d.seq;
    for (int64_t h = 0; h < d.heads; ++h) {
      float& l = lse[(b * d.heads + h) * d.seq + i];
      const double lk = l, s = sinks[h];
      const double m = std::max(lk, s);
      const double l_new = m + std::log(std::exp(lk - m) + std::exp(s - m));
      const float keep = static_cast<float>(std::exp(lk - l_new));  // share left to the real keys
      float* o = out + (r * d.heads + h) * d.v_dim;
      for (int64_t j = 0; j < d.v_dim; ++j) o[j] *= keep;
      l = static_cast<float>(l_new);
    }
  }
}

void attention_sink_backward(const float* out, const float* lse, const float* sinks, const float* dout,
                             float* dsinks, const AttentionDims& d) {
  const int64_t rows = d.batch * d.seq;
  // Partial sums in double over fixed chunks of rows, added in chunk order afterwards, so the
  // gradient is the same bits at any thread count (no order-dependent critical section).
  constexpr int64_t kRowsPerChunk = 64;
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  std::vector<std::vector<double>> parts(static_cast<size_t>(chunks), std::vector<double>(static_cast<size_t>(d.heads), 0.0));
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    std::vector<double>& part = parts[static_cast<size_t>(chunk)];
    for (int64_t r = chunk * kRowsPerChunk; r < std::min(rows, (chunk + 1) * kRowsPerChunk); ++r) {
      const int64_t b = r / d.seq, i = r % d.seq;
      for (int64_t h = 0; h < d.heads; ++h) {
        const float* o = out + (r * d.heads + h) * d.v_dim;
        const float* go = dout + (r * d.heads + h) * d.v_dim;
        double dot = 0;
        for (int64_t j = 0; j < d.v_dim; ++j) dot += double(o[j]) * go[j];
        const double p_sink = std::exp(double(sinks[h]) - lse[(b * d.heads + h) * d.seq + i]);
        part[static_cast<size_t>(h)] -= p_sink * dot;
      }
    }
  }
  std::vector<double> total(static_cast<size_t>(d.heads), 0.0);
  for (const auto& part : parts) {
    for (int64_t h = 0; h < d.heads; ++h) total[static_cast<size_t>(h)] += part[static_cast<size_t>(h)];
  }
  for (int64_t h = 0; h < d.heads; ++h) dsinks[h] += static_cast<float>(total[static_cast<size_t>(h)]);
}

}  // namespace keel::kernels
