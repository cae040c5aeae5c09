// Flushing subnormal floats: on for the calling thread and every OpenMP worker, off again on
// request, and a subnormal input reads as zero while flushing.
#include "keel/core/denormals.hpp"

#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

namespace keel {
namespace {

// 1e-30f * 1e-10f = 1e-40, below FLT_MIN (1.18e-38): subnormal, or 0 when flushed. volatile keeps
// the compiler from folding it at compile time (where MXCSR does not apply).
float tiny_product() {
  volatile float a = 1e-30f, b = 1e-10f;
  return a * b;
}

// Restores the thread pool's state whatever a test does.
struct RestoreFlush {
  bool was = flush_denormals_enabled();
  ~RestoreFlush() { set_flush_denormals(was); }
};

TEST(Denormals, FlushOnEveryThreadAndBackOff) {
  RestoreFlush restore;
  if (!can_flush_denormals()) {  // no MXCSR: the calls are no-ops and say so
    set_flush_denormals(true);
    EXPECT_FALSE(flush_denormals_enabled());
    return;
  }
  const int threads = std::max(2, omp_get_max_threads());

  set_flush_denormals(false);
  EXPECT_FALSE(flush_denormals_enabled());
  const float kept = tiny_product();
  EXPECT_GT(kept, 0.0f);
  EXPECT_EQ(std::fpclassify(kept), FP_SUBNORMAL);

  set_flush_denormals(true);
  EXPECT_TRUE(flush_denormals_enabled());
  EXPECT_EQ(tiny_product(), 0.0f);
  std::vector<float> per_thread(static_cast<size_t>(threads), -1.0f);
  std::vector<int> enabled(static_cast<size_t>(threads), 0);
#pragma omp parallel num_threads(threads)
  {
    const auto t = static_cast<size_t>(omp_get_thread_num());
    per_thread[t] = tiny_product();
    enabled[t] = flush_denormals_enabled() ? 1 : 0;
  }
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(per_thread[static_cast<size_t>(t)], 0.0f) << "thread " << t;
    EXPECT_EQ(enabled[static_cast<size_t>(t)], 1) << "thread " << t;
  }
  // Denormals-are-zero: a subnormal operand counts as 0 (1e-40 * 1e30 would be 1e-10).
  volatile float sub = kept, big = 1e30f;
  EXPECT_EQ(sub * big, 0.0f);

  set_flush_denormals(false);
  EXPECT_FALSE(flush_denormals_enabled());
  EXPECT_EQ(std::fpclassify(tiny_product()), FP_SUBNORMAL);
}

}  // namespace
}  // namespace keel
