#pragma once
// Branch-free exp and tanh that GCC/Clang auto-vectorize inside `omp simd` loops (the libm
// calls do not without -ffast-math). Used by the attention and cross-entropy inner loops, where
// one exp per score would otherwise cost more than the dot product that produced it. On AVX2 the
// clamp and the select vectorize only under -fno-trapping-math (CMakeLists.txt says why).
#include <bit>
#include <cstdint>

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

}  // namespace keel::kernels::detail
