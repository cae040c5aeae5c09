#include "keel/kernels/block_gemm.hpp"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "keel/core/bf16.hpp"
#include "keel/core/error.hpp"
#include "keel/core/kept_buffer.hpp"
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

// Eight vectors of eight floats transposed in registers: unpack pairs of rows, then shuffle
// pairs of pairs, then swap 128-bit halves. On return r[i] holds column i.
[[gnu::always_inline]] inline void transpose_8x8_registers(__m256 r[8]) {
  __m256 t[8], u[8];
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
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// The 8×8 block at x (stride ld) transposed into out (stride out_ld).
[[gnu::always_inline]] inline void transpose_8x8(const float* x, int64_t ld, float* out, int64_t out_ld) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(x + i * ld);
  transpose_8x8_registers(r);
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + i * out_ld, r[i]);
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

namespace {

// Cache blocking of packed_gemm (the loops of Goto and van de Geijn, "Anatomy of
// high-performance matrix multiplication", 2008, as BLIS runs them): a kPackK × chunk slab of
// packed B (16 KiB on AVX2) stays in L1 while every row tile of a kPackRows × kPackK block of
// packed A (144 KiB, in L2) passes over it; the packed B of kPackCols columns (512 KiB) is read
// from L2 or L3 once per block of A. 512 columns measured 1.03-1.07x of 1,024 on the Zen 4.
constexpr int64_t kPackK = 256, kPackRows = 24 * kTileRows, kPackCols = 512;
constexpr int64_t kChunk = int64_t(kTileVecs) * kLanes;
// packed_gemm_team packs all of B when it is at most this many floats (32 MiB), and cuts C into
// at least this many items where the shape allows.
constexpr int64_t kPackedTeamMaxB = int64_t(8) << 20, kPackedTeamMinItems = 8;

// Packed operands rounded to bf16 (round_bf16): the portable bf16 gemm (gemm.cpp) rounds each
// block as it is packed, while it is in cache, instead of copying both operands to rounded
// buffers first. B's chunks are rounded after packing (once per call when the team packs B), A
// in the registers that pack it (pack_a_as), before alpha, as alpha·bf16(A)·bf16(B) has it.
void round_packed(float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
}

// Columns [j0 .. j0+cols) of op(B)[p0 .. p0+kc), cols <= kChunk -> kc rows of kChunk floats
// (columns past cols zero).
void pack_b_chunk(bool trans_b, const float* b, int64_t ldb, int64_t p0, int64_t kc, int64_t j0, int64_t cols,
                  float* dst) {
  if (trans_b) {
    // B stored (n, k): the chunk's rows of storage become its columns.
    transpose_block(b + j0 * ldb + p0, cols, kc, ldb, dst, kChunk);
    if (cols < kChunk)
      for (int64_t p = 0; p < kc; ++p) std::fill(dst + p * kChunk + cols, dst + (p + 1) * kChunk, 0.f);
    return;
  }
  const float* src = b + p0 * ldb + j0;
  if (cols == kChunk) {
    for (int64_t p = 0; p < kc; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < kTileVecs; ++v) vstore(dst + p * kChunk + v * kLanes, vload(src + p * ldb + v * kLanes));
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      std::copy(src + p * ldb, src + p * ldb + cols, dst + p * kChunk);
      std::fill(dst + p * kChunk + cols, dst + (p + 1) * kChunk, 0.f);
    }
  }
}

// op(B)[p0 .. p0+kc) × [j0 .. j0+nc) -> chunks of kChunk columns, each kc rows of kChunk floats
// (columns past nc zero).
void pack_b(bool trans_b, const float* b, int64_t ldb, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
            float* out, bool round_bf16) {
  for (int64_t jb = 0; jb < nc; jb += kChunk) {
    float* dst = out + (jb / kChunk) * kc * kChunk;
    pack_b_chunk(trans_b, b, ldb, p0, kc, j0 + jb, std::min(kChunk, nc - jb), dst);
    if (round_bf16) round_packed(dst, kc * kChunk);
  }
}

// The slack packed A needs past its last row tile: pack_a's 8-float stores overrun a 6-float step.
constexpr int64_t kPackASlack = 8;

// Eight floats rounded to bf16 in registers, float_to_bf16's rule (nearest, ties to even; a NaN
// stays a NaN with its quiet bit set), the values widened back to fp32.
[[gnu::always_inline]] inline __m256 round_to_bf16_8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x), high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(lowest_kept, _mm256_set1_epi32(0x7fff))), high);
  const __m256i quiet = _mm256_and_si256(_mm256_or_si256(bits, _mm256_set1_epi32(0x00400000)), high);
  return _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// alpha·op(A)[i0 .. i0+mc) × [p0 .. p0+kc) -> row tiles of kTileRows, each kc steps of kTileRows
// floats (rows past mc zero): the transposed-A form the tiles read with lda = kTileRows. Whole
// tiles move 8 floats a store, each store's last two floats overwritten by the next step's (a
// transposed A's last step stores 6).
// Round: alpha·bf16(A), rounded in the registers that move it.
template <bool Round>
void pack_a_as(bool trans_a, const float* a, int64_t lda, int64_t m, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
               float alpha, float* out) {
  static_assert(kTileRows == 6, "pack_a's 8-float stores assume 6-row tiles");
  const __m256 scale = _mm256_set1_ps(alpha);
  auto load8 = [&](const float* p) {
    const __m256 x = _mm256_loadu_ps(p);
    return _mm256_mul_ps(scale, Round ? round_to_bf16_8(x) : x);
  };
  auto value = [&](float x) { return alpha * (Round ? bf16_to_float(float_to_bf16(x)) : x); };
  if (trans_a) {
    // A stored (k, m): a step's rows of the block are contiguous. Whole tiles (8 floats readable)
    // are packed a step at a time across the block, so each cache line of A is read once: tile
    // by tile, a row stride of a multiple of 4 KiB (a weight gradient's dyᵀ with 1,024 outputs)
    // put all kc lines of a tile in a few L1 sets and read every line about three times.
    const int64_t whole = std::min(mc, m - i0 - 2) / kTileRows;  // tiles with 8 floats to read
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = a + (p0 + p) * lda + i0;
      // An 8-float store overruns into the next step's slot, which that step overwrites; the
      // last step's would land on the next tile's first, so it stores 6.
      if (p + 1 < kc) {
        for (int64_t t = 0; t < whole; ++t)
          _mm256_storeu_ps(out + t * kc * kTileRows + p * kTileRows, load8(src + t * kTileRows));
      } else {
        for (int64_t t = 0; t < whole; ++t)
          for (int64_t r = 0; r < kTileRows; ++r)
            out[t * kc * kTileRows + p * kTileRows + r] = value(src[t * kTileRows + r]);
      }
    }
    for (int64_t ib = whole * kTileRows; ib < mc; ib += kTileRows) {
      const int64_t rows = std::min<int64_t>(kTileRows, mc - ib);
      float* dst = out + (ib / kTileRows) * kc * kTileRows;
      const float* src = a + p0 * lda + i0 + ib;
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = 0; r < kTileRows; ++r) dst[p * kTileRows + r] = r < rows ? value(src[p * lda + r]) : 0.f;
    }
    return;
  }
  for (int64_t ib = 0; ib < mc; ib += kTileRows) {
    const int64_t rows = std::min<int64_t>(kTileRows, mc - ib);
    float* dst = out + (ib / kTileRows) * kc * kTileRows;
    // A stored (m, k): 8 steps of the 6 rows at a time through an 8×8 transpose (two zero rows).
    const float* src = a + (i0 + ib) * lda + p0;
    int64_t p = 0;
    if (rows == kTileRows) {
      for (; p + 8 <= kc; p += 8) {
        __m256 r[8];
        for (int i = 0; i < kTileRows; ++i) r[i] = load8(src + i * lda + p);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose_8x8_registers(r);
        for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + (p + q) * kTileRows, r[q]);
      }
    }
    for (; p < kc; ++p)
      for (int64_t r = 0; r < kTileRows; ++r) dst[p * kTileRows + r] = r < rows ? value(src[r * lda + p]) : 0.f;
  }
}

void pack_a(bool trans_a, const float* a, int64_t lda, int64_t m, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
            float alpha, float* out, bool round_bf16) {
  if (round_bf16) pack_a_as<true>(trans_a, a, lda, m, i0, mc, p0, kc, alpha, out);
  else pack_a_as<false>(trans_a, a, lda, m, i0, mc, p0, kc, alpha, out);
}

// Every tile of an mc × ncols block of C, from packed A (mc rows, kc steps) and the packed B
// slabs of those columns (kc rows each); accumulate adds to C instead of overwriting it.
void multiply_packed(const float* ap, int64_t mc, int64_t kc, const float* bp, int64_t ncols, float* c, int64_t ldc,
                     bool accumulate) {
  for (int64_t jb = 0; jb < ncols; jb += kChunk) {
    const int cols = int(std::min(kChunk, ncols - jb));
    const int vecs = (cols + kLanes - 1) / kLanes, rest = cols % kLanes;
    const float* bchunk = bp + (jb / kChunk) * kc * kChunk;
    for (int64_t ib = 0; ib < mc; ib += kTileRows) {
      const int rows = int(std::min<int64_t>(kTileRows, mc - ib));
      const TileFn fn = kTilesT[size_t(((rows - 1) * kTileVecs + vecs - 1) * 2 + (rest != 0 ? 1 : 0))];
      fn(kc, ap + (ib / kTileRows) * kc * kTileRows, kTileRows, bchunk, kChunk, c + ib * ldc + jb, ldc, accumulate,
         rest);
    }
  }
}

float* packed_a_buffer() {
  thread_local KeptBuffer<float> packed_a;
  return packed_a.get(size_t(kPackRows * kPackK + kPackASlack));
}

}  // namespace

void packed_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool round_bf16) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || (beta != 0.f && beta != 1.f)) gemm_scale_c(m, n, beta, c, ldc);
  if (k <= 0) return;
  float* ap = packed_a_buffer();
  thread_local KeptBuffer<float> packed_b;
  float* bp = packed_b.get(size_t(kPackK * ((kPackCols + kChunk - 1) / kChunk * kChunk)));
  for (int64_t j0 = 0; j0 < n; j0 += kPackCols) {
    const int64_t nc = std::min(kPackCols, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += kPackK) {
      const int64_t kc = std::min(kPackK, k - p0);
      pack_b(trans_b, b, ldb, p0, kc, j0, nc, bp, round_bf16);
      for (int64_t i0 = 0; i0 < m; i0 += kPackRows) {
        const int64_t mc = std::min(kPackRows, m - i0);
        pack_a(trans_a, a, lda, m, i0, mc, p0, kc, alpha, ap, round_bf16);
        multiply_packed(ap, mc, kc, bp, nc, c + i0 * ldc + j0, ldc, p0 > 0 || beta != 0.f);
      }
    }
  }
}

bool packed_gemm_team(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool round_bf16) {
  const int64_t n_padded = (n + kChunk - 1) / kChunk * kChunk;
  if (m <= 0 || n <= 0 || k <= 0 || k * n_padded > kPackedTeamMaxB) return false;
  // All of op(B), packed once by the team into the calling thread's buffer: for each block of
  // kPackK steps (at p0·n_padded), its slabs side by side.
  thread_local KeptBuffer<float> whole_b;
  float* bp = whole_b.get(size_t(k * n_padded));
  const int64_t k_blocks = (k + kPackK - 1) / kPackK, chunks = n_padded / kChunk;
  // Items of C: kPackRows rows by `group` columns, narrowed until there are enough to balance a
  // few threads. A function of the shape alone, like gemm's panels.
  const int64_t row_blocks = (m + kPackRows - 1) / kPackRows;
  int64_t group = (kPackCols + kChunk - 1) / kChunk * kChunk;
  while (row_blocks * ((n + group - 1) / group) < kPackedTeamMinItems && group / 2 >= 4 * kChunk) group /= 2;
  const int64_t col_groups = (n + group - 1) / group, items = row_blocks * col_groups;
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < k_blocks * chunks; ++t) {
      const int64_t p0 = (t / chunks) * kPackK, j0 = (t % chunks) * kChunk;
      const int64_t kc = std::min(kPackK, k - p0);
      pack_b(trans_b, b, ldb, p0, kc, j0, std::min(kChunk, n - j0), bp + p0 * n_padded + (j0 / kChunk) * kc * kChunk,
             round_bf16);
    }  // the for's barrier: B is whole before any item reads it
    float* ap = packed_a_buffer();
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t i0 = (item / col_groups) * kPackRows, j0 = (item % col_groups) * group;
      const int64_t mc = std::min(kPackRows, m - i0), ncols = std::min(group, n - j0);
      float* citem = c + i0 * ldc + j0;
      if (beta != 0.f && beta != 1.f) gemm_scale_c(mc, ncols, beta, citem, ldc);
      for (int64_t p0 = 0; p0 < k; p0 += kPackK) {
        const int64_t kc = std::min(kPackK, k - p0);
        pack_a(trans_a, a, lda, m, i0, mc, p0, kc, alpha, ap, round_bf16);
        multiply_packed(ap, mc, kc, bp + p0 * n_padded + (j0 / kChunk) * kc * kChunk, ncols, citem, ldc,
                        p0 > 0 || beta != 0.f);
      }
    }
  }
  return true;
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

void packed_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool round_bf16) {
  KEEL_CHECK(!round_bf16);  // gemm_bf16 rounds into buffers where the build has no microkernel
  gemm_reference(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool packed_gemm_team(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float,
                      float*, int64_t, bool) {
  return false;
}

const char* block_gemm_isa() { return "gemm"; }

#endif

}  // namespace keel::kernels
