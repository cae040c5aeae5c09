#pragma once
// Products of the small blocks inside attention (64 queries × 64 keys × a head's width), run on
// the calling thread. At this size a call into the BLAS costs about as much as the arithmetic
// (oneDNN's sgemm ran attention's blocks at ~60 GFLOP/s a core in a step against ~95 for the
// same product alone, docs/performance.md), so the blocks get a register-tiled microkernel of
// their own: AVX-512 (6 rows × 64 columns of C in 24 registers) or AVX2 with FMA (6 × 16 in 12),
// chosen by the compiler's target; any other target calls gemm(). The tiles of C are computed
// in one pass over k, accumulating in fp32.
#include <cstdint>

namespace keel::kernels {

// C(m, n) = op(A)(m, k) · B(k, n), plus C when accumulate; row-major. A is stored (m, k), or
// (k, m) when trans_a; B is (k, n). lda, ldb, ldc are the stored row strides. B has no transposed
// form: attention packs Kᵀ and Vᵀ once per key block instead (attention.cpp).
void block_gemm(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc, bool accumulate);

// C(m, n) = alpha·op(A)·op(B) + beta·C on the calling thread, gemm's contract, on the same
// microkernel: operands packed into cache-sized blocks first (block_gemm.cpp). gemm() runs it on
// each of its panels where it was measured faster than the BLAS (gemm.cpp). Builds without the
// microkernel fall back to gemm_reference (slow; gemm() then never calls this).
// round_bf16: op(A) and op(B) rounded to bf16 as they are packed (nearest, ties to even; alpha
// applied after), gemm_bf16's portable path; only where the build has the microkernel.
void packed_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool round_bf16 = false);

// packed_gemm's contract, run by an OpenMP team from outside a parallel region: the team packs
// op(B) once and shares it, then takes blocks of C as they come free, each computed exactly as
// packed_gemm computes it (so the bits do not depend on the team size). Returns false, having
// done nothing, where packed B would exceed 32 MiB or the build has no microkernel.
bool packed_gemm_team(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                      bool round_bf16 = false);

// x: (rows, cols) at row stride ld -> out: (cols, rows) at row stride out_ld, the transpose.
// 8×8 blocks through AVX registers where the build has AVX, scalar for the ragged edges.
void transpose_block(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out, int64_t out_ld);

// Which microkernel block_gemm runs in this build: "avx512", "avx2" or "gemm" (the fallback).
// packed_gemm's round_bf16 needs one of the first two.
const char* block_gemm_isa();

}  // namespace keel::kernels
