// Attention's block products on one thread: keel's microkernel (block_gemm) against oneDNN's
// sgemm at the same shapes and strides, interleaved (A B A B ...) and repeated, median of each.
// Shapes: the forward's S = Q·Kᵀ (Kᵀ packed) and O += P·V, the backward's Pᵀ·dO (A transposed),
// at head widths 64 and 128 (GPT-2 and Qwen3-0.6B). docs/performance.md, "Attention's blocks".
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "keel/core/cpu_info.hpp"
#include "keel/kernels/block_gemm.hpp"
#include "keel/kernels/gemm.hpp"

namespace {

struct Case {
  const char* name;
  bool trans_a, accumulate;
  int64_t m, n, k;
};

template <typename F>
double seconds_per_call(F&& run, int calls) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 9;
  omp_set_num_threads(1);
  std::printf("CPU: %s; microkernel: %s; one thread, %d interleaved repeats\n", keel::cpu_description().c_str(),
              keel::kernels::block_gemm_isa(), repeats);
  const Case cases[] = {
      {"S = Q.Kt  (64x64x64)", false, false, 64, 64, 64}, {"O += P.V  (64x64x64)", false, true, 64, 64, 64},
      {"dV += Pt.dO (64x64x64)", true, true, 64, 64, 64}, {"S = Q.Kt  (64x64x128)", false, false, 64, 64, 128},
      {"O += P.V  (64x128x64)", false, true, 64, 128, 64}, {"ragged    (37x50x64)", false, true, 37, 50, 64},
  };
  std::printf("%-24s %12s %12s %8s\n", "product", "keel GFLOP/s", "oneDNN", "ratio");
  for (const Case& cs : cases) {
    const int64_t lda = cs.trans_a ? cs.m : cs.k;
    std::vector<float> a(size_t(cs.m * cs.k)), b(size_t(cs.k * cs.n)), c(size_t(cs.m * cs.n));
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 13) * 0.01f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 7) * 0.02f;
    const double flops = 2.0 * double(cs.m * cs.n * cs.k);
    const int calls = int(std::max(200.0, 2e9 / flops / 20));  // ~0.05 s a measurement
    auto keel_run = [&] {
      keel::kernels::block_gemm(cs.trans_a, cs.m, cs.n, cs.k, a.data(), lda, b.data(), cs.n, c.data(), cs.n,
                                cs.accumulate);
    };
    auto dnnl_run = [&] {
      keel::kernels::gemm(cs.trans_a, false, cs.m, cs.n, cs.k, 1.f, a.data(), lda, b.data(), cs.n,
                          cs.accumulate ? 1.f : 0.f, c.data(), cs.n);
    };
    keel_run();
    dnnl_run();  // oneDNN's JIT compiles on the first call of a shape
    std::vector<double> keel_s, dnnl_s, ratio;
    for (int r = 0; r < repeats; ++r) {
      keel_s.push_back(seconds_per_call(keel_run, calls));
      dnnl_s.push_back(seconds_per_call(dnnl_run, calls));
      ratio.push_back(dnnl_s.back() / keel_s.back());
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf("%-24s %12.1f %12.1f %7.2fx (%.2f..%.2f)\n", cs.name, flops / median(keel_s) * 1e-9,
                flops / median(dnnl_s) * 1e-9, median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                *std::max_element(ratio.begin(), ratio.end()));
  }
  return 0;
}
