// The machine's fp32 FMA peak, measured: the ceiling against which docs/performance.md states
// the GEMMs' achieved GFLOP/s. Twelve independent accumulator chains per thread (more than
// latency × pipes on Zen 3/4/5 and recent Intel, so the pipes, not the chain latency, bound
// it), 256-bit (AVX2) and, where the CPU has it, 512-bit (AVX-512) registers, on 1 thread and on
// all of OpenMP's. Usage: fma_peak [seconds per measurement, default 0.5]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "keel/core/cpu_info.hpp"

namespace {

constexpr int kChains = 12;

// Returns FLOPs done; `sink` keeps the compiler from dropping the chains.
__attribute__((target("avx2,fma"))) double fma_ymm(long iters, float* sink) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  __m256 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  *sink += _mm256_cvtss_f32(s);
  return 2.0 * 8 * kChains * static_cast<double>(iters);
}

__attribute__((target("avx512f"))) double fma_zmm(long iters, float* sink) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  *sink += _mm512_reduce_add_ps(s);
  return 2.0 * 16 * kChains * static_cast<double>(iters);
}

// GFLOP/s of `kernel` on `threads` threads: each thread runs the same number of iterations, the
// time is the slowest thread's (wall clock around the team), best of three.
template <class Kernel>
double measure(Kernel kernel, int threads, double seconds) {
  float sink = 0.f;
  long iters = 1 << 16;
  // Grow the iteration count until one thread's run takes about `seconds`.
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    kernel(iters, &sink);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > seconds * 0.5) break;
    iters *= 2;
  }
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    double flops = 0.0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      float local = 0.f;
      flops += kernel(iters, &local);
#pragma omp critical
      sink += local;
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / dt * 1e-9);
  }
  if (sink == 12345.f) std::printf(" ");
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
  const int team = omp_get_max_threads();
  std::printf("CPU: %s; fp32 FMA peak, %d independent chains per thread, best of 3\n", keel::cpu_description().c_str(),
              kChains);
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    std::printf("  AVX2    (256-bit): 1 thread %7.1f GFLOP/s, %d threads %7.1f GFLOP/s\n", measure(fma_ymm, 1, seconds),
                team, measure(fma_ymm, team, seconds));
  }
  if (__builtin_cpu_supports("avx512f")) {
    std::printf("  AVX-512 (512-bit): 1 thread %7.1f GFLOP/s, %d threads %7.1f GFLOP/s\n", measure(fma_zmm, 1, seconds),
                team, measure(fma_zmm, team, seconds));
  }
  return 0;
}
