#include "keel/kernels/block_gemm.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "keel/kernels/gemm.hpp"

#if defined(__AVX__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define KEEL_BLOCK_GEMM_SIMD 1
#else
#define KEEL_BLOCK_GEMM_SIMD 0
#endif

namespace keel::kernels {

#if defined(__AVX__)
namespace {

// The 8×8 block at x (stride ld) transposed into out (stride out_ld): unpack pairs of rows, then
// shuffle pairs of pairs, then swap 128-bit halves.
inline void transpose_8x8(const float* x, int64_t ld, float* out, int64_t out_ld) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(x + i * ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + i * out_ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * out_ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

}  // namespace
#endif

void transpose_block(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out, int64_t out_ld) {
  int64_t full_rows = 0, full_cols = 0;
#if defined(__AVX__)
  full_rows = rows / 8 * 8;
  full_cols = cols / 8 * 8;
  for (int64_t r = 0; r < full_rows; r += 8)
    for (int64_t c = 0; c < full_cols; c += 8) transpose_8x8(x + r * ld + c, ld, out + c * out_ld + r, out_ld);
#endif
  for (int64_t r = 0; r < rows; ++r)  // the edges outside whole 8×8 blocks
    for (int64_t c = r < full_rows ? full_cols : 0; c < cols; ++c) out[c * out_ld + r] = x[r * ld + c];
}

#if KEEL_BLOCK_GEMM_SIMD
namespace {

// One vector of floats and the operations the microkernel needs. A tile is kTileRows rows of C
// by up to kTileVecs vectors; its accumulators, one vector of B per column vector and the
// broadcast of A must fit the register file (AVX-512: 24 + 4 + 1 of 32; AVX2: 12 + 2 + 1 of 16).
#if defined(__AVX512F__)
using Vec = __m512;
using Mask = __mmask16;
constexpr int kLanes = 16, kTileRows = 6, kTileVecs = 4;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vbroadcast(float x) { return _mm512_set1_ps(x); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vload(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline void vstore(float* p, Vec v, Mask m) { _mm512_mask_storeu_ps(p, m, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Mask lanes_below(int count) { return static_cast<Mask>((1u << count) - 1u); }
#else
using Vec = __m256;
using Mask = __m256i;
constexpr int kLanes = 8, kTileRows = 6, kTileVecs = 2;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vbroadcast(float x) { return _mm256_set1_ps(x); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vload(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline void vstore(float* p, Vec v, Mask m) { _mm256_maskstore_ps(p, m, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Mask lanes_below(int count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

// C tile (Rows × Vecs vectors) = op(A) rows · B columns over all of k, then stored (or added to
// C). Tail: the last vector holds only `rest` columns, loaded and stored under a mask.
template <bool TransA, int Rows, int Vecs, bool Tail>
void tile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
          bool accumulate, int rest) {
  const Mask tail = lanes_below(rest);
  Vec acc[Rows][Vecs];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) acc[r][v] = vzero();
#pragma GCC unroll 4
  for (int64_t p = 0; p < k; ++p) {
    const float* brow = b + p * ldb;
    Vec bv[Vecs];
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v)
      bv[v] = (Tail && v == Vecs - 1) ? vload(brow + v * kLanes, tail) : vload(brow + v * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const Vec av = vbroadcast(TransA ? a[p * lda + r] : a[r * lda + p]);
#pragma GCC unroll 4
      for (int v = 0; v < Vecs; ++v) acc[r][v] = vfma(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) {
      float* cp = c + r * ldc + v * kLanes;
      const bool masked = Tail && v == Vecs - 1;
      Vec x = acc[r][v];
      if (accumulate) x = vadd(x, masked ? vload(cp, tail) : vload(cp));
      if (masked) vstore(cp, x, tail);
      else vstore(cp, x);
    }
}

using TileFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool, int);

// Every (rows, vectors, tail) instance for one form of A, at index ((rows-1)·kTileVecs + vecs-1)·2 + tail.
template <bool TransA, size_t... I>
constexpr std::array<TileFn, sizeof...(I)> tile_table(std::index_sequence<I...>) {
  return {{(I % 2 ? &tile<TransA, int(I / 2 / kTileVecs) + 1, int(I / 2 % kTileVecs) + 1, true>
                  : &tile<TransA, int(I / 2 / kTileVecs) + 1, int(I / 2 % kTileVecs) + 1, false>)...}};
}
constexpr size_t kTileKinds = size_t(kTileRows) * kTileVecs * 2;
constexpr std::array<TileFn, kTileKinds> kTilesN = tile_table<false>(std::make_index_sequence<kTileKinds>{});
constexpr std::array<TileFn, kTileKinds> kTilesT = tile_table<true>(std::make_index_sequence<kTileKinds>{});

}  // namespace

void block_gemm(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const std::array<TileFn, kTileKinds>& tiles = trans_a ? kTilesT : kTilesN;
  constexpr int64_t chunk = int64_t(kTileVecs) * kLanes;
  // Column chunks outside, row tiles inside: a chunk of B (k × 64 floats, 16 KiB for k = 64)
  // stays in L1 while every row tile of C reads it.
  for (int64_t j0 = 0; j0 < n; j0 += chunk) {
    const int cols = int(std::min(chunk, n - j0));
    const int vecs = (cols + kLanes - 1) / kLanes, rest = cols % kLanes;
    for (int64_t i0 = 0; i0 < m; i0 += kTileRows) {
      const int rows = int(std::min<int64_t>(kTileRows, m - i0));
      const TileFn fn = tiles[size_t(((rows - 1) * kTileVecs + vecs - 1) * 2 + (rest != 0 ? 1 : 0))];
      fn(k, trans_a ? a + i0 : a + i0 * lda, lda, b + j0, ldb, c + i0 * ldc + j0, ldc, accumulate, rest);
    }
  }
}

const char* block_gemm_isa() {
#if defined(__AVX512F__)
  return "avx512";
#else
  return "avx2";
#endif
}

#else  // no AVX2: the BLAS call

void block_gemm(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  gemm(trans_a, false, m, n, k, 1.f, a, lda, b, ldb, accumulate ? 1.f : 0.f, c, ldc);
}

const char* block_gemm_isa() { return "gemm"; }

#endif

}  // namespace keel::kernels
