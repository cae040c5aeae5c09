#pragma once
// The ceilings a step's products are measured against (`keel bench --peak`, bench/fma_peak): the
// CPU's fp32 FMA peak at a vector width, and the rate keel's own gemm reaches on a large square
// product. docs/performance.md states the GEMMs' achieved GFLOP/s against both.
#include <cstdint>

namespace keel::kernels {

// GFLOP/s of `threads` threads each keeping 12 independent FMA chains busy on `bits`-wide
// registers (256: AVX2 + FMA, 512: AVX-512) for about `seconds`, best of three; the chains
// outnumber latency × pipes on Zen 3/4/5 and recent Intel cores, so the FMA pipes bound it.
// 0 where the CPU (or the target) has no such FMAs.
double measure_fma_peak(int bits, int threads, double seconds);

// GFLOP/s of keel's gemm (kernels/gemm.hpp, as a step calls it) on an n × n × n NN product on the
// current OpenMP team, best of `repeats` after one untimed call.
double measure_gemm_rate(int64_t n, int repeats);

}  // namespace keel::kernels
