#include "keel/core/stage_timer.hpp"

#include <omp.h>

#include <chrono>

namespace keel::stage_timer {

std::atomic<bool> g_enabled{false};

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  Totals totals;
  Stage current = Stage::Other;
  Clock::time_point last = Clock::now();
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
  return state.totals;
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

}  // namespace keel::stage_timer
