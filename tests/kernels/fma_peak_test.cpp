// The ceilings `keel bench --peak` states a step's GEMMs against (kernels/fma_peak.hpp): measured
// only at widths the CPU has, in proportion to the lanes, and above what a product reaches.
#include "keel/kernels/fma_peak.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <string>

#include "keel/kernels/block_gemm.hpp"
#include "keel/kernels/gemm.hpp"

namespace keel::kernels {
namespace {

bool cpu_has(int bits) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (bits == 256) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (bits == 512) return __builtin_cpu_supports("avx512f");
#else
  (void)bits;
#endif
  return false;
}

// The best of many short windows: a test process shares two cores with another, and a window in
// which it was preempted reads low, never high. The windows are as short as the product's calls
// below (a few milliseconds), so the two are as likely to run whole.
double peak(int bits, int threads) {
  double best = 0;
  for (int i = 0; i < 8; ++i) best = std::max(best, measure_fma_peak(bits, threads, 0.004));
  return best;
}

TEST(FmaPeak, MeasuresOnlyWidthsTheCpuHas) {
  for (int bits : {128, 256, 512}) {
    const double p = measure_fma_peak(bits, 1, 0.01);
    if (cpu_has(bits)) {
      EXPECT_GT(p, 1.0) << bits;  // any core with these FMAs does over a GFLOP/s
    } else {
      EXPECT_EQ(p, 0.0) << bits;
    }
  }
}

TEST(FmaPeak, WidthOfTheProductsFollowsTheKernelsThatRun) {
  const int bits = gemm_fma_bits();
  EXPECT_TRUE(bits == 0 || bits == 256 || bits == 512) << bits;
  if (bits != 0) {
    EXPECT_TRUE(cpu_has(bits)) << bits;
  }
  if (std::string(block_gemm_isa()) == "avx512") {
    EXPECT_EQ(bits, 512);
  }
  if (!cpu_has(256)) {
    EXPECT_EQ(bits, 0);
  }
}

// A FLOP miscounted by the lanes (8 for 16, say) would put the 512-bit peak at the 256-bit one's
// or four times it, and a product above the peak of its own width.
TEST(FmaPeak, RatesAreInProportionToTheLanesAndAboveAProduct) {
  if (!cpu_has(256)) {
    // No FMA width to measure: the products run no AVX2 code, and no peak is stated for them.
    EXPECT_EQ(gemm_fma_bits(), 0);
    EXPECT_EQ(peak(256, 1), 0.0);
    return;
  }
  const double p256 = peak(256, 1);
  if (cpu_has(512)) {
    const double p512 = peak(512, 1);
    // Zen 4 runs 512-bit FMAs as two halves (about 1x), Intel and Zen 5 on full-width pipes (2x).
    EXPECT_GT(p512, 0.8 * p256);
    EXPECT_LT(p512, 2.6 * p256);
  }
  const int bits = gemm_fma_bits();
  if (bits == 0) return;
  const int team = omp_get_max_threads();
  omp_set_num_threads(1);
  const double product = measure_gemm_rate(384, 3);
  omp_set_num_threads(team);
  EXPECT_GT(product, 0.0);
  EXPECT_LT(product, 1.25 * peak(bits, 1)) << "a product above the FMA peak of its own width";
}

}  // namespace
}  // namespace keel::kernels
