#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): the value at (key, counter)
// depends on nothing else, so initialization is identical whatever the order, thread count or
// subset of parameters being drawn.
#include <cmath>
#include <cstdint>
#include <string_view>

namespace keel {

struct Philox4x32 {
  static constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  static constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

  // Four 32-bit outputs for a 128-bit counter (c0..c3) and a 64-bit key.
  static void block(uint32_t c[4], uint64_t key) {
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int round = 0; round < 10; ++round) {
      uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
      uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
      uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
      uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
      uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
      c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
      k0 += kWeyl0; k1 += kWeyl1;
    }
  }
};

// FNV-1a, to derive a stream id from a parameter's name.
inline uint64_t stable_hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) { h ^= ch; h *= 1099511628211ull; }
  return h;
}

// Standard normal number i of stream `stream` under `seed` (Box-Muller on two uniforms).
inline float normal_at(uint64_t seed, uint64_t stream, uint64_t i) {
  uint32_t c[4] = {static_cast<uint32_t>(i >> 1), static_cast<uint32_t>(i >> 33),
                   static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  Philox4x32::block(c, seed);
  // Uniforms in (0, 1]: never log(0).
  double u1 = (static_cast<double>(c[0]) + 1.0) / 4294967296.0;
  double u2 = static_cast<double>(c[1]) / 4294967296.0;
  double r = std::sqrt(-2.0 * std::log(u1));
  double angle = 6.283185307179586 * u2;
  return static_cast<float>((i & 1) ? r * std::sin(angle) : r * std::cos(angle));
}

// Uniform integer in [0, n) at index i of a stream.
inline uint64_t uniform_int_at(uint64_t seed, uint64_t stream, uint64_t i, uint64_t n) {
  uint32_t c[4] = {static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), static_cast<uint32_t>(stream),
                   static_cast<uint32_t>(stream >> 32) ^ 0x5bd1e995u};
  Philox4x32::block(c, seed);
  uint64_t x = (static_cast<uint64_t>(c[0]) << 32) | c[1];
  return x % n;
}

}  // namespace keel
