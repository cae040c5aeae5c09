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
#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

namespace keel::stage_timer {

// Packing: bf16 activation storage compacting a block's stretch after its forward and expanding it
// before its backward (nn/packed_activations.hpp).
enum class Stage : int { Gemm, Attention, Norm, Elementwise, Loss, Optimizer, Packing, Other, Count };
constexpr int kStages = static_cast<int>(Stage::Count);

std::string_view stage_name(Stage s);

// One shape of product and its share of the GEMM time: the form ("NT": op(A) = A, op(B) = Bᵀ, as a
// linear layer's forward x·Wᵀ), whether it ran in bf16, C's (m, n), the depth k, the calls and
// their wall time. Which products of a step run below the machine's rate is what a single
// gemm_gflops_per_s hides (docs/performance.md, "GEMM shapes").
struct GemmShape {
  char form[3] = "NN";
  bool bf16 = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t calls = 0;
  double seconds = 0;
};

struct Totals {
  std::array<double, kStages> seconds{};  // exclusive; Other is time inside no scope
  double gemm_flops = 0;                  // 2·m·n·k summed over the GEMMs timed
  std::vector<GemmShape> gemm_shapes;     // the outermost GEMM calls by shape, most time first
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

// A GEMM entry point's scope: charges Stage::Gemm as Scope does and, for the outermost GEMM call
// only (gemm_bf16 runs gemm_bf16_words_b, the portable path gemm), adds its wall time to its
// shape's row of Totals::gemm_shapes. FLOPs stay counted by add_gemm_flops where the product runs.
class GemmScope {
 public:
  GemmScope(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, bool bf16) : stage_(Stage::Gemm) {
    if (g_enabled.load(std::memory_order_relaxed)) open(trans_a, trans_b, m, n, k, bf16);
  }
  ~GemmScope() {
    if (counted_) close();
  }
  GemmScope(const GemmScope&) = delete;
  GemmScope& operator=(const GemmScope&) = delete;

 private:
  void open(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, bool bf16);
  void close();
  Scope stage_;
  bool counted_ = false;    // opened on the driving thread while enabled
  bool outermost_ = false;  // and no GemmScope was open there
  GemmShape shape_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace keel::stage_timer
