#include "keel/kernels/block_gemm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "gradient_check.hpp"
#include "keel/kernels/gemm.hpp"

namespace keel::kernels {
namespace {

using testing::random_vector;

// The microkernel against the double-accumulating reference over every tile shape it has: rows
// 1..6 and ragged (m = 1, 5, 6, 7, 13, 64), column counts below, at and across one vector and one
// chunk (1, 7, 16, 17, 33, 64, 80, 130), k of 0, 1, 3 and a head's 64; A plain and transposed;
// C overwritten and accumulated; every stride padded, so a read or write past a row shows.
TEST(BlockGemmKernel, MatchesReferenceOverTileShapes) {
  const int64_t ms[] = {1, 5, 6, 7, 13, 64}, ns[] = {1, 7, 16, 17, 33, 64, 80, 130}, ks[] = {0, 1, 3, 64};
  int checked = 0;
  for (const bool trans_a : {false, true})
    for (const bool accumulate : {false, true})
      for (const int64_t m : ms)
        for (const int64_t n : ns)
          for (const int64_t k : ks) {
            const int64_t lda = (trans_a ? m : k) + 5, ldb = n + 3, ldc = n + 7;
            const auto a = random_vector(size_t((trans_a ? k : m) * lda), uint32_t(m * 7 + k));
            const auto b = random_vector(size_t(k * ldb), uint32_t(n * 11 + k));
            auto c = random_vector(size_t(m * ldc), uint32_t(m + n));
            if (!accumulate)  // an overwritten C is never read
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) c[size_t(i * ldc + j)] = std::numeric_limits<float>::quiet_NaN();
            auto c_ref = c;
            block_gemm(trans_a, m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, accumulate);
            gemm_reference(trans_a, false, m, n, k, 1.f, a.data(), lda, b.data(), ldb, accumulate ? 1.f : 0.f,
                           c_ref.data(), ldc);
            const std::string tag = std::string(block_gemm_isa()) + " ta=" + std::to_string(trans_a) +
                                    " acc=" + std::to_string(accumulate) + " m=" + std::to_string(m) +
                                    " n=" + std::to_string(n) + " k=" + std::to_string(k);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j)
                ASSERT_NEAR(c[size_t(i * ldc + j)], c_ref[size_t(i * ldc + j)], 2e-6 * (1 + double(k)))
                    << tag << " at " << i << "," << j;
              for (int64_t j = n; j < ldc; ++j)  // the padding of each row is left alone
                ASSERT_EQ(c[size_t(i * ldc + j)], c_ref[size_t(i * ldc + j)]) << tag << " pad " << i << "," << j;
            }
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 2 * 6 * 8 * 4);
}

// The result of a product does not depend on where C or B sit: the same block computed into two
// buffers at different alignments is bit-identical (attention's gradients are deterministic).
TEST(BlockGemmKernel, BitIdenticalAcrossAlignments) {
  const int64_t m = 64, n = 64, k = 64;
  const auto a = random_vector(size_t(m * k), 5);
  const auto b = random_vector(size_t(k * n + 16), 6);
  std::vector<float> c1(size_t(m * n)), c2(size_t(m * n + 3));
  std::vector<float> b_shifted(b.begin(), b.begin() + k * n);
  b_shifted.insert(b_shifted.begin(), 1.f);  // the same B one float later
  block_gemm(false, m, n, k, a.data(), k, b.data(), n, c1.data(), n, false);
  block_gemm(false, m, n, k, a.data(), k, b_shifted.data() + 1, n, c2.data() + 3, n, false);
  for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(c1[size_t(i)], c2[size_t(i + 3)]) << i;
}

// The transpose helper that packs Kᵀ and Vᵀ: whole 8×8 blocks, ragged edges in both directions
// and strides wider than the rows, element by element against the definition.
TEST(BlockGemmKernel, TransposeMatchesDefinition) {
  const int64_t shapes[][2] = {{64, 64}, {8, 8}, {13, 24}, {70, 17}, {1, 9}, {9, 1}, {3, 5}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], cols = shape[1], ld = cols + 4, out_ld = rows + 6;
    const auto x = random_vector(size_t(rows * ld), uint32_t(rows * 100 + cols));
    std::vector<float> out(size_t(cols * out_ld), -7.f);
    transpose_block(x.data(), rows, cols, ld, out.data(), out_ld);
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(out[size_t(c * out_ld + r)], x[size_t(r * ld + c)]) << rows << "x" << cols << " at " << r << "," << c;
      for (int64_t r = rows; r < out_ld; ++r) ASSERT_EQ(out[size_t(c * out_ld + r)], -7.f) << "padding written";
    }
  }
}

}  // namespace
}  // namespace keel::kernels
