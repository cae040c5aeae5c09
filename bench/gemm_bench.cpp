// sgemm throughput at the shapes a small transformer's linear layers use, for choosing the BLAS
// that keel links (docs/blas.md). One source, built once per candidate library; each binary
// prints which library it actually loaded so a wrong runtime alternative cannot fool us.
//
// For a linear layer with tokens=M, in=K, out=N and W stored (out, in):
//   forward  y  = x · Wᵀ   -> NT  (M, N, K)
//   backward dx = dy · W   -> NN  (M, K, N)
//   backward dW = dyᵀ · x  -> TN  (N, K, M)
// The "+omp" column interleaves an OpenMP elementwise pass between gemm calls, as a training
// step does; a BLAS with its own thread pool then competes with OpenMP's spinning workers.
// keel's binary also times both kernels it can put under its panels (the BLAS, and its own packed
// microkernel), interleaved, and prints their ratio.
// The "cold" column evicts the caches before each timed call (a 64 MiB write, not timed): in a
// step the operands of a product were last touched several layers ago, not by the same call.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "keel/core/cpu_info.hpp"

#if defined(KEEL_BENCH_KEEL)
#include "keel/kernels/gemm.hpp"
static const char* library_name() { return "keel::kernels::gemm (oneDNN per panel, keel's panel schedule)"; }
static void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc) {
  keel::kernels::gemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 0.f, c, ldc);
}
#elif defined(KEEL_BENCH_DNNL)
#include <dnnl.h>
static const char* library_name() { return "oneDNN dnnl_sgemm"; }
static void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc) {
  dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.f, a, lda, b, ldb, 0.f, c, ldc);
}
#else
#include <cblas.h>
#if defined(KEEL_BENCH_OPENBLAS)
extern "C" char* openblas_get_config(void);
static const char* library_name() { return openblas_get_config(); }
#else
static const char* library_name() { return "BLIS cblas"; }
#endif
static void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              1.f, a, int(lda), b, int(ldb), 0.f, c, int(ldc));
}
#endif

namespace {

struct Case {
  const char* name;
  bool ta, tb;
  int64_t m, n, k;
};

// Median seconds of one call; repeats until ~0.3 s has been spent so small shapes are stable.
enum class Mode { Plain, WithOmp, Cold };

double time_case(const Case& cs, Mode mode, std::vector<float>& a, std::vector<float>& b, std::vector<float>& c,
                 std::vector<float>& scratch, std::vector<float>& evict) {
  const bool with_omp = mode == Mode::WithOmp;
  const int64_t lda = cs.ta ? cs.m : cs.k, ldb = cs.tb ? cs.k : cs.n;
  auto one = [&] {
    sgemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, a.data(), lda, b.data(), ldb, c.data(), cs.n);
    if (with_omp) {
      const int64_t s = int64_t(scratch.size());
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < s; ++i) scratch[size_t(i)] = scratch[size_t(i)] * 0.999f + 0.001f;
    }
  };
  one();
  std::vector<double> times;
  double spent = 0;
  while (spent < 0.3 || times.size() < 5) {
    if (mode == Mode::Cold) {
      const int64_t e = int64_t(evict.size());
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < e; ++i) evict[size_t(i)] += 1.f;
    }
    auto t0 = std::chrono::steady_clock::now();
    one();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    times.push_back(dt);
    spent += dt;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main() {
  std::printf("CPU: %s\nlibrary: %s  omp_max_threads=%d\n", keel::cpu_description().c_str(), library_name(), omp_get_max_threads());
  const int64_t tokens = 2048;
  std::vector<Case> cases;
  for (int64_t in : {256, 512})
    for (int64_t out : {256, 768, 1024, 2048, 8192}) {
      cases.push_back({"fwd NT", false, true, tokens, out, in});
      cases.push_back({"dx  NN", false, false, tokens, in, out});
      cases.push_back({"dW  TN", true, false, out, in, tokens});
    }
  std::vector<float> a(size_t(tokens) * 8192), b(size_t(tokens) * 8192), c(size_t(tokens) * 8192);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float((i * 7919) % 1000) * 1e-3f - 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float((i * 104729) % 1000) * 1e-3f - 0.5f;
  // A small elementwise pass (64k floats): the kind of op that sits between two linears.
  std::vector<float> scratch(size_t(1) << 16, 1.f);
  std::vector<float> evict(size_t(16) << 20, 0.f);
  std::printf("%-7s %6s %6s %6s %10s %10s %10s", "case", "M", "N", "K", "GFLOP/s", "+omp", "cold");
#if defined(KEEL_BENCH_KEEL)
  std::printf(" %10s %10s %8s", "backend", "packed", "packed/backend");
#endif
  std::printf("\n");
  double sum_plain = 0, sum_omp = 0, sum_cold = 0;
  for (const Case& cs : cases) {
    const double flops = 2.0 * double(cs.m) * double(cs.n) * double(cs.k);
    const double g = flops / time_case(cs, Mode::Plain, a, b, c, scratch, evict) * 1e-9;
    const double go = flops / time_case(cs, Mode::WithOmp, a, b, c, scratch, evict) * 1e-9;
    const double gc = flops / time_case(cs, Mode::Cold, a, b, c, scratch, evict) * 1e-9;
    sum_plain += g;
    sum_omp += go;
    sum_cold += gc;
    std::printf("%-7s %6lld %6lld %6lld %10.1f %10.1f %10.1f", cs.name, (long long)cs.m, (long long)cs.n,
                (long long)cs.k, g, go, gc);
#if defined(KEEL_BENCH_KEEL)
    // The two kernels keel can run per panel, interleaved over three rounds: medians and the
    // median of the per-round ratios packed / backend.
    std::vector<double> backend, packed, ratio;
    for (int round = 0; round < 3; ++round) {
      keel::kernels::set_gemm_kernel(keel::kernels::GemmKernel::Backend);
      backend.push_back(flops / time_case(cs, Mode::Plain, a, b, c, scratch, evict) * 1e-9);
      keel::kernels::set_gemm_kernel(keel::kernels::GemmKernel::Packed);
      packed.push_back(flops / time_case(cs, Mode::Plain, a, b, c, scratch, evict) * 1e-9);
      ratio.push_back(packed.back() / backend.back());
    }
    keel::kernels::set_gemm_kernel(keel::kernels::GemmKernel::Auto);
    for (auto* v : {&backend, &packed, &ratio}) std::sort(v->begin(), v->end());
    std::printf(" %10.1f %10.1f %8.3f (%.3f..%.3f)", backend[1], packed[1], ratio[1], ratio[0], ratio[2]);
#endif
    std::printf("\n");
  }
  const double count = double(cases.size());
  std::printf("mean GFLOP/s: %.1f  with omp interleave: %.1f  cold caches: %.1f\n", sum_plain / count,
              sum_omp / count, sum_cold / count);
  return 0;
}
