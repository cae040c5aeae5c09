#include "keel/kernels/gemm.hpp"

#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <limits>
#include <string>

#include "gemm_test_util.hpp"
#include "keel/kernels/block_gemm.hpp"

namespace keel::kernels {
namespace {

using testing::GemmCase;
using testing::padded_operands;
using testing::add_bias_to_rows;
using testing::random_vector;

// Runs body once with each kernel gemm can put under its panels (the BLAS, OpenBLAS beside it
// where linked, and keel's packed microkernel), then restores Auto.
template <typename Body>
void for_each_panel_kernel(Body body) {
  for (GemmKernel kernel : {GemmKernel::Backend, GemmKernel::Packed, GemmKernel::Openblas}) {
    set_gemm_kernel(kernel);
    SCOPED_TRACE(kernel == GemmKernel::Packed ? "packed kernel" : kernel == GemmKernel::Openblas ? "OpenBLAS" : "backend");
    const bool has_microkernel = std::string(block_gemm_isa()) != "gemm";
    EXPECT_EQ(gemm_uses_packed_kernel(false, true, 64), kernel == GemmKernel::Packed && has_microkernel);
    const PanelKernel expected = kernel == GemmKernel::Packed && has_microkernel ? PanelKernel::Packed
                                 : kernel == GemmKernel::Openblas && gemm_openblas_beside_backend()
                                     ? PanelKernel::Openblas
                                     : PanelKernel::Backend;
    EXPECT_EQ(gemm_panel_kernel(true, false, 64), expected);
    EXPECT_NE(gemm_backend_isa().find("(KEEL_GEMM="), std::string::npos) << gemm_backend_isa();  // forced: named
    body();
  }
  set_gemm_kernel(GemmKernel::Auto);
}

// OpenBLAS takes products only where it runs AVX2 kernels or wider: a CPU newer than the
// library is taken for an old one (OpenBLAS 0.3.21 names a 2023 Intel Xeon "Prescott").
TEST(GemmKernel, OpenblasOnlyOnItsAvx2KernelsOrWider) {
  // Mixed case from a DYNAMIC_ARCH build (Debian's), capitals from a build for one CPU.
  for (const char* core : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "HASWELL", "SKYLAKEX", "ZEN"})
    EXPECT_TRUE(openblas_core_has_avx2(core)) << core;
  for (const char* core : {"Prescott", "Nehalem", "Sandybridge", "Core2", "Atom", "Barcelona", "Bulldozer",
                           "PRESCOTT", "Haswel", ""})
    EXPECT_FALSE(openblas_core_has_avx2(core)) << core;
}

// Where OpenBLAS has a role and runs kernels without AVX2 on a CPU with AVX2, the run's start
// names its kernels and the OPENBLAS_CORETYPE that fixes them; nowhere else.
TEST(GemmKernel, OpenblasOnAnOldCpusKernelsIsToldAtTheStart) {
  const std::string beside = openblas_core_note(OpenblasRole::Beside, "Prescott", true, "Haswell");
  EXPECT_NE(beside.find("its Prescott kernels"), std::string::npos) << beside;
  EXPECT_NE(beside.find("stay on oneDNN"), std::string::npos) << beside;
  EXPECT_NE(beside.find("OPENBLAS_CORETYPE=Haswell"), std::string::npos) << beside;
  const std::string forced = openblas_core_note(OpenblasRole::Forced, "Prescott", true, "SkylakeX");
  EXPECT_NE(forced.find("KEEL_GEMM=openblas is ignored"), std::string::npos) << forced;
  EXPECT_NE(forced.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << forced;
  const std::string only = openblas_core_note(OpenblasRole::Only, "Nehalem", true, "Haswell");
  EXPECT_NE(only.find("every product runs at a fraction"), std::string::npos) << only;
  EXPECT_EQ(openblas_core_note(OpenblasRole::None, "Prescott", true, "Haswell"), "");   // OpenBLAS not used
  EXPECT_EQ(openblas_core_note(OpenblasRole::Beside, "Haswell", true, "Haswell"), "");  // its AVX2 kernels
  EXPECT_EQ(openblas_core_note(OpenblasRole::Only, "SKYLAKEX", true, "SkylakeX"), "");
  EXPECT_EQ(openblas_core_note(OpenblasRole::Only, "Nehalem", false, "Haswell"), "");  // an old CPU's own

  // This build, CPU and OpenBLAS: a note exactly where OpenBLAS is offered products and picked
  // kernels without AVX2 on a CPU with AVX2.
  const std::string core = openblas_core_name();
  bool cpu_avx2 = false;
#if defined(__x86_64__)
  cpu_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  const bool old_kernels = !core.empty() && !openblas_core_has_avx2(core) && cpu_avx2;
  set_gemm_kernel(GemmKernel::Auto);
#if KEEL_GEMM_DNNL
  EXPECT_EQ(!openblas_core_note().empty(), old_kernels && gemm_below_avx512()) << openblas_core_note();
  // KEEL_GEMM=openblas: the note where OpenBLAS cannot take them, and the label says "ignored".
  set_gemm_kernel(GemmKernel::Openblas);
  const std::string label = gemm_backend_isa();
  const std::string forced_here = openblas_core_note();
  set_gemm_kernel(GemmKernel::Auto);
  EXPECT_EQ(!forced_here.empty(), old_kernels) << forced_here;
  EXPECT_EQ(label.find("(KEEL_GEMM=openblas ignored)") != std::string::npos, !gemm_openblas_beside_backend()) << label;
  EXPECT_EQ(label.find("+ OpenBLAS") != std::string::npos, gemm_openblas_beside_backend()) << label;
#else
  EXPECT_FALSE(core.empty());  // OpenBLAS is the backend
  EXPECT_EQ(!openblas_core_note().empty(), old_kernels) << openblas_core_note();
#endif
}

// What Auto puts under the panels: the backend everywhere on AVX-512; below it, with OpenBLAS
// beside oneDNN, OpenBLAS for weight gradients (TN) and for NN products whose B has a row stride
// of a multiple of 512 floats, the packed kernel for NT products with that stride, oneDNN for the
// rest; without OpenBLAS, the packed kernel for TN and for every product with that stride.
TEST(GemmKernel, AutoPicksThePanelKernelMeasuredFastest) {
  set_gemm_kernel(GemmKernel::Auto);
  const bool below = gemm_below_avx512();
  EXPECT_EQ(below, std::string(block_gemm_isa()) == "avx2" && gemm_backend_isa().find("avx512") == std::string::npos)
      << gemm_backend_isa();
  const bool openblas = below && gemm_openblas_beside_backend();
  EXPECT_EQ(gemm_backend_isa().find("OpenBLAS") != std::string::npos, openblas) << gemm_backend_isa();
  EXPECT_EQ(gemm_backend_isa().find("KEEL_GEMM"), std::string::npos) << gemm_backend_isa();  // Auto: not named
  struct Case {
    bool ta, tb;
    int64_t ldb;
    PanelKernel openblas_beside, packed_only;
  };
  const Case cases[] = {
      {true, false, 256, PanelKernel::Openblas, PanelKernel::Packed},    // weight gradient
      {true, false, 512, PanelKernel::Openblas, PanelKernel::Packed},
      {false, false, 1536, PanelKernel::Openblas, PanelKernel::Packed},  // dx through a d512 weight
      {false, false, 256, PanelKernel::Backend, PanelKernel::Backend},   // the LM head's dx at d256
      {false, true, 512, PanelKernel::Packed, PanelKernel::Packed},      // a d512 forward
      {false, true, 256, PanelKernel::Backend, PanelKernel::Backend},    // a d256 forward
  };
  for (const Case& cs : cases) {
    const PanelKernel expected = !below ? PanelKernel::Backend : openblas ? cs.openblas_beside : cs.packed_only;
    EXPECT_EQ(gemm_panel_kernel(cs.ta, cs.tb, cs.ldb), expected) << cs.ta << cs.tb << " ldb=" << cs.ldb;
  }
}

// All four transposition combinations, odd sizes and padded leading dimensions.
TEST(GemmKernel, MatchesReferenceForAllTranspositions) {
  for_each_panel_kernel([] {
  const GemmCase cases[] = {
      {false, false, 17, 33, 9, 1.f, 0.f},  {false, true, 31, 5, 64, 0.5f, 1.f},
      {true, false, 7, 130, 21, 1.f, -0.5f}, {true, true, 65, 3, 1, 2.f, 0.25f},
      {false, true, 1, 1, 1, 1.f, 0.f},     {true, false, 96, 80, 200, 1.f, 1.f},
  };
  for (const GemmCase& cs : cases) {
    auto [lda, ldb, ldc, a, b, c] = padded_operands(cs, 3, 1);
    auto c_ref = c;
    gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c.data(), ldc);
    gemm_reference(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c_ref.data(), ldc);
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t j = 0; j < cs.n; ++j) {
        const size_t idx = size_t(i * ldc + j);
        ASSERT_NEAR(c[idx], c_ref[idx], 1e-5 * (1 + double(cs.k)))
            << "ta=" << cs.ta << " tb=" << cs.tb << " m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " at " << i
            << "," << j;
      }
    // Padding columns must be left untouched.
    for (int64_t i = 0; i < cs.m; ++i) EXPECT_EQ(c[size_t(i * ldc + cs.n)], c_ref[size_t(i * ldc + cs.n)]);
  }
  });
}

// Shapes big enough that gemm cuts C into panels (both directions, ragged last panels, the
// padded copy of a transposed A whose stride is a multiple of 256), against the reference.
TEST(GemmKernel, PanelScheduleMatchesReference) {
  for_each_panel_kernel([] {
  const GemmCase cases[] = {
      {false, true, 600, 300, 64, 1.f, 0.f},   {false, false, 530, 70, 128, 1.f, 1.f},
      {true, false, 1024, 48, 96, 0.5f, 1.f},  {true, true, 40, 2100, 50, 1.f, 0.f},
      {true, false, 512, 256, 256, 1.f, 0.5f},
  };
  for (const GemmCase& cs : cases) {
    const GemmPanels p = gemm_panels(cs.m, cs.n, cs.k);
    EXPECT_GT(((cs.m + p.rows - 1) / p.rows) * ((cs.n + p.cols - 1) / p.cols), 1) << cs.m << "x" << cs.n;
    auto [lda, ldb, ldc, a, b, c] = padded_operands(cs, 0, 4);
    auto c_ref = c;
    gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c.data(), ldc);
    gemm_reference(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c_ref.data(), ldc);
    double worst = 0;
    for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(double(c[i]) - double(c_ref[i])));
    EXPECT_LT(worst, 1e-5 * (1 + double(cs.k))) << "ta=" << cs.ta << " tb=" << cs.tb << " m=" << cs.m << " n=" << cs.n;
  }
  });
}

// Weight gradients with few rows of C and many tokens are cut along k, and those with many rows
// and at most 256 columns are computed as their transpose (which is then cut along k): a rule of
// the shape alone, for the TN form only.
TEST(GemmKernel, SplitAlongKAndSwappedOperandsFollowTheShape) {
  EXPECT_EQ(gemm_k_parts(true, false, 256, 1024, 2048), 4);  // GPT-2 d256's c_fc weight gradient
  EXPECT_EQ(gemm_k_parts(true, false, 512, 512, 2048), 4);
  EXPECT_EQ(gemm_k_parts(true, false, 256, 1024, 1024), 2);
  EXPECT_EQ(gemm_k_parts(true, false, 256, 1024, 1000), 1);  // a slice under 512 tokens
  EXPECT_EQ(gemm_k_parts(true, false, 1536, 512, 2048), 1);  // too many rows: the panels win
  EXPECT_EQ(gemm_k_parts(true, false, 256, 8192, 2048), 1);  // too large a C
  EXPECT_EQ(gemm_k_parts(true, false, 2, 2, 4096), 1);       // too little work: slices under the smallest panel
  EXPECT_EQ(gemm_k_parts(true, false, 16, 64, 2048), 2);     // 4.2 MFLOP: two slices of at least 2
  EXPECT_EQ(gemm_k_parts(false, false, 256, 256, 8192), 1);
  EXPECT_EQ(gemm_k_parts(false, true, 256, 256, 8192), 1);
  EXPECT_TRUE(gemm_swaps_operands(true, false, 1024, 256, 2048));   // c_proj's weight gradient
  EXPECT_TRUE(gemm_swaps_operands(true, false, 768, 256, 2048));
  EXPECT_FALSE(gemm_swaps_operands(true, false, 8192, 256, 1024));  // the LM head's: too large a C
  EXPECT_FALSE(gemm_swaps_operands(true, false, 1536, 512, 2048));  // too wide
  EXPECT_FALSE(gemm_swaps_operands(true, false, 300, 256, 2048));   // not tall enough
  EXPECT_FALSE(gemm_swaps_operands(false, false, 1024, 256, 2048));
  EXPECT_FALSE(gemm_swaps_operands(true, true, 1024, 256, 2048));
}

// Both schedules against the reference: odd sizes (slices of k and transposed tiles with ragged
// ends), padded strides, alpha, beta = 0 over a C of NaN and beta != 0 over a C that is read,
// and the same bits on one thread as on two.
TEST(GemmKernel, SplitAlongKAndSwappedOperandsMatchReference) {
  const GemmCase cases[] = {
      {true, false, 200, 130, 2051, 1.f, 0.f},   // 4 slices of k, the last one shorter
      {true, false, 256, 96, 1100, 0.5f, 1.f},   // 2 slices, C accumulated
      {true, false, 515, 200, 1536, 1.f, 0.f},   // swapped: 200 × 515 in 3 slices
      {true, false, 700, 90, 2048, 2.f, -0.5f},  // swapped: 90 × 700, ragged 64-row tiles
  };
  for (const GemmCase& cs : cases) {
    SCOPED_TRACE("m=" + std::to_string(cs.m) + " n=" + std::to_string(cs.n) + " k=" + std::to_string(cs.k));
    ASSERT_TRUE(gemm_k_parts(cs.ta, cs.tb, cs.m, cs.n, cs.k) > 1 ||
                gemm_swaps_operands(cs.ta, cs.tb, cs.m, cs.n, cs.k));
    auto [lda, ldb, ldc, a, b, c] = padded_operands(cs, 3, 31);
    auto c_ref = c, c_one = c;
    gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c.data(), ldc);
    gemm_reference(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c_ref.data(), ldc);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c_one.data(), ldc);
    omp_set_num_threads(saved);
    double worst = 0;
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t j = 0; j < cs.n; ++j) {
        const size_t idx = size_t(i * ldc + j);
        const double diff = std::abs(double(c[idx]) - double(c_ref[idx]));
        worst = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(worst, diff);
        ASSERT_EQ(c[idx], c_one[idx]) << "one thread differs at " << i << "," << j;
      }
    EXPECT_LT(worst, 1e-6 * double(cs.k));
    for (int64_t i = 0; i < cs.m; ++i)  // padding columns untouched
      for (int64_t j = cs.n; j < ldc; ++j) ASSERT_EQ(c[size_t(i * ldc + j)], c_ref[size_t(i * ldc + j)]);
  }
}

// C wider than one panel is cut into column panels of (nearly) equal width, multiples of 16:
// no ragged last panel much narrower than the others to unbalance the threads' schedule.
TEST(GemmKernel, ColumnPanelsAreEqualWidths) {
  EXPECT_EQ(gemm_panels(2048, 1536, 512).cols, 768);   // not 1,024 and 512
  EXPECT_EQ(gemm_panels(2048, 2304, 768).cols, 768);   // GPT-2 124M's c_attn: 3 × 768
  EXPECT_EQ(gemm_panels(1024, 8192, 512).cols, 1024);  // a multiple of the widest panel is unchanged
  EXPECT_EQ(gemm_panels(2048, 1024, 256).cols, 1024);
  for (int64_t n = 1; n <= 5000; n += 37) {
    const GemmPanels p = gemm_panels(4096, n, 512);  // 16 row panels: the column width stays as cut
    const int64_t parts = (n + p.cols - 1) / p.cols, last = n - (parts - 1) * p.cols;
    ASSERT_LE(p.cols, kGemmPanelCols) << n;
    ASSERT_TRUE(p.cols == n || p.cols % 16 == 0) << n;
    ASSERT_EQ(parts, (n + kGemmPanelCols - 1) / kGemmPanelCols) << n;  // no more panels than needed
    ASSERT_GE(last, p.cols - 16 * parts) << n << ": last panel " << last << " of " << p.cols;
  }
}

// The panels are a function of the shape alone and each is computed by one call on one thread,
// so the product is bit-identical with one thread or several: what lets the thread governor
// change the team size between steps without changing a run's numbers.
TEST(GemmKernel, ResultDoesNotDependOnTheThreadCount) {
  for_each_panel_kernel([] {
  const int64_t m = 700, n = 520, k = 300;
  const auto a = random_vector(size_t(k * m), 7);  // stored (k, m): the weight-gradient shape
  const auto b = random_vector(size_t(k * n), 8);
  std::vector<float> one(size_t(m * n)), two(size_t(m * n));
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  gemm(true, false, m, n, k, 1.f, a.data(), m, b.data(), n, 0.f, one.data(), n);
  omp_set_num_threads(std::max(2, saved));
  gemm(true, false, m, n, k, 1.f, a.data(), m, b.data(), n, 0.f, two.data(), n);
  omp_set_num_threads(saved);
  for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], two[i]) << "element " << i;
  });
}

// keel's packed kernel alone, on one thread, over shapes that cross each of its cache blocks
// (rows past 144, columns past 1,024, k past two blocks of 256) and ragged tiles, every
// transposition, alpha and beta (beta = 0 over a C of NaN), padded strides.
TEST(GemmKernel, PackedKernelMatchesReference) {
  const GemmCase cases[] = {
      {false, true, 150, 1100, 530, 1.f, 0.f},  {false, false, 149, 37, 257, 0.5f, 1.f},
      {true, false, 300, 70, 513, 1.f, -0.5f},  {true, true, 13, 1030, 300, 2.f, 0.f},
      {false, false, 1, 1, 1, 1.f, 0.f},        {true, true, 7, 3, 1, 1.f, 1.f},
      {false, true, 6, 64, 256, 1.f, 0.f},      {true, false, 145, 17, 31, 0.25f, 0.f},
  };
  for (const GemmCase& cs : cases) {
    auto [lda, ldb, ldc, a, b, c] = padded_operands(cs, 5, 21);
    auto c_ref = c;
    packed_gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c.data(), ldc);
    gemm_reference(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, c_ref.data(), ldc);
    double worst = 0;
    for (int64_t i = 0; i < cs.m; ++i) {
      for (int64_t j = 0; j < cs.n; ++j) {
        const double diff = std::abs(double(c[size_t(i * ldc + j)]) - double(c_ref[size_t(i * ldc + j)]));
        worst = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(worst, diff);
      }
      for (int64_t j = cs.n; j < ldc; ++j) ASSERT_EQ(c[size_t(i * ldc + j)], c_ref[size_t(i * ldc + j)]) << "padding";
    }
    EXPECT_LT(worst, 1e-5 * (1 + double(cs.k))) << "ta=" << cs.ta << " tb=" << cs.tb << " m=" << cs.m << " n=" << cs.n
                                                << " k=" << cs.k;
  }
}

// An untransposed B whose stride is a multiple of 4 KiB is copied to a padded stride first where
// the backend needs it (gemm_pads_aliased_b); forced on and off, C must match the reference, and
// one thread must give the bits of two either way. Covers NN and TN, a B narrower than its
// stride, beta = 1, and the one-panel path.
TEST(GemmKernel, PaddedAliasedBMatchesReference) {
  struct Case {
    bool ta;
    int64_t m, n, k, ldb;
    float beta;
  };
  const Case cases[] = {{false, 512, 1024, 96, 1024, 0.f},
                        {true, 256, 1000, 300, 2048, 1.f},
                        {false, 130, 64, 40, 1024, 0.5f},
                        {false, 200, 1008, 48, 2048, 0.f}};  // n + 16 would alias again
  const int saved = omp_get_max_threads();
  for (const Case& cs : cases) {
    const int64_t lda = cs.ta ? cs.m : cs.k, ldc = cs.n;
    const auto a = random_vector(size_t((cs.ta ? cs.k : cs.m) * lda), 11);
    const auto b = random_vector(size_t(cs.k * cs.ldb), 12);
    const auto c0 = random_vector(size_t(cs.m * ldc), 13);
    auto c_ref = c0;
    gemm_reference(cs.ta, false, cs.m, cs.n, cs.k, 1.f, a.data(), lda, b.data(), cs.ldb, cs.beta, c_ref.data(), ldc);
    std::vector<std::vector<float>> results;
    for (PadAliasedB mode : {PadAliasedB::Always, PadAliasedB::Never}) {
      set_pad_aliased_b(mode);
      EXPECT_EQ(gemm_pads_aliased_b(), mode == PadAliasedB::Always);
      for (int threads : {1, std::max(2, saved)}) {
        omp_set_num_threads(threads);
        auto c = c0;
        gemm(cs.ta, false, cs.m, cs.n, cs.k, 1.f, a.data(), lda, b.data(), cs.ldb, cs.beta, c.data(), ldc);
        double worst = 0;
        for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(double(c[i]) - double(c_ref[i])));
        EXPECT_LT(worst, 1e-5 * (1 + double(cs.k))) << "m=" << cs.m << " n=" << cs.n << " threads=" << threads;
        if (mode == PadAliasedB::Always) results.push_back(std::move(c));
        else EXPECT_EQ(c, results[0]) << "padding B changed the bits, m=" << cs.m;  // oneDNN: same blocking
      }
      EXPECT_EQ(results[0], results[1]) << "thread count changed the bits, m=" << cs.m;
    }
  }
  set_pad_aliased_b(PadAliasedB::Auto);
  omp_set_num_threads(saved);
}

// The team form packs B once for all threads and hands out blocks of C: every block must come
// out bit for bit as the one-thread packed_gemm computes it, with one thread or two. Shapes with
// several row blocks, column groups and k blocks, narrowed groups (small m), alpha and beta.
TEST(GemmKernel, PackedTeamMatchesOneThreadBitForBit) {
  const GemmCase cases[] = {
      {false, true, 300, 700, 600, 1.f, 0.f},  {false, false, 50, 100, 30, 2.f, 0.5f},
      {true, false, 256, 1024, 513, 1.f, 1.f}, {true, true, 7, 3, 1000, 1.f, 0.f},
      {false, false, 2048, 64, 256, 0.5f, 0.f},
  };
  const bool has_microkernel = std::string(block_gemm_isa()) != "gemm";
  const int saved = omp_get_max_threads();
  for (const GemmCase& cs : cases) {
    const auto [lda, ldb, ldc, a, b, c0] = padded_operands(cs, 0, 31);
    auto one = c0;
    packed_gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, one.data(), ldc);
    for (int threads : {1, std::max(2, saved)}) {
      omp_set_num_threads(threads);
      auto team = c0;
      const bool ran = packed_gemm_team(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb,
                                        cs.beta, team.data(), ldc);
      ASSERT_EQ(ran, has_microkernel);
      if (ran) {
        ASSERT_EQ(team, one) << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " threads=" << threads;
      }
    }
  }
  omp_set_num_threads(saved);
  // A B over 32 MiB packed is left to gemm's panels.
  const float x = 0.f;
  EXPECT_FALSE(packed_gemm_team(false, false, 1, int64_t(1) << 15, 1 << 9, 1.f, &x, 1, &x, 1, 0.f, nullptr, 1));
}

// gemm_bias adds the bias to each panel as it is finished: the same bits as gemm followed by a
// pass adding the bias, on every kernel and every route gemm takes (panels, one panel, a k cut,
// swapped operands, the packed team, k == 0, inside a parallel region), and the padding untouched.
TEST(GemmKernel, BiasIsAddedToTheFinishedProductOnEveryPath) {
  const GemmCase cases[] = {
      {false, false, 600, 1100, 70, 1.f, 0.f},  // NN, several row and column panels
      {false, true, 300, 700, 600, 0.5f, 0.f},  // NT, the packed team under the packed kernel
      {false, false, 5, 7, 3, 1.f, 1.f},        // one panel, C accumulated
      {true, false, 200, 130, 2051, 1.f, 0.f},  // cut along k
      {true, false, 515, 200, 1536, 2.f, -0.5f},  // swapped operands
      {false, true, 9, 33, 0, 1.f, 0.5f},       // k == 0: beta·C + bias
  };
  for_each_panel_kernel([&] {
    for (const GemmCase& cs : cases) {
      SCOPED_TRACE("ta=" + std::to_string(cs.ta) + " tb=" + std::to_string(cs.tb) + " m=" + std::to_string(cs.m) +
                   " n=" + std::to_string(cs.n) + " k=" + std::to_string(cs.k));
      auto [lda, ldb, ldc, a, b, c] = padded_operands(cs, 3, 41);
      if (cs.k == 0) {  // operands of no rows: keep a valid pointer
        a.assign(1, 0.f);
        b.assign(1, 0.f);
      }
      const auto bias = random_vector(size_t(cs.n), 44);
      auto expected = c;
      gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, expected.data(), ldc);
      add_bias_to_rows(expected, cs.m, cs.n, ldc, bias);
      const int saved = omp_get_max_threads();
      for (int threads : {1, std::max(2, saved)}) {
        omp_set_num_threads(threads);
        auto got = c;
        gemm_bias(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, got.data(), ldc,
                  bias.data());
        ASSERT_EQ(got, expected) << threads << " threads";  // padding included
      }
      omp_set_num_threads(saved);
      // Inside a parallel region each thread runs the panels itself (a GEMM per expert), without
      // the k cut, so against gemm run there too.
      std::vector<std::vector<float>> with_bias(2, c), then_bias(2, c);
#pragma omp parallel num_threads(2)
      {
        const size_t t = size_t(omp_get_thread_num());
        gemm_bias(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta,
                  with_bias[t].data(), ldc, bias.data());
        gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, then_bias[t].data(), ldc);
        add_bias_to_rows(then_bias[t], cs.m, cs.n, ldc, bias);
      }
      for (size_t t = 0; t < 2; ++t) ASSERT_EQ(with_bias[t], then_bias[t]) << "inside a parallel region";
      // No bias is gemm.
      auto plain = c, none = c;
      gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, plain.data(), ldc);
      gemm_bias(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, none.data(), ldc,
                nullptr);
      ASSERT_EQ(none, plain);
    }
  });
}

// TN panels run as NN products on A's slice transposed (Always), or as they are (Never): both
// within rounding of the reference, the bits independent of the thread count, the padding and
// a bias handled; Auto transposes for oneDNN on AVX-512 only, never for the packed kernel.
TEST(GemmKernel, TransposedTnPanelsMatchReference) {
  EXPECT_FALSE(gemm_transposes_tn_panels(PanelKernel::Packed));
  EXPECT_FALSE(gemm_transposes_tn_panels(PanelKernel::Openblas));
  EXPECT_EQ(gemm_transposes_tn_panels(PanelKernel::Backend),
            !gemm_below_avx512() && gemm_backend_isa().rfind("oneDNN", 0) == 0 &&
                gemm_backend_isa().find("avx512") != std::string::npos)
      << gemm_backend_isa();
  const GemmCase cases[] = {
      {true, false, 1536, 512, 300, 1.f, 0.f},  // the d512 model's down_proj weight gradient, shorter
      {true, true, 700, 300, 129, 0.5f, 1.f},   // both transposed, C accumulated
      {true, false, 1100, 40, 70, 2.f, -0.5f},  // narrow: one column panel, ragged rows
      {true, false, 512, 256, 333, 1.f, 0.f},   // A's row stride a multiple of 256 floats
  };
  for (const GemmCase& cs : cases) {
    ASSERT_EQ(gemm_k_parts(cs.ta, cs.tb, cs.m, cs.n, cs.k), 1);
    ASSERT_FALSE(gemm_swaps_operands(cs.ta, cs.tb, cs.m, cs.n, cs.k));
  }
  for_each_panel_kernel([&] {
    for (const GemmCase& cs : cases) {
      SCOPED_TRACE("tb=" + std::to_string(cs.tb) + " m=" + std::to_string(cs.m) + " n=" + std::to_string(cs.n) +
                   " k=" + std::to_string(cs.k));
      const int64_t pad = cs.m == 512 ? 0 : 3;
      auto [lda, ldb, ldc, a, b, c] = padded_operands(cs, pad, 71);
      const auto bias = random_vector(size_t(cs.n), 74);
      auto reference = c;
      gemm_reference(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta,
                     reference.data(), ldc);
      std::vector<float> results[2];
      for (TransposeTnPanels mode : {TransposeTnPanels::Always, TransposeTnPanels::Never}) {
        set_transpose_tn_panels(mode);
        SCOPED_TRACE(mode == TransposeTnPanels::Always ? "transposed" : "as TN");
        auto two = c, one = c;
        gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, two.data(), ldc);
        const int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, one.data(), ldc);
        omp_set_num_threads(saved);
        ASSERT_EQ(two, one);  // padding included
        double worst = 0;
        for (int64_t i = 0; i < cs.m; ++i)
          for (int64_t j = 0; j < cs.n; ++j) {
            const double diff = std::abs(double(two[size_t(i * ldc + j)]) - double(reference[size_t(i * ldc + j)]));
            worst = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(worst, diff);
          }
        EXPECT_LT(worst, 1e-6 * double(cs.k));
        auto with_bias = c, then_bias = two;
        gemm_bias(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb, cs.beta, with_bias.data(),
                  ldc, bias.data());
        add_bias_to_rows(then_bias, cs.m, cs.n, ldc, bias);
        ASSERT_EQ(with_bias, then_bias);
        results[mode == TransposeTnPanels::Always ? 0 : 1] = two;
      }
      set_transpose_tn_panels(TransposeTnPanels::Auto);
      // The two forms are different summation orders of the same products.
      for (size_t i = 0; i < results[0].size(); ++i)
        ASSERT_NEAR(results[0][i], results[1][i], 2e-6 * double(cs.k)) << i;
    }
  });
}

TEST(GemmKernel, ZeroInnerDimensionScalesByBeta) {
  std::vector<float> c = {1.f, 2.f, 3.f, 4.f};
  const float dummy = 0.f;
  gemm(false, false, 2, 2, 0, 1.f, &dummy, 1, &dummy, 2, 0.5f, c.data(), 2);
  EXPECT_FLOAT_EQ(c[0], 0.5f);
  EXPECT_FLOAT_EQ(c[3], 2.f);
}

}  // namespace
}  // namespace keel::kernels
