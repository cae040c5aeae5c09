// The machine's fp32 FMA peak, measured: the ceiling against which docs/performance.md states
// the GEMMs' achieved GFLOP/s (kernels/fma_peak.hpp says how; `keel bench --peak` measures the same
// for the width a step's products run at). 256-bit (AVX2) and, where the CPU has it, 512-bit
// (AVX-512) registers, on 1 thread and on all of OpenMP's.
// Usage: fma_peak [seconds per measurement, default 0.5]
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "keel/core/cpu_info.hpp"
#include "keel/kernels/fma_peak.hpp"

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
  const int team = omp_get_max_threads();
  std::printf("CPU: %s; fp32 FMA peak, 12 independent chains per thread, best of 3\n", keel::cpu_description().c_str());
  for (const auto& [bits, name] : {std::pair{256, "AVX2    (256-bit)"}, std::pair{512, "AVX-512 (512-bit)"}}) {
    const double one = keel::kernels::measure_fma_peak(bits, 1, seconds);
    if (one == 0.0) continue;  // the CPU has no such FMAs
    std::printf("  %s: 1 thread %7.1f GFLOP/s, %d threads %7.1f GFLOP/s\n", name, one, team,
                keel::kernels::measure_fma_peak(bits, team, seconds));
  }
  return 0;
}
