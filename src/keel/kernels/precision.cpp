#include "keel/kernels/precision.hpp"

#include "keel/core/bf16.hpp"

namespace keel::kernels {

namespace {
thread_local Precision current = Precision::Fp32;
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
  if (current == Precision::Bf16) round_to_bf16(x, n);
}

}  // namespace keel::kernels
