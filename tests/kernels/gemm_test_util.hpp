#pragma once
// Operands for the gemm tests: one product shape and its random, padded operands.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "gradient_check.hpp"

namespace keel::kernels::testing {

// C[m,n] = alpha·op(A)·op(B) + beta·C; ta, tb: A, B stored transposed.
struct GemmCase {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
};

// A, B and C stored as the case says, each row `pad` floats longer than the matrix (0: dense),
// uniform in [-1, 1] from seeds seed, seed + 1, seed + 2. Under beta == 0 the m × n entries of
// C are NaN, which gemm must ignore; the padding stays a number, so a test can check it is untouched.
struct PaddedOperands {
  int64_t lda, ldb, ldc;
  std::vector<float> a, b, c;
};

inline PaddedOperands padded_operands(const GemmCase& cs, int64_t pad, uint32_t seed) {
  PaddedOperands o;
  o.lda = (cs.ta ? cs.m : cs.k) + pad;
  o.ldb = (cs.tb ? cs.k : cs.n) + pad;
  o.ldc = cs.n + pad;
  o.a = random_vector(size_t((cs.ta ? cs.k : cs.m) * o.lda), seed);
  o.b = random_vector(size_t((cs.tb ? cs.n : cs.k) * o.ldb), seed + 1);
  o.c = random_vector(size_t(cs.m * o.ldc), seed + 2);
  if (cs.beta == 0.f)
    for (int64_t i = 0; i < cs.m; ++i)
      std::fill(o.c.begin() + i * o.ldc, o.c.begin() + i * o.ldc + cs.n, std::numeric_limits<float>::quiet_NaN());
  return o;
}

// c (m × n at row stride ldc) += bias in every row: what gemm_bias must give after gemm.
inline void add_bias_to_rows(std::vector<float>& c, int64_t m, int64_t n, int64_t ldc, const std::vector<float>& bias) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[size_t(i * ldc + j)] += bias[size_t(j)];
}

}  // namespace keel::kernels::testing
