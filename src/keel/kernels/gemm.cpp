#include "keel/core/stage_timer.hpp"
#include "keel/kernels/gemm.hpp"

// The backend is chosen at configure time (cmake/gemm_backend.cmake): oneDNN by default, as
// measured fastest on our target CPUs; OpenBLAS (OpenMP build) through cblas otherwise. Beside
// oneDNN, OpenBLAS's OpenMP build where installed, for the products it runs faster on CPUs
// without AVX-512 (gemm_panel_kernel).
#if KEEL_GEMM_DNNL
#include <dnnl.h>
#endif
#if !KEEL_GEMM_DNNL || KEEL_GEMM_OPENBLAS_BESIDE
#include <cblas.h>
// OpenBLAS's own export (its cblas.h declares it; a netlib cblas.h picked by the alternatives
// would not): the kernel family it chose for this CPU, "Haswell" say.
extern "C" char* openblas_get_corename(void);
#endif

#include <omp.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <type_traits>
#include <vector>

#include "keel/core/bf16.hpp"
#include "keel/core/env_settings.hpp"
#include "keel/core/error.hpp"
#include "keel/core/kept_buffer.hpp"
#include "keel/kernels/block_gemm.hpp"
#include "keel/kernels/precision.hpp"

#if KEEL_GEMM_DNNL
// Exported by libdnnl (oneDNN 1.x-2.x, src/common/gemm.cpp) but declared only in its own test
// headers: row-major, cblas argument order like dnnl_sgemm, bf16 A and B as raw 16-bit words
// (oneDNN's bfloat16_t is a struct holding one uint16_t), fp32 C.
extern "C" dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K,
                                               float alpha, const uint16_t* A, dnnl_dim_t lda, const uint16_t* B,
                                               dnnl_dim_t ldb, float beta, float* C, dnnl_dim_t ldc);
#endif

namespace keel::kernels {

namespace {

// One single-threaded (or, outside a parallel region, library-threaded) call of the library that
// `kernel` names: the backend, or OpenBLAS beside it (gemm_panel_kernel picks OpenBLAS only in a
// build that links it).
void backend_gemm(PanelKernel kernel, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  (void)kernel;
#if !KEEL_GEMM_DNNL || KEEL_GEMM_OPENBLAS_BESIDE
  if (!KEEL_GEMM_DNNL || kernel == PanelKernel::Openblas) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m),
                int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
    return;
  }
#endif
#if KEEL_GEMM_DNNL
  // dnnl_sgemm is row-major with the same argument order as cblas.
  const dnnl_status_t st =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  KEEL_CHECK(st == dnnl_success);
#endif
}

}  // namespace

namespace {

std::atomic<int> pad_aliased_b_mode{static_cast<int>(PadAliasedB::Auto)};
// KEEL_TN_PANELS=transposed|as-is (read once) overrides Auto, for A/B runs.
TransposeTnPanels env_transpose_tn_panels() {
  const std::string_view v = env_setting("KEEL_TN_PANELS");
  if (v == "transposed") return TransposeTnPanels::Always;
  if (v == "as-is") return TransposeTnPanels::Never;
  return TransposeTnPanels::Auto;
}
std::atomic<int> transpose_tn_mode{static_cast<int>(env_transpose_tn_panels())};

#if KEEL_GEMM_DNNL && defined(__x86_64__)
// Whether oneDNN's kernels may use `isa`: the CPU must have it and ONEDNN_MAX_CPU_ISA must not
// cap oneDNN below it (the effective ISA is the CPU's, or less under the cap).
bool dnnl_allows(dnnl_cpu_isa_t isa) {
  const unsigned effective = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (effective & static_cast<unsigned>(isa)) == static_cast<unsigned>(isa);
}
#endif

bool backend_lacks_avx512() {
#if KEEL_GEMM_DNNL && defined(__x86_64__)
  return !dnnl_allows(dnnl_cpu_isa_avx512_core);
#else
  return false;  // not measured with OpenBLAS or off x86
#endif
}

// KEEL_GEMM=packed|backend|openblas (read once) overrides Auto, for benchmarks and A/B runs.
GemmKernel env_gemm_kernel() {
  const std::string_view v = env_setting("KEEL_GEMM");
  if (v == "packed") return GemmKernel::Packed;
  if (v == "backend") return GemmKernel::Backend;
  if (v == "openblas") return GemmKernel::Openblas;
  return GemmKernel::Auto;
}

std::atomic<int> gemm_kernel_mode{static_cast<int>(env_gemm_kernel())};

}  // namespace

void set_gemm_kernel(GemmKernel kernel) { gemm_kernel_mode.store(static_cast<int>(kernel)); }

bool openblas_core_has_avx2(std::string_view core) {
  // OpenBLAS 0.3.21's families with AVX2 or AVX-512 GEMM kernels. A DYNAMIC_ARCH build (Debian's)
  // names them in mixed case, a build for one CPU in capitals ("HASWELL"): compared either way.
  auto same = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
        return false;
    return true;
  };
  for (std::string_view known : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"})
    if (same(core, known)) return true;
  return false;
}

bool gemm_openblas_beside_backend() {
#if KEEL_GEMM_DNNL && KEEL_GEMM_OPENBLAS_BESIDE
  // OpenBLAS takes the products it was measured faster on only where it runs its AVX2 kernels;
  // on a CPU it does not know it falls back to SSE ones, and oneDNN and keel's kernels keep them.
  static const bool usable = openblas_core_has_avx2(openblas_get_corename());
  return usable;
#else
  return false;
#endif
}

std::string openblas_core_note(OpenblasRole role, std::string_view core, bool cpu_avx2, std::string_view coretype) {
  if (role == OpenblasRole::None || !cpu_avx2 || openblas_core_has_avx2(core)) return "";
  std::string what;
  switch (role) {
    case OpenblasRole::Beside:
      // `bench/binary_ab.sh` with and without OpenBLAS beside oneDNN on AVX2 code: 3.4-4.3% on one
      // Intel Xeon, 5% on another (docs/performance.md).
      what = "the products keel hands it on AVX2 code stay on oneDNN and keel's kernels (3-5% slower, measured on "
             "Intel Xeons)";
      break;
    case OpenblasRole::Forced: what = "KEEL_GEMM=openblas is ignored and oneDNN runs every product"; break;
    default: what = "every product runs at a fraction of this CPU's rate"; break;
  }
  return "OpenBLAS picked its " + std::string(core) + " kernels, without AVX2 (it does not know this CPU), so " +
         what + "; OPENBLAS_CORETYPE=" + std::string(coretype) + " in the environment gives it " + std::string(coretype) +
         "'s (docs/blas.md)";
}

std::string openblas_core_note() {
#if defined(__x86_64__) && (!KEEL_GEMM_DNNL || KEEL_GEMM_OPENBLAS_BESIDE)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f");
#if KEEL_GEMM_DNNL
  // Auto offers OpenBLAS products only on AVX2 code (Haswell kernels are the ones to ask for, as
  // on an AVX2 CPU); KEEL_GEMM=openblas offers it every product, at the CPU's full width.
  const auto mode = static_cast<GemmKernel>(gemm_kernel_mode.load());
  const OpenblasRole role = mode == GemmKernel::Openblas                  ? OpenblasRole::Forced
                            : mode == GemmKernel::Auto && gemm_below_avx512() ? OpenblasRole::Beside
                                                                          : OpenblasRole::None;
  const bool wide = avx512 && role == OpenblasRole::Forced && !backend_lacks_avx512();
  return openblas_core_note(role, openblas_get_corename(), avx2, wide ? "SkylakeX" : "Haswell");
#else
  return openblas_core_note(OpenblasRole::Only, openblas_get_corename(), avx2, avx512 ? "SkylakeX" : "Haswell");
#endif
#else
  return "";
#endif
}

std::string openblas_core_name() {
#if !KEEL_GEMM_DNNL || KEEL_GEMM_OPENBLAS_BESIDE
  return openblas_get_corename();
#else
  return "";
#endif
}

bool gemm_below_avx512() {
  // The AVX2 microkernel in the build and oneDNN held below AVX-512 (by the CPU or a cap).
  static const bool below = std::strcmp(block_gemm_isa(), "avx2") == 0 && backend_lacks_avx512();
  return below;
}

PanelKernel gemm_panel_kernel(bool trans_a, bool trans_b, int64_t ldb) {
  const bool microkernel = std::strcmp(block_gemm_isa(), "gemm") != 0;
  switch (static_cast<GemmKernel>(gemm_kernel_mode.load(std::memory_order_relaxed))) {
    case GemmKernel::Packed: return microkernel ? PanelKernel::Packed : PanelKernel::Backend;
    case GemmKernel::Backend: return PanelKernel::Backend;
    case GemmKernel::Openblas: return gemm_openblas_beside_backend() ? PanelKernel::Openblas : PanelKernel::Backend;
    case GemmKernel::Auto: break;
  }
  // Auto is measured on the AVX2 microkernel only; the AVX-512 one ran below oneDNN's AVX-512
  // kernels, and so did OpenBLAS's (docs/blas.md).
  if (!gemm_below_avx512()) return PanelKernel::Backend;
  const bool packed_stride = ldb % kGemmPackedStride == 0;
  if (gemm_openblas_beside_backend()) {
    // In steps on an Intel Xeon running AVX2 code (docs/performance.md, "OpenBLAS beside oneDNN
    // on AVX2"): OpenBLAS's Haswell kernels ran the weight gradients (TN) at 166-183 GFLOP/s
    // against 136-164 for the packed kernel, and NN products whose B has a row stride of a
    // multiple of 512 floats at 179-186 against 151-181; the packed kernel kept the NT ones with
    // that stride (172-187 against 170-176), and oneDNN the other strides (within noise of
    // OpenBLAS, or ahead: the LM head's dx 172-184 against 167-171).
    if (trans_a || (!trans_b && packed_stride)) return PanelKernel::Openblas;
    return packed_stride ? PanelKernel::Packed : PanelKernel::Backend;
  }
  // In a step under oneDNN's AVX2 kernels (docs/performance.md, "keel's own GEMM on AVX2"): the
  // packed kernel ran weight gradients (TN) faster at every width, and NN and NT products whose B
  // has a row stride of a multiple of 512 floats (2 KiB: the d512 model's weights) at 145-171
  // GFLOP/s against oneDNN's 103-123; other strides measured within noise of oneDNN.
  return trans_a || packed_stride ? PanelKernel::Packed : PanelKernel::Backend;
}

bool gemm_uses_packed_kernel(bool trans_a, bool trans_b, int64_t ldb) {
  return gemm_panel_kernel(trans_a, trans_b, ldb) == PanelKernel::Packed;
}

void set_pad_aliased_b(PadAliasedB mode) { pad_aliased_b_mode.store(static_cast<int>(mode)); }

namespace {

// Auto pads for oneDNN below AVX-512 only: OpenBLAS's kernels were measured without the copy.
bool pads_aliased_b(PanelKernel kernel) {
  static const bool automatic = backend_lacks_avx512();
  switch (static_cast<PadAliasedB>(pad_aliased_b_mode.load(std::memory_order_relaxed))) {
    case PadAliasedB::Always: return true;
    case PadAliasedB::Never: return false;
    case PadAliasedB::Auto: break;
  }
  return automatic && kernel == PanelKernel::Backend;
}

}  // namespace

bool gemm_pads_aliased_b() { return pads_aliased_b(PanelKernel::Backend); }

void set_transpose_tn_panels(TransposeTnPanels mode) { transpose_tn_mode.store(static_cast<int>(mode)); }

// Auto transposes for oneDNN on AVX-512, where the NN form was measured faster; OpenBLAS and the
// packed kernel take the TN form as it is (the packed kernel packs A either way).
bool gemm_transposes_tn_panels(PanelKernel kernel) {
  if (kernel == PanelKernel::Packed) return false;
  switch (static_cast<TransposeTnPanels>(transpose_tn_mode.load(std::memory_order_relaxed))) {
    case TransposeTnPanels::Always: return true;
    case TransposeTnPanels::Never: return false;
    case TransposeTnPanels::Auto: break;
  }
  static const bool automatic = KEEL_GEMM_DNNL && !backend_lacks_avx512();
  return automatic && kernel == PanelKernel::Backend;
}

GemmPanels gemm_panels(int64_t m, int64_t n, int64_t k) {
  // C wider than kGemmPanelCols is cut into equal column panels (1,536 into 2 × 768, not 1,024
  // and 512): with a ragged last column a step's panels differ in size and the dynamic schedule
  // ends unbalanced. The d512 model's 2,048 × 1,536 × 512 forward went from 303-310 to 312-318
  // GFLOP/s on 2 threads of an Intel Xeon (docs/performance.md, "Intel Xeon a third time").
  const int64_t col_parts = (n + kGemmPanelCols - 1) / kGemmPanelCols;
  GemmPanels p{std::min(m, kGemmPanelRows), std::min(n, ((n + col_parts - 1) / col_parts + 15) / 16 * 16)};
  auto count = [&] { return ((m + p.rows - 1) / p.rows) * ((n + p.cols - 1) / p.cols); };
  auto flops = [&] { return 2.0 * double(p.rows) * double(p.cols) * double(k); };
  auto half = [](int64_t x) { return (x / 2 + 15) / 16 * 16; };  // halves on 16-column boundaries
  // Enough panels that a dynamic schedule balances a few threads, none so small that the
  // backend's per-call packing dominates.
  while (count() < kGemmMinPanels && flops() >= 2 * kGemmPanelMinFlops) {
    if (p.rows >= 128 && (p.rows >= p.cols / 2 || p.cols < 128)) p.rows = half(p.rows);
    else if (p.cols >= 128) p.cols = half(p.cols);
    else break;
  }
  return p;
}

int64_t gemm_k_parts(bool trans_a, bool /*trans_b*/, int64_t m, int64_t n, int64_t k) {
  // Measured on the weight gradients of d256-d512 layers (2,048 tokens, 2 threads of an Intel
  // Xeon, docs/performance.md "Intel Xeon a fourth time"): a 256 × 1,024 × 2,048 TN product in
  // panels of 128 × 256 runs at 224-247 GFLOP/s, cut into 4 slices of k at 285-290; 512 × 512
  // at 233-243 against 265-272; with 1,024 rows or more, slices lost. The panels of a C this
  // small each pack their share of both operands for the whole k; a slice packs each once.
  if (!trans_a || m > kGemmSplitKMaxRows || m * n > kGemmSplitKMaxC) return 1;
  // No slice smaller than the smallest panel: a tiny product stays one call.
  const double slices_by_work = 2.0 * double(m) * double(n) * double(k) / kGemmPanelMinFlops;
  return std::clamp<int64_t>(std::min<int64_t>(k / kGemmSplitKMinSlice, int64_t(slices_by_work)), 1, 4);
}

bool gemm_swaps_operands(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k) {
  // Measured in the step on 2 threads of an Intel Xeon (docs/performance.md, "Intel Xeon a
  // fourth time"): a 1,024 × 256 × 2,048 weight gradient runs at 251-259 GFLOP/s in panels, as
  // its transpose 256 × 1,024 cut along k at 257-282. Transposing C back is one pass over m·n
  // floats against m·n·k multiply-adds. (The LM head's 8,192 × 256 × 1,024 is faster as its
  // transpose too in a harness, 284-300 against 240-257, but too large a C to be cut along k:
  // in the step the pass ate the gain.)
  return trans_a && !trans_b && n <= kGemmSwapMaxCols && m >= 2 * n && gemm_k_parts(true, false, n, m, k) > 1;
}

// C: (m, n) = alpha·op(A)(m, k)·op(B)(k, n) + beta·C
//
// keel schedules the threads itself: C is cut into panels by a rule of the shape alone
// (gemm_panels), and the threads of one OpenMP team take panels as they come free, each running
// the backend single-threaded on its panel. So (1) every element of C is computed by the same
// call whatever the thread count or whichever thread runs it: results do not depend on the
// number of threads, which lets the thread governor change it between steps; (2) a thread the
// OS preempts holds back only the panel it is on, the others take the rest, which is what keeps
// a step fast on a loaded machine (docs/performance.md, "Under load"); (3) each panel is a shape
// the backend handles well on one core (oneDNN 2.6 runs a TN product with M >= 1024 and N = 256
// at 38 GFLOP/s on one Zen 3 core, and at 80 with M <= 768).
namespace {

// C = alpha·op(A)·op(B) + beta·C as `parts` slices of k, each one backend call on one thread over
// the whole of C: the first into C (with beta), the others into kept buffers, then added to C in
// slice order. Which call computes which slice, and the order of the sums, depend on the shape
// alone: the bits do not depend on the thread count.
void gemm_split_k(PanelKernel kernel, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t parts,
                  float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) {
  const int64_t slice = (k + parts - 1) / parts;
  thread_local KeptBuffer<float> kept_partials;
  float* partials = kept_partials.get(size_t((parts - 1) * m * n));
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t part = 0; part < parts; ++part) {
      const int64_t p0 = part * slice, kp = std::min(slice, k - p0);
      const float* ap = trans_a ? a + p0 * lda : a + p0;  // A stored (k, m) when transposed
      const float* bp = trans_b ? b + p0 : b + p0 * ldb;  // B stored (n, k) when transposed
      if (part == 0) backend_gemm(kernel, trans_a, trans_b, m, n, kp, alpha, ap, lda, bp, ldb, beta, c, ldc);
      else
        backend_gemm(kernel, trans_a, trans_b, m, n, kp, alpha, ap, lda, bp, ldb, 0.f, partials + (part - 1) * m * n,
                     n);
    }  // the for's barrier: every slice is done before the sums read them
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      float* ci = c + i * ldc;
      for (int64_t part = 1; part < parts; ++part) {
        const float* pi = partials + (part - 1) * m * n + i * n;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) ci[j] += pi[j];
      }
    }
  }
}

// gemm, or with round_bf16 gemm_bf16's portable path: keel's packed kernel on every panel, its
// operands rounded to bf16 as they are packed.
void gemm_body(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool round_bf16,
               const float* bias = nullptr);

// C(rows, cols) += bias(cols) in every row: a linear layer's bias, added once C is final.
void add_bias_rows(float* c, int64_t rows, int64_t cols, int64_t ldc, const float* bias) {
  for (int64_t i = 0; i < rows; ++i) {
    float* ci = c + i * ldc;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) ci[j] += bias[j];
  }
}

// add_bias_rows over the whole of C, by the team where the caller is not inside a parallel region.
void add_bias_pass(float* c, int64_t rows, int64_t cols, int64_t ldc, const float* bias) {
  if (bias == nullptr) return;
  constexpr int64_t kRows = 64;
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && rows * cols > 16384)
  for (int64_t i0 = 0; i0 < rows; i0 += kRows)
    add_bias_rows(c + i0 * ldc, std::min(kRows, rows - i0), cols, ldc, bias);
}

// C = beta·C + alpha·op(A)·op(B) computed as its transpose T = alpha·Bᵀ·A (n × m, the TN form
// with the operands' roles exchanged), then added to C transposed.
void gemm_swapped(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local KeptBuffer<float> kept_transposed;
  float* t = kept_transposed.get(size_t(n * m));
  gemm_body(true, false, n, m, k, alpha, b, ldb, a, lda, 0.f, t, m, false);
  // C's rows in blocks of 64, each a 64-column strip of T transposed through a tile in L1.
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < m; i0 += kBlock) {
    alignas(64) float tile[kBlock * kBlock];
    const int64_t rows = std::min(kBlock, m - i0);
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
      const int64_t cols = std::min(kBlock, n - j0);
      transpose_block(t + j0 * m + i0, cols, rows, m, tile, kBlock);  // tile[i][j] = T[j0 + j][i0 + i]
      for (int64_t i = 0; i < rows; ++i) {
        float* ci = c + (i0 + i) * ldc + j0;
        const float* ti = tile + i * kBlock;
        if (beta == 0.f) {
          std::memcpy(ci, ti, sizeof(float) * size_t(cols));  // beta == 0 ignores C, as BLAS does
        } else {
#pragma omp simd
          for (int64_t j = 0; j < cols; ++j) ci[j] = beta * ci[j] + ti[j];
        }
      }
    }
  }
}

void gemm_run(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool round_bf16,
              const float* bias = nullptr) {
  stage_timer::GemmScope gemm_scope(trans_a, trans_b, m, n, k, round_bf16);
  stage_timer::add_gemm_flops(m, n, k);
  gemm_body(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, round_bf16, bias);
}

void gemm_body(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool round_bf16, const float* bias) {
  if (m == 0 || n == 0) return;
  // cblas takes int dimensions; a silent wrap would corrupt memory. (Checked for both backends
  // so the limits do not depend on the build.)
  KEEL_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
  if (k == 0) {
    gemm_scale_c(m, n, beta, c, ldc);  // some BLAS builds return early on k == 0 without applying beta
    add_bias_pass(c, m, n, ldc, bias);
    return;
  }
  const PanelKernel kernel = round_bf16 ? PanelKernel::Packed : gemm_panel_kernel(trans_a, trans_b, ldb);
  const bool packed = kernel == PanelKernel::Packed;
  // keel's kernel: the team packs B once and shares it (block_gemm.cpp); too large a B takes the
  // panels below, each packing its own.
  if (packed && !omp_in_parallel() &&
      packed_gemm_team(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, round_bf16)) {
    add_bias_pass(c, m, n, ldc, bias);
    return;
  }
  if (!packed && !omp_in_parallel()) {
    if (gemm_swaps_operands(trans_a, trans_b, m, n, k)) {
      gemm_swapped(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      add_bias_pass(c, m, n, ldc, bias);
      return;
    }
    const int64_t parts = gemm_k_parts(trans_a, trans_b, m, n, k);
    if (parts > 1) {
      gemm_split_k(kernel, trans_a, trans_b, m, n, k, parts, alpha, a, lda, b, ldb, beta, c, ldc);
      add_bias_pass(c, m, n, ldc, bias);
      return;
    }
  }
  const GemmPanels p = gemm_panels(m, n, k);
  const int64_t row_panels = (m + p.rows - 1) / p.rows, col_panels = (n + p.cols - 1) / p.cols;
  const int64_t panels = row_panels * col_panels;
  auto run_panel = [&](int64_t panel) {
    const int64_t i0 = (panel / col_panels) * p.rows, j0 = (panel % col_panels) * p.cols;
    const int64_t mi = std::min(p.rows, m - i0), nj = std::min(p.cols, n - j0);
    const float* ap = trans_a ? a + i0 : a + i0 * lda;  // A stored (k, m) when transposed
    const float* bp = trans_b ? b + j0 * ldb : b + j0;  // B stored (n, k) when transposed
    float* cp = c + i0 * ldc + j0;
    thread_local KeptBuffer<float> panel_a;
    if (packed) {
      // Packing copies both operands into cache-sized blocks: no stride aliases.
      packed_gemm(trans_a, trans_b, mi, nj, k, alpha, ap, lda, bp, ldb, beta, cp, ldc, round_bf16);
    } else if (trans_a && gemm_transposes_tn_panels(kernel)) {
      // A weight gradient's panel as an NN product: its k × mi slice of A transposed into a
      // buffer (mi rows of k at a stride off the aliasing multiples) that the product reads
      // contiguously. oneDNN's AVX-512 kernels run the NN form 4-8% faster at the step's shapes
      // (docs/performance.md, "Intel Xeon, a sixth session"); A is read once to be copied, as
      // the padded copy below reads it.
      const int64_t ld = gemm_unaliased_stride(k);
      float* transposed = panel_a.get(size_t(mi * ld));
      transpose_block(ap, k, mi, lda, transposed, ld);
      backend_gemm(kernel, false, trans_b, mi, nj, k, alpha, transposed, ld, bp, ldb, beta, cp, ldc);
    } else {
      int64_t ap_ld = lda;
      if (trans_a && lda % kGemmAliasedStrideA == 0 && lda > mi) {
        // A transposed with a row stride of a multiple of 1 KiB (a weight gradient dyᵀ·x of a
        // layer 1,024 or 8,192 wide): the backend's reads of the panel's k rows then fall into a
        // few cache sets and run at half speed (38 against 80 GFLOP/s on one Zen 3 core). Copy
        // the panel to a padded stride first; it is read once, the product reads it n/16 times.
        ap_ld = mi + 16;
        float* padded = panel_a.get(size_t(k * ap_ld));
        for (int64_t r = 0; r < k; ++r) std::memcpy(padded + r * ap_ld, ap + r * lda, sizeof(float) * size_t(mi));
        ap = padded;
      }
      backend_gemm(kernel, trans_a, trans_b, mi, nj, k, alpha, ap, ap_ld, bp, ldb, beta, cp, ldc);
    }
    if (bias != nullptr) add_bias_rows(cp, mi, nj, ldc, bias + j0);  // the panel is still in cache
  };
  if (omp_in_parallel()) {
    // Inside a parallel region (a GEMM per expert, per attention block) the caller shares the
    // work; the backend then runs on this thread alone.
    for (int64_t panel = 0; panel < panels; ++panel) run_panel(panel);
    return;
  }
  // B untransposed with a row stride of a multiple of 4 KiB (a Conv1D weight 1,024 or 3,072
  // wide, or such an activation's gradient as the B of a weight gradient xᵀ·dy): the k rows the
  // backend packs for each panel then share a few L1 sets. With oneDNN's AVX2 kernels (Zen 4
  // capped at AVX2), GPT-2's c_fc forward and weight gradient ran at 79-91 GFLOP/s in a step
  // against 145-200 for the other shapes, and at 150-164 with B padded; its AVX-512 kernels do
  // not care (docs/performance.md, "AVX2 code"). Copy B once to a padded stride that every panel
  // then reads; the copy is k·n floats against m·n·k multiply-adds, so only where m pays for it.
  const float* b_source = b;
  const int64_t b_source_ld = ldb;
  const bool pad_b =
      !packed && !trans_b && ldb % kGemmAliasedStride == 0 && m >= kGemmPadBMinRows && pads_aliased_b(kernel);
  // A weight gradient's B has a row per token: kept per thread up to 32 MiB, and beyond that
  // allocated for this call only, so a long-sequence step does not hold a token-sized copy.
  thread_local KeptBuffer<float> kept_padded_b;
  KeptBuffer<float> call_padded_b;
  if (pad_b) {
    ldb = (n + 15) / 16 * 16 + 16;  // 64-byte rows, off the aliasing stride
    if (ldb % kGemmAliasedStride == 0) ldb += 16;
    const int64_t need = k * ldb;
    b = (static_cast<size_t>(need) <= kGemmKeptPaddedB ? kept_padded_b : call_padded_b).get(size_t(need));
  }
  auto copy_b_rows = [&](int64_t r) {
    std::memcpy(const_cast<float*>(b) + r * ldb, b_source + r * b_source_ld, sizeof(float) * size_t(n));
  };
  if (panels == 1) {
    // One panel runs on one thread too, so that the backend never picks a split of its own
    // that depends on the team size.
    if (pad_b)
      for (int64_t r = 0; r < k; ++r) copy_b_rows(r);
    const int team = omp_get_max_threads();
    omp_set_num_threads(1);
    run_panel(0);
    omp_set_num_threads(team);
    return;
  }
#pragma omp parallel
  {
    if (pad_b) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < k; ++r) copy_b_rows(r);
    }  // the for's barrier: B is whole before any panel reads it
#pragma omp for schedule(dynamic, 1)
    for (int64_t panel = 0; panel < panels; ++panel) run_panel(panel);
  }
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, false);
}

void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  gemm_run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, false, bias);
}

namespace {

Bf16GemmChoice env_bf16_gemm_choice() {
  const std::string_view v = env_setting("KEEL_BF16_GEMM");
  if (v == "portable") return Bf16GemmChoice::Portable;
  if (v == "native") return Bf16GemmChoice::Native;
  return Bf16GemmChoice::Auto;
}

std::atomic<Bf16GemmChoice> current_bf16_gemm_choice{env_bf16_gemm_choice()};

// The rounded operands gemm_bf16 makes on a thread (the native path's bf16 words, the portable
// path's rounded fp32 copies) live in one buffer of each kind used as a stack: a product's for the
// call, a SharedBf16Operand's for its life. So the memory is the most ever live at once (a shared
// output gradient beside the other operand of one product), not one kept buffer per role each
// grown to the largest operand it ever held. The buffer grows only while nothing is on it
// (pointers into it stay valid); a push that does not fit meanwhile gets a block of its own, and
// the next growth covers it.
template <class T>
class ScratchStack {
 public:
  struct Entry {
    T* data;
    size_t count;
    bool own_block;
  };
  Entry push(size_t count) {
    high_water_ = std::max(high_water_, top_ + count);
    if (top_ == 0) buffer_.get(high_water_);  // grows only while nothing is on it
    if (top_ + count <= buffer_.size()) {
      Entry e{buffer_.data() + top_, count, false};
      top_ += count;
      return e;
    }
    blocks_.emplace_back(count);
    return {blocks_.back().data(), count, true};
  }
  // Entries come off in the reverse order they went on.
  void pop(const Entry& e) {
    if (e.own_block) {
      blocks_.pop_back();
      return;
    }
    top_ -= e.count;
  }

 private:
  KeptBuffer<T> buffer_;  // counted in kept_scratch_bytes
  std::vector<std::vector<T>> blocks_;
  size_t top_ = 0, high_water_ = 0;
};
using WordStack = ScratchStack<uint16_t>;
thread_local WordStack word_stack;
using FloatStack = ScratchStack<float>;
thread_local FloatStack float_stack;

// The live SharedBf16Operands of this thread, innermost last.
struct SharedOperandEntry {
  const float* x;
  int64_t rows, cols, ld;
  WordStack::Entry words;                 // native: the bf16 words
  std::optional<FloatStack::Entry> copy;  // portable: the values rounded into a contiguous copy
  const float* rounded = nullptr;         // portable: x's values as bf16 (copy or x itself)
  int64_t rounded_ld = 0;
};
thread_local std::vector<SharedOperandEntry> shared_operands;

// The stored matrix x: (rows, cols), row stride ld -> out: (rows, cols) contiguous, each value
// rounded to bf16; Out is uint16_t (bf16 bits) or float (the same value widened).
template <typename Out>
void round_operand(const float* x, int64_t rows, int64_t cols, int64_t ld, Out* out) {
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x + r * ld;
    Out* dst = out + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      if constexpr (std::is_same_v<Out, uint16_t>) dst[j] = float_to_bf16(src[j]);
      else dst[j] = bf16_to_float(float_to_bf16(src[j]));
    }
  }
}


// x rounded onto a scratch stack for one product (bf16 words or fp32 values, as round_operand
// makes them); `pushed` says what to pop when the product is done.
template <class T>
T* round_onto(ScratchStack<T>& stack, const float* x, int64_t rows, int64_t cols, int64_t ld,
              std::optional<typename ScratchStack<T>::Entry>& pushed) {
  pushed = stack.push(size_t(rows * cols));
  round_operand(x, rows, cols, ld, pushed->data);
  return pushed->data;
}

// Whether every value of the stored matrix x is a bf16 value already (its low 16 bits zero), as
// an activation rounded where it was made is: then rounding it changes nothing. Stops at the first
// value that is not; read-only.
bool holds_bf16_values(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(x + r * ld);
    uint32_t low = 0;
#pragma omp simd reduction(| : low)
    for (int64_t j = 0; j < cols; ++j) low |= row[j];
    if ((low & 0xffffu) != 0) return false;
  }
  return true;
}

}  // namespace

bool bf16_gemm_native_available() {
#if KEEL_GEMM_DNNL && defined(__x86_64__)
  // The CPU must have the instructions and oneDNN must be allowed to use them: ONEDNN_MAX_CPU_ISA
  // (say AVX2, to see what a CPU without AVX-512 does) caps the ISA its kernels may use, and its
  // bf16 gemm then refuses to run rather than fall back.
  static const bool available =
      __builtin_cpu_supports("avx512bf16") && dnnl_allows(dnnl_cpu_isa_avx512_core_bf16);
  return available;
#else
  return false;
#endif
}

Bf16CpuTraits bf16_cpu_traits() {
  Bf16CpuTraits cpu;
  cpu.native_available = bf16_gemm_native_available();
#if KEEL_GEMM_DNNL && defined(__x86_64__)
  // oneDNN's own answer, so a CPU whose AMX the kernel or the hypervisor withholds (or that
  // ONEDNN_MAX_CPU_ISA caps below it) counts as without it.
  cpu.amx_bf16 = dnnl_allows(dnnl_cpu_isa_avx512_core_amx);
#endif
#if defined(__x86_64__)
  cpu.amd = __builtin_cpu_is("amd") != 0;
  cpu.cpu_has_bf16 = __builtin_cpu_supports("avx512bf16") != 0;
#endif
  return cpu;
}

bool bf16_native_pays(const Bf16CpuTraits& cpu) { return cpu.native_available && (cpu.amx_bf16 || cpu.amd); }

Bf16GemmPath choose_bf16_gemm_path(Bf16GemmChoice choice, const Bf16CpuTraits& cpu) {
  switch (choice) {
    case Bf16GemmChoice::Portable:
      return Bf16GemmPath::Portable;
    case Bf16GemmChoice::Native:
      return cpu.native_available ? Bf16GemmPath::Native : Bf16GemmPath::Portable;
    case Bf16GemmChoice::Auto:
      break;
  }
  return bf16_native_pays(cpu) ? Bf16GemmPath::Native : Bf16GemmPath::Portable;
}

namespace {

std::string backend_library_isa() {
#if KEEL_GEMM_DNNL && defined(__x86_64__)
  // Widest first: the effective ISA is the CPU's, or less under ONEDNN_MAX_CPU_ISA.
  static const std::pair<dnnl_cpu_isa_t, const char*> widest_first[] = {
      {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"}, {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
      {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"}, {dnnl_cpu_isa_avx512_core, "avx512_core"},
      {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"}, {dnnl_cpu_isa_avx2, "avx2"}, {dnnl_cpu_isa_avx, "avx"},
      {dnnl_cpu_isa_sse41, "sse41"}};
  for (const auto& [isa, name] : widest_first) {
    if (dnnl_allows(isa)) return std::string("oneDNN ") + name;
  }
  return "oneDNN below sse41";
#elif KEEL_GEMM_DNNL
  return "oneDNN";
#else
  return "OpenBLAS";
#endif
}

}  // namespace

std::string gemm_backend_isa() {
  std::string text = backend_library_isa();
  const auto mode = static_cast<GemmKernel>(gemm_kernel_mode.load(std::memory_order_relaxed));
#if KEEL_GEMM_OPENBLAS_BESIDE
  if (((mode == GemmKernel::Auto && gemm_below_avx512()) || mode == GemmKernel::Openblas) &&
      gemm_openblas_beside_backend())
    text += std::string(" + OpenBLAS ") + openblas_get_corename();
#endif
  // A forced kernel (KEEL_GEMM, or a test) is named, so a benchmark's line says what ran.
  switch (mode) {
    case GemmKernel::Auto: break;
    case GemmKernel::Backend: text += " (KEEL_GEMM=backend)"; break;
    case GemmKernel::Packed: text += " (KEEL_GEMM=packed)"; break;
    case GemmKernel::Openblas:
#if KEEL_GEMM_DNNL
      // Forced where OpenBLAS is absent or on kernels without AVX2: oneDNN runs, and is named.
      text += gemm_openblas_beside_backend() ? " (KEEL_GEMM=openblas)" : " (KEEL_GEMM=openblas ignored)";
#else
      text += " (KEEL_GEMM=openblas)";
#endif
      break;
  }
  return text;
}

int gemm_fma_bits() {
#if defined(__x86_64__)
  const bool cpu_512 = __builtin_cpu_supports("avx512f");
  const bool cpu_256 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#if KEEL_GEMM_DNNL
  const std::string_view microkernel = block_gemm_isa();
  if (cpu_512 && (dnnl_allows(dnnl_cpu_isa_avx512_core) || microkernel == "avx512")) return 512;
  if (cpu_256 && (dnnl_allows(dnnl_cpu_isa_avx2) || microkernel != "gemm")) return 256;
  return 0;
#else
  // OpenBLAS picks its kernels by the CPU (openblas_core_note says when it picks narrower ones).
  return cpu_512 ? 512 : cpu_256 ? 256 : 0;
#endif
#else
  return 0;
#endif
}

namespace {
// This CPU's traits, read once (bf16_gemm_path runs on every product).
const Bf16CpuTraits& this_cpu() {
  static const Bf16CpuTraits cpu = bf16_cpu_traits();
  return cpu;
}
}  // namespace

Bf16GemmPath bf16_gemm_path() {
  return choose_bf16_gemm_path(current_bf16_gemm_choice.load(std::memory_order_relaxed), this_cpu());
}

void force_bf16_gemm_path(Bf16GemmChoice choice) { current_bf16_gemm_choice.store(choice); }

Bf16GemmChoice bf16_gemm_choice() { return current_bf16_gemm_choice.load(); }

std::string bf16_emulation_note(Bf16GemmChoice choice, const Bf16CpuTraits& cpu) {
  if (choose_bf16_gemm_path(choice, cpu) == Bf16GemmPath::Native) return "";
  const std::string numerics =
      "bf16 matmuls are emulated (operands rounded to bf16, then multiplied by the fp32 kernels), which gives "
      "bf16's numerics and its memory (saved activations held in bf16: under half of fp32's activation memory a token at Qwen3-0.6B's shape, with the default storage and no recomputation)";
  if (cpu.native_available && choice != Bf16GemmChoice::Portable) {
    // Available but not paying: an Intel CPU whose AMX tiles oneDNN cannot use.
    return "this CPU has AVX512-BF16 but no AMX that oneDNN may use, and there oneDNN's bf16 products run at about "
           "half the fp32 kernels' rate: " +
           numerics +
           " at 0.82-0.94x fp32 tokens/s (measured on such an Intel Xeon); KEEL_BF16_GEMM=native "
           "takes oneDNN's bf16 products instead (docs/precision.md)";
  }
  const char* why = cpu.native_available ? "KEEL_BF16_GEMM=portable"
                    : cpu.cpu_has_bf16   ? "ONEDNN_MAX_CPU_ISA caps oneDNN below AVX512-BF16"
                                         : "this CPU has no AVX512-BF16";
  // Native asked for where oneDNN cannot run it: said, rather than silently emulated.
  const char* ignored = choice == Bf16GemmChoice::Native ? "KEEL_BF16_GEMM=native is ignored, " : "";
  return std::string(ignored) + why + ": " + numerics +
         " but no speed (0.91-0.98x fp32 tokens/s measured with AVX2 code, 0.85-0.87x with AVX-512 code); use "
         "precision = \"fp32\" for speed (docs/precision.md)";
}

std::string bf16_emulation_note() {
  return bf16_emulation_note(current_bf16_gemm_choice.load(std::memory_order_relaxed), this_cpu());
}

namespace {

#if KEEL_GEMM_DNNL
// The native product C = alpha·op(A)·op(B) + beta·C with A and B as bf16 words: B given as words
// (b16, row stride ldb16) or rounded here from b, A rounded here; either taken from a live
// SharedBf16Operand instead where one holds it. What is rounded here goes on the word stack for
// the call, the larger operand first, so that in a step's first calls the stack grows to hold both
// rather than the second taking a block of its own beside it.
void native_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, const uint16_t* b16, int64_t ldb16, float beta, float* c, int64_t ldc) {
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  stage_timer::add_gemm_flops(m, n, k);
  const uint16_t* a16 = shared_bf16_words(a, a_rows, a_cols, lda);
  if (b16 == nullptr) {
    b16 = shared_bf16_words(b, b_rows, b_cols, ldb);
    ldb16 = b_cols;
  }
  // Checked before anything goes on the stack, so a failure leaves it as it was.
  KEEL_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && ldb16 <= INT_MAX && ldc <= INT_MAX);
  std::optional<WordStack::Entry> pushed[2];
  if (a16 == nullptr && b16 == nullptr && b_rows * b_cols > a_rows * a_cols) {
    b16 = round_onto(word_stack, b, b_rows, b_cols, ldb, pushed[0]);
    a16 = round_onto(word_stack, a, a_rows, a_cols, lda, pushed[1]);
  } else {
    if (a16 == nullptr) a16 = round_onto(word_stack, a, a_rows, a_cols, lda, pushed[0]);
    if (b16 == nullptr) b16 = round_onto(word_stack, b, b_rows, b_cols, ldb, pushed[1]);
  }
  const dnnl_status_t st = dnnl_gemm_bf16bf16f32(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a16, a_cols,
                                                 b16, ldb16, beta, c, ldc);
  for (int i = 1; i >= 0; --i)
    if (pushed[i]) word_stack.pop(*pushed[i]);
  KEEL_CHECK(st == dnnl_success);
}
#endif

}  // namespace

SharedBf16Operand::SharedBf16Operand(const float* x, int64_t rows, int64_t cols, int64_t ld, bool holds_bf16) {
  if (x == nullptr || rows <= 0 || cols <= 0 || matmul_precision() != Precision::Bf16) return;
  stage_timer::Scope stage_scope(stage_timer::Stage::Gemm);  // what the products would have spent
  if (ld == 0) ld = cols;
  SharedOperandEntry e{x, rows, cols, ld, WordStack::Entry{nullptr, 0, false}, std::nullopt, nullptr, 0};
  if (bf16_gemm_path() == Bf16GemmPath::Native) {
    e.words = word_stack.push(size_t(rows * cols));
    round_operand(x, rows, cols, ld, e.words.data);
  } else if (holds_bf16 || holds_bf16_values(x, rows, cols, ld)) {
    // Portable: bf16 values already (an activation); the products read x itself, unscanned.
    e.rounded = x;
    e.rounded_ld = ld;
  } else {
    // Portable: rounded once into a copy that the fp32 gemm then reads.
    e.rounded = round_onto(float_stack, x, rows, cols, ld, e.copy);
    e.rounded_ld = cols;
  }
  shared_operands.push_back(e);
  active_ = true;
}

SharedBf16Operand::~SharedBf16Operand() {
  if (!active_) return;
  // Scoped objects die in the reverse order they were made, so this is the innermost one.
  const SharedOperandEntry& e = shared_operands.back();
  if (e.copy) float_stack.pop(*e.copy);
  if (e.words.data != nullptr) word_stack.pop(e.words);
  shared_operands.pop_back();
}

const uint16_t* shared_bf16_words(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  for (auto e = shared_operands.rbegin(); e != shared_operands.rend(); ++e)
    if (e->x == x && e->rows == rows && e->cols == cols && e->ld == ld && e->words.data != nullptr)
      return e->words.data;
  return nullptr;
}

namespace {

// The portable path's bf16 values of exactly this stored matrix (a rounded copy, or the matrix
// itself), if a live SharedBf16Operand holds them; ld_out: their row stride.
const float* shared_rounded(const float* x, int64_t rows, int64_t cols, int64_t ld, int64_t& ld_out) {
  for (auto e = shared_operands.rbegin(); e != shared_operands.rend(); ++e)
    if (e->x == x && e->rows == rows && e->cols == cols && e->ld == ld && e->rounded != nullptr) {
      ld_out = e->rounded_ld;
      return e->rounded;
    }
  return nullptr;
}

}  // namespace

// C: (m, n) = alpha·bf16(op(A))(m, k)·bf16(op(B))(k, n) + beta·C, fp32 accumulation
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  stage_timer::GemmScope gemm_scope(trans_a, trans_b, m, n, k, true);
  if (m == 0 || n == 0 || k == 0) {
    gemm_bias(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias);  // no product: only beta
    return;
  }
  // The stored shapes: A is (m, k) or (k, m); B is (k, n) or (n, k). Packed contiguously, so the
  // leading dimension becomes the stored column count.
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
#if KEEL_GEMM_DNNL
  if (bf16_gemm_path() == Bf16GemmPath::Native) {
    native_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, nullptr, 0, beta, c, ldc);
    add_bias_pass(c, m, n, ldc, bias);  // oneDNN's one call leaves no panel to add it to
    return;
  }
#endif
  // Portable. Operands whose values are bf16 already (activations, a SharedBf16Operand's) go to the
  // fp32 gemm as they are, the others rounded into copies: a product of bf16 values is exact in
  // fp32, so this is bf16 arithmetic on the fp32 kernels. Where that would copy a large operand
  // (the LM head's logits gradient, a large weight) and the build has keel's packed kernel, both
  // operands are rounded as that kernel packs them instead, block by block in cache, rather than
  // cost the operand's size again (docs/precision.md, "Without AVX512-BF16").
  constexpr int64_t kMaxCopy = int64_t(16) << 20;  // floats (64 MB): every weight up to Qwen3-1.7B (2,048 × 6,144)
  auto as_bf16 = [](const float* x, int64_t rows, int64_t cols, int64_t ld, int64_t& ld_out) -> const float* {
    if (const float* shared = shared_rounded(x, rows, cols, ld, ld_out)) return shared;
    ld_out = ld;
    return holds_bf16_values(x, rows, cols, ld) ? x : nullptr;
  };
  int64_t lda_r = 0, ldb_r = 0;
  const float* ar = as_bf16(a, a_rows, a_cols, lda, lda_r);
  const float* br = as_bf16(b, b_rows, b_cols, ldb, ldb_r);
  const bool packed_kernel = std::strcmp(block_gemm_isa(), "gemm") != 0;
  if (packed_kernel && ((ar == nullptr && a_rows * a_cols > kMaxCopy) || (br == nullptr && b_rows * b_cols > kMaxCopy))) {
    gemm_run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, true, bias);
    return;
  }
  std::optional<FloatStack::Entry> copies[2];
  if (ar == nullptr) {
    ar = round_onto(float_stack, a, a_rows, a_cols, lda, copies[0]);
    lda_r = a_cols;
  }
  if (br == nullptr) {
    br = round_onto(float_stack, b, b_rows, b_cols, ldb, copies[1]);
    ldb_r = b_cols;
  }
  gemm_bias(trans_a, trans_b, m, n, k, alpha, ar, lda_r, br, ldb_r, beta, c, ldc, bias);
  for (int i = 1; i >= 0; --i)
    if (copies[i]) float_stack.pop(*copies[i]);
}

void bf16_words(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  round_operand(x, rows, cols, ld, out);
}

void gemm_bf16_words_b(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                       int64_t lda, const uint16_t* b16, int64_t ldb, float beta, float* c, int64_t ldc) {
  stage_timer::GemmScope gemm_scope(trans_a, trans_b, m, n, k, true);
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  if (m == 0 || n == 0 || k == 0) {
    gemm(trans_a, trans_b, m, n, k, alpha, a, lda, nullptr, ldb, beta, c, ldc);  // no product: only beta
    return;
  }
#if KEEL_GEMM_DNNL
  if (bf16_gemm_path() == Bf16GemmPath::Native) {
    native_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, nullptr, 0, b16, ldb, beta, c, ldc);
    return;
  }
#endif
  // Portable: B widened back to the fp32 values it holds (rounding them again changes nothing).
  thread_local KeptBuffer<float> b_wide;
  float* bw = b_wide.get(size_t(b_rows * b_cols));
#pragma omp parallel for schedule(static) if (b_rows * b_cols > 16384)
  for (int64_t r = 0; r < b_rows; ++r) unpack_bf16(b16 + r * ldb, bw + r * b_cols, b_cols);
  gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, bw, b_cols, beta, c, ldc);
}

void gemm_mixed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  if (matmul_precision() == Precision::Bf16)
    gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias);
  else
    gemm_bias(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bias);
}

// C: (m, n) = alpha·op(A)(m, k)·op(B)(k, n) + beta·C
void gemm_reference(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = trans_a ? a[p * lda + i] : a[i * lda + p];
        const double bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += av * bv;
      }
      // beta == 0 must ignore C entirely (it may be uninitialised, even NaN), as BLAS does.
      const double prev = beta == 0.f ? 0.0 : double(beta) * c[i * ldc + j];
      c[i * ldc + j] = float(double(alpha) * acc + prev);
    }
}

}  // namespace keel::kernels
