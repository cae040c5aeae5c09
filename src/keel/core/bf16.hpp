#pragma once
// bf16 and fp16 bit conversions: the 16-bit storage types of checkpoints and, later, of
// mixed-precision weights. bf16 is the top half of an IEEE-754 binary32; fp16 is binary16.
#include <bit>
#include <cstdint>

namespace keel {

// bf16 -> float is exact: the bf16 bits are the high 16 bits of the float.
inline float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// float -> bf16 rounding to nearest, ties to even (what PyTorch's .to(torch.bfloat16) does).
// Finite values too large round to +-inf, as IEEE rounding requires. A NaN stays a NaN with
// its sign and top payload bits: truncating could clear every mantissa bit and turn it
// into an infinity, so the quiet bit is forced on.
inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Adding 0x7fff rounds up exactly when the dropped half exceeds one half ulp; adding the
  // kept lowest bit as well breaks the exact tie towards the even result.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// fp16 -> float is exact: every binary16 value, subnormals included, is a binary32 value.
inline float fp16_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    // inf or NaN: keep the payload in the top mantissa bits.
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    // normal: rebias the exponent from 15 to 127.
    bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // +-0
  } else {
    // subnormal half (mantissa * 2^-24): shift until the implicit bit appears.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    const uint32_t float_exponent = static_cast<uint32_t>(127 - 15 + 1 - shift);
    bits = sign | (float_exponent << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace keel
