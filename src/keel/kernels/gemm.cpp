#include "keel/kernels/gemm.hpp"

// The backend is chosen at configure time (cmake/gemm_backend.cmake): oneDNN by default, as
// measured fastest on our target CPUs; OpenBLAS (OpenMP build) through cblas otherwise.
#if KEEL_GEMM_DNNL
#include <dnnl.h>
#else
#include <cblas.h>
#endif

#include <climits>

#include "keel/core/error.hpp"

namespace keel::kernels {

// C: (m, n) = alpha·op(A)(m, k)·op(B)(k, n) + beta·C
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // cblas takes int dimensions; a silent wrap would corrupt memory. (Checked for both backends
  // so the limits do not depend on the build.)
  KEEL_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
  if (k == 0) {
    // Some BLAS builds return early on k == 0 without applying beta; do it here.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
#if KEEL_GEMM_DNNL
  // dnnl_sgemm is row-major with the same argument order as cblas.
  const dnnl_status_t st =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  KEEL_CHECK(st == dnnl_success);
#else
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
#endif
}

// C: (m, n) = alpha·op(A)(m, k)·op(B)(k, n) + beta·C
void gemm_reference(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = trans_a ? a[p * lda + i] : a[i * lda + p];
        const double bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += av * bv;
      }
      // beta == 0 must ignore C entirely (it may be uninitialised, even NaN), as BLAS does.
      const double prev = beta == 0.f ? 0.0 : double(beta) * c[i * ldc + j];
      c[i * ldc + j] = float(double(alpha) * acc + prev);
    }
}

}  // namespace keel::kernels
