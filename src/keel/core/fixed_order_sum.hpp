#pragma once
// Sums whose value does not depend on the thread count or the schedule: the range is cut into
// fixed chunks, each chunk summed in order on whichever thread takes it, and the chunk sums
// added in chunk order. An OpenMP reduction instead combines per-thread partials, so its last
// bits change with the team size, which the thread governor (core/thread_governor.hpp) varies.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace keel {

// terms(i0, i1) -> std::array<double, N>: the N sums over [i0, i1). Returns the N sums over [0, n).
template <size_t N, class Terms>
std::array<double, N> fixed_order_sum(int64_t n, Terms terms, int64_t chunk = int64_t{1} << 14) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  std::vector<std::array<double, N>> partial(static_cast<size_t>(std::max<int64_t>(chunks, 0)));
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) partial[static_cast<size_t>(c)] = terms(c * chunk, std::min(n, (c + 1) * chunk));
  std::array<double, N> total{};
  for (const auto& p : partial)
    for (size_t k = 0; k < N; ++k) total[k] += p[k];
  return total;
}

}  // namespace keel
