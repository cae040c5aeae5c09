#include "keel/core/stage_timer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

namespace keel::stage_timer {

std::atomic<bool> g_enabled{false};

namespace {

using Clock = std::chrono::steady_clock;

// A shape's key in State::shapes: form, bf16, m, n, k.
using ShapeKey = std::tuple<char, char, bool, int64_t, int64_t, int64_t>;

struct State {
  Totals totals;  // gemm_shapes is filled from shapes when totals() is asked for
  Stage current = Stage::Other;
  Clock::time_point last = Clock::now();
  std::map<ShapeKey, GemmShape> shapes;
  int gemm_depth = 0;  // GemmScopes open on the driving thread
};
State state;  // touched only by the driving thread (scopes inside parallel regions are ignored)

void charge_until(Clock::time_point now) {
  state.totals.seconds[static_cast<int>(state.current)] += std::chrono::duration<double>(now - state.last).count();
  state.last = now;
}

}  // namespace

std::string_view stage_name(Stage s) {
  switch (s) {
    case Stage::Gemm: return "gemm";
    case Stage::Attention: return "attention";
    case Stage::Norm: return "norms";
    case Stage::Elementwise: return "elementwise";
    case Stage::Loss: return "loss";
    case Stage::Optimizer: return "optimizer";
    case Stage::Packing: return "packing";
    case Stage::Other: return "other";
    case Stage::Count: break;
  }
  return "?";
}

void enable(bool on) {
  state = State{};
  g_enabled.store(on, std::memory_order_relaxed);
}

Totals totals() {
  if (g_enabled.load(std::memory_order_relaxed)) charge_until(Clock::now());
  Totals out = state.totals;
  for (const auto& [key, shape] : state.shapes) out.gemm_shapes.push_back(shape);
  std::stable_sort(out.gemm_shapes.begin(), out.gemm_shapes.end(),
                   [](const GemmShape& a, const GemmShape& b) { return a.seconds > b.seconds; });
  return out;
}

void Scope::open(Stage s) {
  if (omp_in_parallel()) return;
  active_ = true;
  charge_until(Clock::now());
  previous_ = state.current;
  state.current = s;
}

void Scope::close() {
  charge_until(Clock::now());
  state.current = previous_;
}

void add_gemm_flops(int64_t m, int64_t n, int64_t k) {
  if (!g_enabled.load(std::memory_order_relaxed) || omp_in_parallel()) return;
  state.totals.gemm_flops += 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

void GemmScope::open(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, bool bf16) {
  if (omp_in_parallel()) return;
  counted_ = true;
  if (state.gemm_depth++ > 0) return;
  outermost_ = true;
  shape_.form[0] = trans_a ? 'T' : 'N';
  shape_.form[1] = trans_b ? 'T' : 'N';
  shape_.bf16 = bf16;
  shape_.m = m, shape_.n = n, shape_.k = k;
  start_ = Clock::now();
}

void GemmScope::close() {
  --state.gemm_depth;
  if (!outermost_) return;
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  GemmShape& row = state.shapes.try_emplace(ShapeKey{shape_.form[0], shape_.form[1], shape_.bf16, shape_.m, shape_.n,
                                                     shape_.k},
                                            shape_)
                       .first->second;
  row.calls += 1;
  row.seconds += seconds;
}

}  // namespace keel::stage_timer
