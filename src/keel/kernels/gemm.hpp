#pragma once
// Single-precision matrix multiply, row-major. The fast path calls the BLAS that keel links
// (OpenBLAS, OpenMP build: see docs/blas.md); gemm_reference is the plain loop tests compare to.
#include <cstdint>

namespace keel::kernels {

// C[m,n] = alpha * op(A) * op(B) + beta * C, op(X) = Xᵀ when trans_x. A is (m,k) or, transposed,
// stored (k,m); B is (k,n) or stored (n,k). lda/ldb/ldc are row strides of the stored matrices.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Same contract as gemm; a triple loop accumulating in double. For tests only.
void gemm_reference(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace keel::kernels
