// Blockwise attention alone, forward and backward, at a training shape: median seconds of each
// and the rate over the causal FLOP count (the blocks computed, masked halves included, are
// ~(T/64 + 1)/(2·T/64) of a full T×T product). Usage: attention_bench [B T H Dk Dv REPEATS HKV]
// (HKV: kv heads, H by default; 1 is MQA).
// docs/performance.md, "Attention's blocks".
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "keel/core/cpu_info.hpp"
#include "keel/kernels/attention.hpp"
#include "keel/kernels/block_gemm.hpp"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; };
  const int64_t B = arg(1, 8), T = arg(2, 256), H = arg(3, 4), Dk = arg(4, 64), Dv = arg(5, Dk);
  const int repeats = int(arg(6, 9));
  const int64_t Hkv = arg(7, H);
  keel::kernels::AttentionDims d{B, T, H, Hkv, Dk, Dv, float(1 / std::sqrt(double(Dk)))};
  std::vector<float> q(size_t(B * T * H * Dk)), k(size_t(B * T * Hkv * Dk)), v(size_t(B * T * Hkv * Dv));
  std::vector<float> out(size_t(B * T * H * Dv)), dout(out.size());
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), lse(size_t(B * H * T));
  std::vector<float> mx(static_cast<size_t>(H), -1e30f);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(float(i) * 0.37f);
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(float(i) * 0.11f);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i) * 0.05f);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = std::cos(float(i) * 0.23f);
  // Causal FLOPs: QKᵀ and PV forward, five products backward, over half the T×T scores.
  const double half = double(T) * double(T + 1) / 2, fwd = 2 * half * double(B * H) * double(Dk + Dv);
  const double bwd = 2 * half * double(B * H) * double(3 * Dk + 2 * Dv);
  std::vector<double> tf, tb;
  for (int r = 0; r < repeats + 1; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    keel::kernels::attention_forward(q.data(), k.data(), v.data(), out.data(), lse.data(), mx.data(), d);
    auto t1 = std::chrono::steady_clock::now();
    keel::kernels::attention_backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                                      dk.data(), dv.data(), d);
    auto t2 = std::chrono::steady_clock::now();
    if (r == 0) continue;  // first call: buffers and pages
    tf.push_back(std::chrono::duration<double>(t1 - t0).count());
    tb.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  const double f = median(tf), b = median(tb);
  std::printf("CPU: %s; microkernel: %s; threads %d; B %ld T %ld H %ld Hkv %ld Dk %ld Dv %ld\n", keel::cpu_description().c_str(),
              keel::kernels::block_gemm_isa(), omp_get_max_threads(), long(B), long(T), long(H), long(Hkv), long(Dk),
              long(Dv));
  std::printf("forward  %8.3f ms  %6.1f GFLOP/s\nbackward %8.3f ms  %6.1f GFLOP/s\n", f * 1e3, fwd / f * 1e-9,
              b * 1e3, bwd / b * 1e-9);
  return 0;
}
