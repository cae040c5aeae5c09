#include "keel/kernels/fma_peak.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "keel/kernels/gemm.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace keel::kernels {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

#if defined(__x86_64__)
constexpr int kChains = 12;

// Each returns the FLOPs it did; `sink` keeps the compiler from dropping the chains. The chains
// must live in registers whatever the build's flags: unrolled by pragma (-O2 leaves a 12-trip
// loop rolled and the array in memory, and the peak then read at a quarter of the CPU's under the
// asan preset), never instrumented, and under GCC optimized even in a -O0 build.
#if defined(__clang__)
#define KEEL_FMA_CHAINS __attribute__((no_sanitize("address", "undefined")))
#else
#define KEEL_FMA_CHAINS __attribute__((no_sanitize("address", "undefined"), optimize("O2")))
#endif
KEEL_FMA_CHAINS __attribute__((target("avx2,fma"))) double fma_256(int64_t iters, float* sink) {
  __m256 acc[kChains];
#pragma GCC unroll 12
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 s = acc[0];
#pragma GCC unroll 12
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  *sink += _mm256_cvtss_f32(s);
  return 2.0 * 8 * kChains * static_cast<double>(iters);
}

KEEL_FMA_CHAINS __attribute__((target("avx512f"))) double fma_512(int64_t iters, float* sink) {
  __m512 acc[kChains];
#pragma GCC unroll 12
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 s = acc[0];
#pragma GCC unroll 12
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  *sink += lanes[0];
  return 2.0 * 16 * kChains * static_cast<double>(iters);
}
#undef KEEL_FMA_CHAINS
#endif

// Every thread runs the same iteration count; the time is the team's wall clock, so the slowest
// thread sets it.
template <class Kernel>
double team_rate(Kernel kernel, int threads, double seconds) {
  float sink = 0.f;
  int64_t iters = int64_t{1} << 14;
  // Grow the count until one thread's run takes about `seconds`.
  for (;;) {
    const auto t0 = Clock::now();
    kernel(iters, &sink);
    if (seconds_since(t0) > seconds * 0.5 || iters > (int64_t{1} << 40)) break;
    iters *= 2;
  }
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    double flops = 0.0;
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      float local = 0.f;
      flops += kernel(iters, &local);
#pragma omp critical
      sink += local;
    }
    best = std::max(best, flops / seconds_since(t0) * 1e-9);
  }
  volatile float keep = sink;  // the chains' results are used
  (void)keep;
  return best;
}

}  // namespace

double measure_fma_peak(int bits, int threads, double seconds) {
  threads = std::max(threads, 1);
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (bits == 256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return team_rate(fma_256, threads, seconds);
  if (bits == 512 && __builtin_cpu_supports("avx512f")) return team_rate(fma_512, threads, seconds);
#else
  (void)bits;
  (void)seconds;
#endif
  return 0.0;
}

double measure_gemm_rate(int64_t n, int repeats) {
  const size_t size = static_cast<size_t>(n * n);
  std::vector<float> a(size), b(size), c(size);
  for (size_t i = 0; i < size; ++i) {
    a[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
    b[i] = static_cast<float>((i * 104729) % 1000) * 1e-3f - 0.5f;
  }
  auto once = [&] { gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); };
  once();
  double best = 0.0;
  for (int rep = 0; rep < std::max(repeats, 1); ++rep) {
    const auto t0 = Clock::now();
    once();
    best = std::max(best, 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) /
                              seconds_since(t0) * 1e-9);
  }
  return best;
}

}  // namespace keel::kernels
