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

// Σ x[i]² over [i0, i1) in double, in 16 fixed lanes (lane i mod 16 of the range) added in lane
// order at the end: the same bits for the same range on every run and team, and a loop GCC
// vectorizes. A single running sum is a chain of dependent adds, and the gradient norm's pass
// took as long as AdamW's update (perf of the d512 step).
inline double sum_of_squares_in_lanes(const float* x, int64_t i0, int64_t i1) {
  constexpr int64_t kLanes = 16;
  double lanes[kLanes] = {};
  int64_t i = i0;
  for (; i + kLanes <= i1; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(x[i + l]) * x[i + l];
  double s = 0.0;
  for (int64_t l = 0; l < kLanes; ++l) s += lanes[l];
  for (; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace keel
