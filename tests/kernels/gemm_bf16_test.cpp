// bf16 mixed-precision gemm: the native (oneDNN AVX512-BF16) and the portable path against a
// double-accumulated reference on bf16-rounded operands, and against the fp32 gemm.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "gemm_test_util.hpp"
#include "keel/core/bf16.hpp"
#include "keel/kernels/block_gemm.hpp"
#include "keel/kernels/gemm.hpp"
#include "keel/kernels/precision.hpp"

namespace keel::kernels {
namespace {

using testing::GemmCase;
using testing::padded_operands;
using testing::add_bias_to_rows;
using testing::random_vector;

// All four transpositions, odd sizes, k = 1, a long k, padded leading dimensions.
const GemmCase kCases[] = {
    {false, false, 17, 33, 9, 1.f, 0.f},   {false, true, 31, 5, 64, 0.5f, 1.f},  {true, false, 7, 130, 21, 1.f, -0.5f},
    {true, true, 65, 3, 1, 2.f, 0.25f},    {false, true, 1, 1, 1, 1.f, 0.f},     {true, false, 96, 80, 200, 1.f, 1.f},
    {false, false, 3, 257, 1000, 1.f, 0.f}, {true, true, 40, 41, 129, 1.f, 1.f},
};

std::vector<float> rounded(std::vector<float> x) {
  for (float& v : x) v = bf16_to_float(float_to_bf16(v));
  return x;
}

// Each test that forces a path restores the one chosen before it (the default, or KEEL_BF16_GEMM's).
using PathGuard = Bf16GemmChoiceScope;

TEST(GemmBf16, NativeAndPortableMatchReferenceOnRoundedOperands) {
  PathGuard guard;
  RecordProperty("native_available", bf16_gemm_native_available() ? "yes" : "no");
  for (const GemmCase& cs : kCases) {
    const auto [lda, ldb, ldc, a, b, c0] = padded_operands(cs, 3, 11);
    auto ref = c0, fp32 = c0, portable = c0, native = c0;
    const auto ar = rounded(a), br = rounded(b);
    gemm_reference(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, ar.data(), lda, br.data(), ldb, cs.beta, ref.data(), ldc);
    gemm_reference(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, fp32.data(), ldc);
    force_bf16_gemm_path(Bf16GemmChoice::Portable);
    ASSERT_EQ(bf16_gemm_path(), Bf16GemmPath::Portable);
    gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, portable.data(), ldc);
    force_bf16_gemm_path(Bf16GemmChoice::Native);
    ASSERT_EQ(bf16_gemm_path(), bf16_gemm_native_available() ? Bf16GemmPath::Native : Bf16GemmPath::Portable);
    gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, native.data(), ldc);
    // Products of bf16 values are exact in fp32, so the only error left is fp32 summation:
    // |err| <= k·2⁻²⁴·Σ|a·b| with |a|, |b| <= 1, bounded here by 4e-7·(k + 1)·|alpha| (+ beta·C).
    const double tol = 4e-7 * double(cs.k + 1) * std::max(1.f, std::fabs(cs.alpha)) + 1e-7;
    double bf16_vs_fp32 = 0;
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t j = 0; j < cs.n; ++j) {
        const size_t idx = size_t(i * ldc + j);
        ASSERT_NEAR(portable[idx], ref[idx], tol) << "portable ta=" << cs.ta << " tb=" << cs.tb << " k=" << cs.k;
        ASSERT_NEAR(native[idx], ref[idx], tol) << "native ta=" << cs.ta << " tb=" << cs.tb << " k=" << cs.k;
        bf16_vs_fp32 = std::max(bf16_vs_fp32, std::fabs(double(native[idx]) - fp32[idx]));
      }
    // The operands really were rounded: 8-bit significands move a sum of k >= 9 products by
    // ~1e-3, far above the fp32 summation error checked above.
    if (cs.k >= 9) {
      EXPECT_GT(bf16_vs_fp32, 20 * tol) << "k=" << cs.k;
    }
    for (int64_t i = 0; i < cs.m; ++i) {
      EXPECT_EQ(native[size_t(i * ldc + cs.n)], c0[size_t(i * ldc + cs.n)]);  // padding untouched
      EXPECT_EQ(portable[size_t(i * ldc + cs.n)], c0[size_t(i * ldc + cs.n)]);
    }
  }
}

TEST(GemmBf16, PortableRunsTheFp32GemmOnRoundedOperandsOrRoundsAsItPacks) {
  // The portable path multiplies the rounded operands with the fp32 gemm (its Auto kernels) when
  // each operand is bf16 values already (used as it is) or small (rounded into a copy); when an
  // operand that is not would need a large copy, it rounds each block of A and B as keel's packed
  // kernel packs it instead. Either way: the bits of that fp32 gemm on rounded copies of the
  // operands, whether the team packs B once or (B above 32 MiB) each panel packs its own. Builds
  // without the microkernel round into buffers and are checked by the test above.
  if (std::string(block_gemm_isa()) == "gemm") {
    RecordProperty("microkernel", "none: portable path rounds into buffers");
    return;
  }
  PathGuard guard;
  struct KernelGuard {
    ~KernelGuard() { set_gemm_kernel(GemmKernel::Auto); }
  } kernel_guard;
  struct Case {
    GemmCase shape;
    bool a_rounded;  // A given as bf16 values already
    bool packed;     // the route the portable path takes: the packed kernel rounding as it packs
  };
  std::vector<Case> cases;
  for (const GemmCase& cs : kCases) cases.push_back({cs, false, false});  // every operand small
  // Large: above the 16 Mi floats the path copies at most.
  cases.push_back({{false, false, 8, 270000, 64, 1.f, 0.f}, false, true});  // a large B: packed B of 66 MiB, panels
  cases.push_back({{true, true, 300, 200, 700, 0.5f, 1.f}, false, false});
  cases.push_back({{false, true, 8, 270000, 64, 1.f, 1.f}, false, true});    // a large B, transposed
  cases.push_back({{false, true, 270000, 16, 64, 1.f, 0.f}, true, false});   // a large A of bf16 values
  for (const Case& cc : cases) {
    const GemmCase& cs = cc.shape;
    SCOPED_TRACE("ta=" + std::to_string(cs.ta) + " tb=" + std::to_string(cs.tb) + " m=" + std::to_string(cs.m) +
                 " n=" + std::to_string(cs.n) + " k=" + std::to_string(cs.k));
    auto [lda, ldb, ldc, a, b, c0] = padded_operands(cs, 5, 13);
    // Exact ties between two bf16 values, which round to the even one (down, then up).
    for (size_t i = 0; i < a.size(); i += 7) a[i] = (i % 2 ? 1.0f : -1.0f) * (1.0f + (i % 3 ? 1.0f : 3.0f) / 256);
    for (size_t i = 0; i < b.size(); i += 5) b[i] = 0.5f + (i % 3 ? 1.0f : 3.0f) / 512;
    if (cc.a_rounded) a = rounded(a);
    auto portable = c0, expected = c0;
    force_bf16_gemm_path(Bf16GemmChoice::Portable);
    gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, portable.data(), ldc);
    force_bf16_gemm_path(Bf16GemmChoice::Native);
    set_gemm_kernel(cc.packed ? GemmKernel::Packed : GemmKernel::Auto);
    const auto ar = rounded(a), br = rounded(b);
    gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, ar.data(), lda, br.data(), ldb, cs.beta, expected.data(), ldc);
    set_gemm_kernel(GemmKernel::Auto);
    ASSERT_EQ(0, std::memcmp(portable.data(), expected.data(), portable.size() * sizeof(float)));
    EXPECT_NE(b, br);  // rounding did something to the operands
  }
}

TEST(GemmBf16, PortableRoundsSpecialValuesAsFloatToBf16Does) {
  // The packed kernel rounds A in registers (8 values at a time) and at the edges one by one: NaNs
  // keep their sign and top payload with the quiet bit set, infinities stay, the largest finite
  // values round to infinity, exact ties go to the even neighbour. Each row of A holds one such
  // value among zeros and B is all ones, so C's row is bf16(value) exactly (x + 0 = x, NaN
  // payloads pass through); 13 rows give whole tiles and a partial one, k = 8 the in-register path.
  if (std::string(block_gemm_isa()) == "gemm") {
    RecordProperty("microkernel", "none: portable path rounds into buffers");
    return;
  }
  PathGuard guard;
  force_bf16_gemm_path(Bf16GemmChoice::Portable);
  const uint32_t special[] = {0x7f800001u, 0xffc12345u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu,
                              0x3f808000u, 0x3f818000u, 0xbf808000u, 0x40490fdbu, 0x3f7fffffu, 0x00800000u,
                              0x7fbfffffu};
  const int64_t m = 13, k = 8, n = 5;
  for (bool ta : {false, true}) {
    std::vector<float> a(size_t(m * k), 0.f), b(size_t(k * n), 1.f), c(size_t(m * n), 0.f);
    for (int64_t i = 0; i < m; ++i) {
      const float v = std::bit_cast<float>(special[i]);
      const int64_t p = i % k;
      (ta ? a[size_t(p * m + i)] : a[size_t(i * k + p)]) = v;
    }
    gemm_bf16(ta, false, m, n, k, 1.f, a.data(), ta ? m : k, b.data(), n, 0.f, c.data(), n);
    for (int64_t i = 0; i < m; ++i) {
      const uint32_t want = uint32_t(float_to_bf16(std::bit_cast<float>(special[i]))) << 16;
      for (int64_t j = 0; j < n; ++j)
        EXPECT_EQ(std::bit_cast<uint32_t>(c[size_t(i * n + j)]), want)
            << "ta=" << ta << " row " << i << " value 0x" << std::hex << special[i];
    }
  }
}

TEST(GemmBf16, WordsOfBGiveTheBitsOfGemmBf16OnBothPaths) {
  // The loss rounds the LM head's weight to bf16 words once and hands them to every chunk's
  // products: the same bits as gemm_bf16 rounding the fp32 weight itself, natively or not.
  PathGuard guard;
  for (bool portable : {false, true}) {
    force_bf16_gemm_path(portable ? Bf16GemmChoice::Portable : Bf16GemmChoice::Native);
    for (const GemmCase& cs : kCases) {
      SCOPED_TRACE(std::string(portable ? "portable" : "default path") + " ta=" + std::to_string(cs.ta) +
                   " tb=" + std::to_string(cs.tb) + " k=" + std::to_string(cs.k));
      const auto [lda, ldb, ldc, a, b, c0] = padded_operands(cs, 3, 29);
      const int64_t b_rows = cs.tb ? cs.n : cs.k, b_cols = cs.tb ? cs.k : cs.n;
      std::vector<uint16_t> words(size_t(b_rows * b_cols));
      bf16_words(b.data(), b_rows, b_cols, ldb, words.data());
      for (int64_t r = 0; r < b_rows; ++r)
        for (int64_t j = 0; j < b_cols; ++j)
          ASSERT_EQ(words[size_t(r * b_cols + j)], float_to_bf16(b[size_t(r * ldb + j)]));
      auto direct = c0, via_words = c0;
      gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, direct.data(), ldc);
      gemm_bf16_words_b(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, words.data(), b_cols, cs.beta,
                        via_words.data(), ldc);
      ASSERT_EQ(0, std::memcmp(direct.data(), via_words.data(), direct.size() * sizeof(float)));
    }
  }
}

// A SharedBf16Operand rounds an operand once for every product that names it: the bits of
// gemm_bf16 rounding it itself, in either operand's place and any transposition, on both paths
// (native: bf16 words; portable: a rounded fp32 copy, or the operand itself where it holds bf16
// values); what is rounded is really what the products read (an operand changed against the
// promise still multiplies as it was); and only a live object, of exactly that stored matrix, is
// found.
TEST(GemmBf16, SharedOperandGivesTheBitsOfRoundingItEachTime) {
  PathGuard guard;
  PrecisionScope scope(Precision::Bf16);
  for (bool portable : {false, true}) {
    if (!portable && !bf16_gemm_native_available()) continue;
    force_bf16_gemm_path(portable ? Bf16GemmChoice::Portable : Bf16GemmChoice::Native);
    for (const GemmCase& cs : kCases) {
      SCOPED_TRACE(std::string(portable ? "portable" : "native") + " ta=" + std::to_string(cs.ta) +
                   " tb=" + std::to_string(cs.tb) + " m=" + std::to_string(cs.m) + " k=" + std::to_string(cs.k));
      auto [lda, ldb, ldc, a, b, c0] = padded_operands(cs, 3, 61);
      const int64_t a_rows = cs.ta ? cs.k : cs.m, a_cols = cs.ta ? cs.m : cs.k;
      const int64_t b_rows = cs.tb ? cs.n : cs.k, b_cols = cs.tb ? cs.k : cs.n;
      auto direct = c0;
      gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, direct.data(), ldc);
      {
        const SharedBf16Operand shared_a(a.data(), a_rows, a_cols, lda);
        ASSERT_TRUE(shared_a.active());
        auto got = c0;
        gemm_mixed(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, got.data(), ldc);
        ASSERT_EQ(0, std::memcmp(direct.data(), got.data(), got.size() * sizeof(float))) << "A shared";
        {
          const SharedBf16Operand shared_b(b.data(), b_rows, b_cols, ldb);
          got = c0;
          gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, got.data(), ldc);
          ASSERT_EQ(0, std::memcmp(direct.data(), got.data(), got.size() * sizeof(float))) << "A and B shared";
          // What was rounded, not the fp32 values, is read: A and B changed behind the objects' backs.
          const auto a_was = a, b_was = b;
          for (float& v : a) v = -3.f * v;
          for (float& v : b) v = 0.5f * v + 1.f;
          got = c0;
          gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, got.data(), ldc);
          ASSERT_EQ(0, std::memcmp(direct.data(), got.data(), got.size() * sizeof(float))) << "not what was rounded";
          a = a_was;
          b = b_was;
        }
        // The words are the native path's alone; the inner object is gone.
        EXPECT_EQ(shared_bf16_words(a.data(), a_rows, a_cols, lda) != nullptr, !portable);
        EXPECT_EQ(shared_bf16_words(b.data(), b_rows, b_cols, ldb), nullptr);
        // Only that stored matrix: another stride, shape or start is not it.
        EXPECT_EQ(shared_bf16_words(a.data(), a_rows, a_cols, lda + 1), nullptr);
        EXPECT_EQ(shared_bf16_words(a.data(), a_rows - 1, a_cols, lda), nullptr);
        EXPECT_EQ(shared_bf16_words(a.data() + 1, a_rows, a_cols, lda), nullptr);
      }
      EXPECT_EQ(shared_bf16_words(a.data(), a_rows, a_cols, lda), nullptr);
    }
    // Portable, an operand of bf16 values is read as it is: stated by the caller or found so.
    if (portable) {
      const GemmCase cs{false, true, 40, 30, 50, 1.f, 0.f};
      auto [lda, ldb, ldc, a, b, c0] = padded_operands(cs, 0, 67);
      a = rounded(a);
      auto direct = c0, got = c0;
      gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, direct.data(), ldc);
      const SharedBf16Operand found(a.data(), cs.m, cs.k, lda), stated(b.data(), cs.n, cs.k, ldb, true);
      EXPECT_TRUE(found.active());
      gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, got.data(), ldc);
      // B was stated to hold bf16 values and does not: it is read as it is, unrounded, so the
      // product differs from rounding it (the caller's promise is the contract).
      EXPECT_NE(got, direct);
    }
  }
  // Not under fp32 matmuls, nor for an empty or absent operand.
  force_bf16_gemm_path(Bf16GemmChoice::Native);
  const auto x = random_vector(64, 5);
  EXPECT_FALSE(SharedBf16Operand(nullptr, 8, 8).active());
  EXPECT_FALSE(SharedBf16Operand(x.data(), 0, 8).active());
  PrecisionScope fp32(Precision::Fp32);
  EXPECT_FALSE(SharedBf16Operand(x.data(), 8, 8).active());
}

TEST(GemmBf16, MixedFollowsTheThreadPrecision) {
  const int64_t m = 13, n = 29, k = 37;
  const auto a = random_vector(size_t(m * k), 21), b = random_vector(size_t(k * n), 22);
  std::vector<float> fp32(size_t(m * n)), bf16(size_t(m * n)), mixed(size_t(m * n));
  gemm(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, fp32.data(), n);
  gemm_bf16(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, bf16.data(), n);
  ASSERT_EQ(matmul_precision(), Precision::Fp32);
  gemm_mixed(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, mixed.data(), n);
  EXPECT_EQ(mixed, fp32);  // fp32 is bit-identical to the plain gemm
  {
    PrecisionScope scope(Precision::Bf16);
    ASSERT_EQ(matmul_precision(), Precision::Bf16);
    gemm_mixed(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, mixed.data(), n);
    EXPECT_EQ(mixed, bf16);
  }
  EXPECT_EQ(matmul_precision(), Precision::Fp32);  // the scope restored it
  EXPECT_NE(fp32, bf16);
}

// A bias through gemm_bf16 (and gemm_mixed under bf16) is added in fp32 to the finished product
// of the rounded operands: the bits of gemm_bf16 without it, then the bias added, on both paths.
TEST(GemmBf16, BiasIsAddedInFp32AfterTheProductOnBothPaths) {
  PathGuard guard;
  for (bool portable : {false, true}) {
    if (!portable && !bf16_gemm_native_available()) continue;
    force_bf16_gemm_path(portable ? Bf16GemmChoice::Portable : Bf16GemmChoice::Native);
    SCOPED_TRACE(portable ? "portable" : "native");
    for (const GemmCase& cs : {GemmCase{false, true, 300, 700, 64, 1.f, 0.f}, GemmCase{false, false, 17, 33, 9, 1.f, 1.f},
                               GemmCase{false, false, 1100, 40, 130, 0.5f, 0.f}}) {
      auto [lda, ldb, ldc, a, b, c] = padded_operands(cs, 2, 51);
      const auto bias = random_vector(size_t(cs.n), 54);
      auto expected = c, got = c, mixed = c;
      gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, expected.data(), ldc);
      add_bias_to_rows(expected, cs.m, cs.n, ldc, bias);
      gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, got.data(), ldc,
                bias.data());
      ASSERT_EQ(got, expected) << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k;
      PrecisionScope scope(Precision::Bf16);
      gemm_mixed(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, mixed.data(), ldc,
                 bias.data());
      ASSERT_EQ(mixed, expected);
    }
  }
}

TEST(Precision, RoundToBf16IsNearestEvenAndIdempotent) {
  // 1 + 2⁻⁸ is the tie between 1 and 1 + 2⁻⁷: ties go to the even significand (1).
  std::vector<float> x = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-9f, -3.14159265f, 0.f, 65504.f};
  round_to_bf16(x.data(), int64_t(x.size()));
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], 1.0f + 0x1p-6f);  // tie between 1+2⁻⁷ (odd) and 1+2⁻⁶ (even)
  EXPECT_EQ(x[2], 1.0f);
  EXPECT_EQ(x[3], -3.140625f);
  EXPECT_EQ(x[4], 0.f);
  EXPECT_EQ(x[5], 65536.f);
  auto again = x;
  round_to_bf16(again.data(), int64_t(again.size()));
  EXPECT_EQ(again, x);
  std::vector<float> y = {1.0f + 0x1p-9f};
  round_activation(y.data(), 1);  // fp32 thread precision: untouched
  EXPECT_EQ(y[0], 1.0f + 0x1p-9f);
  PrecisionScope scope(Precision::Bf16);
  round_activation(y.data(), 1);
  EXPECT_EQ(y[0], 1.0f);
}

TEST(Precision, NamesRoundTrip) {
  EXPECT_EQ(parse_precision("fp32"), Precision::Fp32);
  EXPECT_EQ(parse_precision("bf16"), Precision::Bf16);
  EXPECT_FALSE(parse_precision("fp16").has_value());
  EXPECT_EQ(precision_name(Precision::Bf16), "bf16");
  EXPECT_EQ(precision_name(Precision::Fp32), "fp32");
}

}  // namespace
}  // namespace keel::kernels

namespace keel::kernels {
namespace {

// A bf16 run whose products do not run in bf16 (no AVX512-BF16, no AMX to make it pay, or forced
// portable) is told that it buys no speed.
TEST(GemmBf16, EmulationIsAnnouncedOnlyWhenEmulating) {
  PathGuard guard;
  force_bf16_gemm_path(Bf16GemmChoice::Portable);
  const std::string forced = bf16_emulation_note();
  EXPECT_NE(forced.find("emulated"), std::string::npos) << forced;
  force_bf16_gemm_path(Bf16GemmChoice::Native);
  if (bf16_gemm_native_available()) {
    EXPECT_EQ(bf16_emulation_note(), "");
    EXPECT_NE(forced.find("KEEL_BF16_GEMM=portable"), std::string::npos);
  } else {
    // "this CPU has no AVX512-BF16", or oneDNN capped below it by ONEDNN_MAX_CPU_ISA.
    const std::string note = bf16_emulation_note();
    EXPECT_TRUE(note.find("no AVX512-BF16") != std::string::npos ||
                note.find("ONEDNN_MAX_CPU_ISA caps oneDNN below AVX512-BF16") != std::string::npos)
        << note;
  }
  // The default says nothing exactly where it takes the native path.
  force_bf16_gemm_path(Bf16GemmChoice::Auto);
  EXPECT_EQ(bf16_emulation_note().empty(), bf16_gemm_path() == Bf16GemmPath::Native);
}

// Every CPU a run can meet, and what each choice makes of it.
TEST(GemmBf16, NativePathOnlyWhereItPays) {
  struct Row {
    const char* cpu;
    Bf16CpuTraits traits;
    Bf16GemmPath auto_path, native_path;
    const char* note_says;  // what the Auto note names (empty: no note)
  };
  const Row rows[] = {
      {"Intel with AMX", {true, true, false, true}, Bf16GemmPath::Native, Bf16GemmPath::Native, ""},
      {"AMD Zen 4/5", {true, false, true, true}, Bf16GemmPath::Native, Bf16GemmPath::Native, ""},
      {"Intel AVX512-BF16 without AMX", {true, false, false, true}, Bf16GemmPath::Portable, Bf16GemmPath::Native,
       "no AMX"},
      {"AVX512-BF16 capped by ONEDNN_MAX_CPU_ISA", {false, false, false, true}, Bf16GemmPath::Portable,
       Bf16GemmPath::Portable, "ONEDNN_MAX_CPU_ISA"},
      {"AMD without AVX512-BF16 (Zen 3)", {false, false, true, false}, Bf16GemmPath::Portable, Bf16GemmPath::Portable,
       "no AVX512-BF16"},
      {"Intel AVX2 only", {false, false, false, false}, Bf16GemmPath::Portable, Bf16GemmPath::Portable,
       "no AVX512-BF16"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.cpu);
    EXPECT_EQ(bf16_native_pays(row.traits), row.auto_path == Bf16GemmPath::Native);
    EXPECT_EQ(choose_bf16_gemm_path(Bf16GemmChoice::Auto, row.traits), row.auto_path);
    EXPECT_EQ(choose_bf16_gemm_path(Bf16GemmChoice::Native, row.traits), row.native_path);
    EXPECT_EQ(choose_bf16_gemm_path(Bf16GemmChoice::Portable, row.traits), Bf16GemmPath::Portable);
    const std::string note = bf16_emulation_note(Bf16GemmChoice::Auto, row.traits);
    if (*row.note_says == '\0') {
      EXPECT_EQ(note, "");
    } else {
      EXPECT_NE(note.find(row.note_says), std::string::npos) << note;
      EXPECT_NE(note.find("emulated"), std::string::npos) << note;
    }
    // Forcing native where it is available silences the note, and elsewhere says it is ignored;
    // forcing portable always names the variable.
    const std::string forced_native = bf16_emulation_note(Bf16GemmChoice::Native, row.traits);
    EXPECT_EQ(forced_native.empty(), row.traits.native_available);
    if (!row.traits.native_available) {
      EXPECT_NE(forced_native.find("KEEL_BF16_GEMM=native is ignored"), std::string::npos) << forced_native;
    }
    if (row.traits.native_available) {
      EXPECT_NE(bf16_emulation_note(Bf16GemmChoice::Portable, row.traits).find("KEEL_BF16_GEMM=portable"),
                std::string::npos);
    }
  }
  // This machine's own traits agree with what gemm_bf16 does by default.
  PathGuard guard;
  force_bf16_gemm_path(Bf16GemmChoice::Auto);
  EXPECT_EQ(bf16_gemm_path(), choose_bf16_gemm_path(Bf16GemmChoice::Auto, bf16_cpu_traits()));
  RecordProperty("native_pays_here", bf16_native_pays(bf16_cpu_traits()) ? "yes" : "no");
}

}  // namespace
}  // namespace keel::kernels
