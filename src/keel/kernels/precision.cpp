#include "keel/kernels/precision.hpp"

#include <algorithm>
#include <cstring>

#include "keel/core/bf16.hpp"

namespace keel::kernels {

namespace {
thread_local Precision current = Precision::Fp32;
thread_local std::vector<FloatSpan>* capture = nullptr;
thread_local bool capture_residual = false;

// Overlapping conversion goes through a small buffer one chunk at a time, so the loops that
// convert never read what they write (they vectorize) and the chunk order keeps every value read
// before its bytes are overwritten: packing runs front to back (with dst <= src, chunk k lands
// below where chunk k + 1 is read), unpacking back to front (with dst >= src, chunk k lands above
// where chunk k - 1 is read).
constexpr int64_t kChunk = 4096;
}  // namespace

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Bf16: return "bf16";
  }
  return "fp32";
}

std::optional<Precision> parse_precision(std::string_view name) {
  if (name == "fp32") return Precision::Fp32;
  if (name == "bf16") return Precision::Bf16;
  return std::nullopt;
}

Precision matmul_precision() { return current; }

PrecisionScope::PrecisionScope(Precision p) : previous_(current) { current = p; }
PrecisionScope::~PrecisionScope() { current = previous_; }

// x: (n), in place
void round_to_bf16(float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
}

void round_activation(float* x, int64_t n) {
  if (current != Precision::Bf16) return;
  round_to_bf16(x, n);
  if (capture != nullptr && n > 0) capture->push_back({x, n});
}

void unround_activation(const float* x, int64_t n) {
  if (capture == nullptr) return;
  std::erase_if(*capture, [&](const FloatSpan& s) { return s.data < x + n && x < s.data + s.count; });
}

void keep_residual_as_bf16(const float* x, int64_t n) {
  if (capture != nullptr && capture_residual && n > 0) capture->push_back({const_cast<float*>(x), n});
}

Bf16Capture::Bf16Capture(std::vector<FloatSpan>* out, bool residual_too)
    : previous_(capture), previous_residual_(capture_residual) {
  capture = out;
  capture_residual = residual_too;
}
Bf16Capture::~Bf16Capture() {
  capture = previous_;
  capture_residual = previous_residual_;
}

void pack_bf16(const float* src, uint16_t* dst, int64_t n) {
  if (reinterpret_cast<const char*>(dst + n) <= reinterpret_cast<const char*>(src) ||
      reinterpret_cast<const char*>(src + n) <= reinterpret_cast<const char*>(dst)) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);  // apart: no buffer needed
    return;
  }
  uint16_t buf[kChunk];
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t m = std::min(kChunk, n - c0);
    const float* in = src + c0;
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) buf[i] = float_to_bf16(in[i]);
    std::memcpy(dst + c0, buf, static_cast<size_t>(m) * sizeof(uint16_t));
  }
}

void unpack_bf16(const uint16_t* src, float* dst, int64_t n) {
  if (reinterpret_cast<const char*>(dst + n) <= reinterpret_cast<const char*>(src) ||
      reinterpret_cast<const char*>(src + n) <= reinterpret_cast<const char*>(dst)) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
    return;
  }
  uint16_t buf[kChunk];
  for (int64_t end = n; end > 0; end -= kChunk) {
    const int64_t c0 = std::max<int64_t>(0, end - kChunk), m = end - c0;
    std::memcpy(buf, src + c0, static_cast<size_t>(m) * sizeof(uint16_t));
    float* out = dst + c0;
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) out[i] = bf16_to_float(buf[i]);
  }
}

}  // namespace keel::kernels
