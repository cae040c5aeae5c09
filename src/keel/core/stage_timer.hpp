#pragma once
// Where a training step's time goes: exclusive wall time per kind of work, charged on the thread
// that drives the step (the kernels parallelize inside), for `keel bench --json`'s "stages_ms"
// and docs/performance.md. Off unless enabled; a disabled scope costs one relaxed atomic load.
//
// Scopes nest and time is exclusive: a GEMM inside the fused LM-head loss is charged to Gemm,
// the loss's own softmax work to Loss. Scopes opened inside an OpenMP parallel region (a GEMM per
// expert run by one thread, say) are ignored, so nothing is counted twice.

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

namespace keel::stage_timer {

// Packing: bf16 activation storage compacting a block's stretch after its forward and expanding it
// before its backward (nn/packed_activations.hpp).
enum class Stage : int { Gemm, Attention, Norm, Elementwise, Loss, Optimizer, Packing, Other, Count };
constexpr int kStages = static_cast<int>(Stage::Count);

std::string_view stage_name(Stage s);

struct Totals {
  std::array<double, kStages> seconds{};  // exclusive; Other is time inside no scope
  double gemm_flops = 0;                  // 2·m·n·k summed over the GEMMs timed
};

extern std::atomic<bool> g_enabled;

// Starts (or stops) timing and zeroes the totals; call between steps.
void enable(bool on);
Totals totals();  // up to now; Other includes the time since the last scope closed

class Scope {
 public:
  explicit Scope(Stage s) {
    if (g_enabled.load(std::memory_order_relaxed)) open(s);
  }
  ~Scope() {
    if (active_) close();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void open(Stage s);
  void close();
  bool active_ = false;
  Stage previous_ = Stage::Other;
};

// Counts a GEMM's FLOPs (when enabled and outside parallel regions).
void add_gemm_flops(int64_t m, int64_t n, int64_t k);

}  // namespace keel::stage_timer
