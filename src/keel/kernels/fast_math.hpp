#pragma once
// Branch-free exp and tanh that GCC/Clang auto-vectorize inside `omp simd` loops (the libm
// calls do not without -ffast-math). Used by the attention and cross-entropy inner loops, where
// one exp per score would otherwise cost more than the dot product that produced it. On AVX2 the
// clamp and the select vectorize only under -fno-trapping-math (CMakeLists.txt says why).
#include <bit>
#include <cstdint>
#include <limits>

namespace keel::kernels::detail {

// e^x to ~2 ulp for x in [-87, 88]; 0 below (exp(-inf) = 0, as masked scores need).
inline float fast_exp(float x) {
  const float xc = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
  // x = n·ln2 + r, |r| <= ln2/2; the magic constant rounds to nearest without a libm call.
  const float kShift = 12582912.f;  // 1.5·2^23
  const float n = (xc * 1.44269504088896341f + kShift) - kShift;
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  // Taylor polynomial of degree 6; remainder r^7/7! < 2e-7 relative on |r| <= 0.347.
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const float scale = std::bit_cast<float>((int32_t(n) + 127) << 23);
  return x < -87.f ? 0.f : p * scale;
}

// tanh(x) to ~1e-7 absolute; an odd Taylor series near 0 avoids the cancellation in 1 - 2/(e^2x+1).
inline float fast_tanh(float x) {
  const float x2 = x * x;
  const float small = x * (1.f + x2 * (-1.f / 3.f + x2 * (2.f / 15.f + x2 * (-17.f / 315.f + x2 * (62.f / 2835.f)))));
  const float large = 1.f - 2.f / (fast_exp(2.f * x) + 1.f);
  return x2 < 0.0625f ? small : large;
}

// max of x[0, n) in 16 lanes, -inf for n = 0; NaNs are passed over, as std::max(m, x) passes
// them. A loop of std::max, even under `omp simd reduction(max)`, stays a chain of scalar vmaxss
// (3 cycles each): 69% of the cross-entropy's own samples in perf, and taking it out halved the
// loss stage (docs/performance.md, "Zen 5 a third time"). The compare-and-select in lanes
// vectorizes to vmaxps.
inline float max_in_lanes(const float* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  float lanes[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) lanes[l] = kLowest;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = x[i + l] > lanes[l] ? x[i + l] : lanes[l];
  float m = kLowest;
  for (int64_t l = 0; l < kLanes; ++l) m = lanes[l] > m ? lanes[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace keel::kernels::detail
