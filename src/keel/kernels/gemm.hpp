#pragma once
// Single-precision matrix multiply, row-major. The fast path calls the BLAS that keel links
// (OpenBLAS, OpenMP build: see docs/blas.md); gemm_reference is the plain loop tests compare to.
// gemm_bf16 is the mixed-precision variant (bf16 operands, fp32 accumulation; docs/precision.md).
#include <cstdint>
#include <string>
#include <string_view>

namespace keel::kernels {

// C[m,n] = alpha * op(A) * op(B) + beta * C, op(X) = Xᵀ when trans_x. A is (m,k) or, transposed,
// stored (k,m); B is (k,n) or stored (n,k). lda/ldb/ldc are row strides of the stored matrices.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// gemm, then bias(n) added to every row of C: C = alpha·op(A)·op(B) + beta·C + 1·biasᵀ. A linear
// layer's output with its bias: each panel of C gets the bias as soon as its product is done,
// while it is still in cache, instead of C being seeded with the bias by a pass of its own and
// read back by the product (beta = 1). bias == nullptr is gemm.
void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias);

// How gemm cuts C into panels that the threads share (rows x cols each, the last ones smaller):
// a function of the shape alone, never of the thread count (gemm.cpp says why).
struct GemmPanels {
  int64_t rows, cols;
};
constexpr int64_t kGemmPanelRows = 256, kGemmPanelCols = 1024, kGemmMinPanels = 8;
constexpr double kGemmPanelMinFlops = 2e6;  // no panel is made smaller than this
// An untransposed B whose row stride is a multiple of kGemmAliasedStride floats (4 KiB) is first
// copied to a padded stride when C has at least kGemmPadBMinRows rows (gemm.cpp says why).
// Auto does so where the backend's kernels were measured to need it (oneDNN below AVX-512);
// tests force Always or Never to check both layouts give the same C.
constexpr int64_t kGemmAliasedStride = 1024, kGemmPadBMinRows = 128;
// A transposed A whose row stride is a multiple of kGemmAliasedStrideA floats (1 KiB) has each
// panel copied to a padded stride first (gemm.cpp says why). gemm_unaliased_stride(cols) is a row
// stride of at least cols floats that needs neither copy: 64-byte rows off both multiples, for a
// buffer its owner lays out and then multiplies (the loss's logits).
constexpr int64_t kGemmAliasedStrideA = 256;
constexpr int64_t gemm_unaliased_stride(int64_t cols) {
  const int64_t ld = (cols + 15) / 16 * 16;
  return ld % kGemmAliasedStrideA == 0 ? ld + 16 : ld;
}
constexpr size_t kGemmKeptPaddedB = size_t(8) << 20;  // floats of padded B a thread keeps between calls
enum class PadAliasedB { Auto, Always, Never };
void set_pad_aliased_b(PadAliasedB mode);
bool gemm_pads_aliased_b();
GemmPanels gemm_panels(int64_t m, int64_t n, int64_t k);
// A weight gradient with few rows of C and a long inner dimension (TN, m <= kGemmSplitKMaxRows,
// the tokens as k) is cut along k instead: gemm_k_parts(...) parts, each a whole C over a slice
// of k, summed in a fixed order (gemm.cpp says why). 1 means no cut. A function of the shape alone.
constexpr int64_t kGemmSplitKMaxRows = 512, kGemmSplitKMinSlice = 512, kGemmSplitKMaxC = int64_t(1) << 20;
int64_t gemm_k_parts(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k);
// A weight gradient with many rows and few columns (TN, n <= kGemmSwapMaxCols, m >= 2n) whose
// transpose would be cut along k is computed as that transpose, Cᵀ = op(B)ᵀ·op(A), then added
// to C transposed (gemm.cpp says why).
constexpr int64_t kGemmSwapMaxCols = 256;
bool gemm_swaps_operands(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k);
// What computes each panel (or slice of k) of a product: the linked BLAS (Backend, oneDNN by
// default), OpenBLAS's OpenMP build linked beside oneDNN where installed (Openblas), or keel's
// packed microkernel (Packed, block_gemm.hpp). Auto keeps the backend on AVX-512 and, below it
// (the AVX2 microkernel, oneDNN without AVX-512), takes what was measured faster in a step
// (gemm.cpp, docs/performance.md): with OpenBLAS beside oneDNN, OpenBLAS for the TN form (weight
// gradients) and for NN products whose B has a row stride of a multiple of kGemmPackedStride
// floats, the packed kernel for NT products with that stride; without it, the packed kernel for
// the TN form and every product with that stride. KEEL_GEMM=packed|backend|openblas overrides
// Auto; tests force each to compare them. Every choice is a function of the shape and the
// machine, never of the thread count.
enum class GemmKernel { Auto, Backend, Packed, Openblas };
enum class PanelKernel { Backend, Openblas, Packed };
void set_gemm_kernel(GemmKernel kernel);
constexpr int64_t kGemmPackedStride = 512;
PanelKernel gemm_panel_kernel(bool trans_a, bool trans_b, int64_t ldb);
bool gemm_uses_packed_kernel(bool trans_a, bool trans_b, int64_t ldb);  // gemm_panel_kernel(...) == Packed
// Whether this build links OpenBLAS beside oneDNN and OpenBLAS runs AVX2 kernels or wider here,
// and whether Auto runs below AVX-512 here.
bool gemm_openblas_beside_backend();
// Whether OpenBLAS's kernel family `core` (openblas_get_corename()) multiplies with 256-bit FMAs
// or wider. An OpenBLAS older than the CPU takes it for an old one ("Prescott", SSE3; OpenBLAS
// 0.3.21 on a 2023 Intel Xeon), and its products then run at a fraction of the CPU's rate.
bool openblas_core_has_avx2(std::string_view core);
// What OpenBLAS is given here: nothing; the products Auto hands it beside oneDNN (AVX2 code);
// every fp32 product, forced by KEEL_GEMM=openblas beside oneDNN; every product (a build on
// OpenBLAS alone).
enum class OpenblasRole { None, Beside, Forced, Only };
// A line for the start of a run where OpenBLAS has a role here but runs kernels without AVX2 on
// a CPU that has AVX2 (it does not know the CPU), naming `coretype`, the OPENBLAS_CORETYPE that
// gives it kernels for the code keel runs (OpenBLAS reads it before main, so keel cannot set
// it); empty otherwise. `core`: openblas_get_corename().
std::string openblas_core_note(OpenblasRole role, std::string_view core, bool cpu_avx2, std::string_view coretype);
std::string openblas_core_note();  // this build, this CPU, the kernels OpenBLAS picked
std::string openblas_core_name();  // openblas_get_corename(), or "" in a build without OpenBLAS
bool gemm_below_avx512();

// A panel of a TN product (a weight gradient that is neither cut along k nor swapped) run as an
// NN product on its slice of A transposed into a buffer (gemm.cpp says why). Auto does so on
// oneDNN's AVX-512 kernels, where it was measured faster (on OpenBLAS's AVX2 kernels it was
// slower); KEEL_TN_PANELS=transposed|as-is overrides Auto for A/B runs, and tests force Always or
// Never to check both give C within rounding of the reference and neither depends on the thread
// count.
enum class TransposeTnPanels { Auto, Always, Never };
void set_transpose_tn_panels(TransposeTnPanels mode);
bool gemm_transposes_tn_panels(PanelKernel kernel);

// C = beta·C over m × n: what a product with k == 0 leaves, and the first step of a kernel that
// then only accumulates. beta == 0 ignores C entirely (it may be uninitialised, even NaN), as BLAS does.
inline void gemm_scale_c(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
}

// Same contract as gemm; a triple loop accumulating in double. For tests only.
void gemm_reference(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// bf16 mixed precision, same contract as gemm: op(A) and op(B) are first rounded to bf16
// (nearest, ties to even), then multiplied with fp32 accumulation into the fp32 C. A product of
// two bf16 values (8-bit significands) is exact in fp32 (24 bits), so the native and the
// portable path below differ only in summation order.
//   native:   oneDNN's bf16 gemm (dnnl_gemm_bf16bf16f32), where it beats the fp32 kernels: AMX
//             tiles (Intel Sapphire Rapids+) or AMD's AVX512-BF16 (Zen 4+); bf16_native_pays;
//   portable: any CPU. The fp32 gemm above on the operands' bf16 values: an operand that holds
//             them already is read as it is, the others rounded into fp32 copies; where a copy
//             would pass 64 MB, keel's packed kernel (block_gemm.hpp) rounds each block as it packs.
// bias: as gemm_bias, added in fp32 to the product of the rounded operands.
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias = nullptr);

// gemm_bf16 with op(B) given as bf16 words, rounded once by the caller for several products (the
// LM head's weight, which every chunk of the loss reads twice): b16 is B's stored matrix after
// bf16_words, row stride ldb. Bit-identical to gemm_bf16 on the fp32 B it was made from, on
// either path (the portable one widens it again).
void gemm_bf16_words_b(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                       int64_t lda, const uint16_t* b16, int64_t ldb, float beta, float* c, int64_t ldc);
// x: (rows, cols) at row stride ld -> out: (rows, cols) contiguous bf16 words, rounded to
// nearest even; on the OpenMP team.
void bf16_words(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out);

// An fp32 operand that several bf16 products read unchanged (a block's normed input, read by q, k
// and v forward and by their weight gradients; a layer's output gradient, read by its input and
// its weight gradient), rounded once for all of them: every gemm_bf16 on this thread whose A or B
// is this stored matrix (same pointer, rows, columns and stride) takes it as rounded here. On the
// native path that is bf16 words; on the portable one the fp32 values rounded into a copy, or x
// itself where its values are bf16 already (checked here, or stated by the caller with
// holds_bf16), which the fp32 gemm then multiplies. The same rounding, done once: bit-identical.
// The caller promises that x does not change while the object lives. Under fp32 matmuls it does
// nothing.
class SharedBf16Operand {
 public:
  SharedBf16Operand(const float* x, int64_t rows, int64_t cols, int64_t ld = 0, bool holds_bf16 = false);
  ~SharedBf16Operand();
  SharedBf16Operand(const SharedBf16Operand&) = delete;
  SharedBf16Operand& operator=(const SharedBf16Operand&) = delete;
  bool active() const { return active_; }

 private:
  bool active_ = false;
};
// The words a live SharedBf16Operand on this thread made of exactly this stored matrix, or null.
const uint16_t* shared_bf16_words(const float* x, int64_t rows, int64_t cols, int64_t ld);

// gemm when the calling thread's matmul precision (kernels/precision.hpp) is fp32, gemm_bf16
// when it is bf16. The model's matmuls all go through here.
void gemm_mixed(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                const float* bias = nullptr);

enum class Bf16GemmPath { Native, Portable };
// True when the build links oneDNN and oneDNN may use AVX512-BF16 on this CPU.
bool bf16_gemm_native_available();

// What decides whether the native path pays: oneDNN's bf16 gemm is fast only where the CPU
// multiplies bf16 faster than fp32. With AMX tiles (Intel Sapphire Rapids and later, where the
// kernel and hypervisor expose them) and on AMD's AVX512-BF16 (Zen 4 and later) it is 1.7-2.4x
// the fp32 gemm; on an Intel CPU without AMX its vdpbf16ps runs on one port where fp32 FMAs run
// on two, and it measured 0.5x the fp32 gemm (docs/precision.md, "Where bf16 products pay").
struct Bf16CpuTraits {
  bool native_available = false;  // bf16_gemm_native_available()
  bool amx_bf16 = false;          // oneDNN may use AMX tiles here
  bool amd = false;               // the CPU's vendor is AMD
  bool cpu_has_bf16 = false;      // the CPU reports AVX512-BF16 (whether or not oneDNN may use it)
};
Bf16CpuTraits bf16_cpu_traits();
// Whether the native path beats the fp32 kernels on a CPU with these traits.
bool bf16_native_pays(const Bf16CpuTraits& cpu);

// Auto takes the native path where it is available and pays; Native where it is available;
// Portable always. The environment variable KEEL_BF16_GEMM=native|portable sets the starting
// choice (read once), force_bf16_gemm_path() changes it (tests, benchmarks).
enum class Bf16GemmChoice { Auto, Native, Portable };
Bf16GemmPath choose_bf16_gemm_path(Bf16GemmChoice choice, const Bf16CpuTraits& cpu);

// The library behind gemm() and the widest ISA it may use here, "oneDNN avx2" say: the CPU's, or
// less where ONEDNN_MAX_CPU_ISA caps it; with OpenBLAS taking products beside it, its kernels too
// ("oneDNN avx2 + OpenBLAS Haswell"). Benchmarks print it beside the CPU's own flags.
std::string gemm_backend_isa();
// The width of the FMAs the fp32 products run here: 512 where oneDNN may use AVX-512 or the
// build's microkernel is AVX-512 on a CPU with it, 256 where they run AVX2 + FMA code, 0 where
// neither (the portable build). The FMA peak a step's GEMMs are measured against is this width's.
int gemm_fma_bits();
// The path gemm_bf16 takes now: choose_bf16_gemm_path(the current choice, this CPU).
Bf16GemmPath bf16_gemm_path();
void force_bf16_gemm_path(Bf16GemmChoice choice);
Bf16GemmChoice bf16_gemm_choice();  // the current choice
// Restores the choice it found when it goes out of scope, whatever was forced meanwhile (tests).
class Bf16GemmChoiceScope {
 public:
  Bf16GemmChoiceScope() : before_(bf16_gemm_choice()) {}
  ~Bf16GemmChoiceScope() { force_bf16_gemm_path(before_); }
  Bf16GemmChoiceScope(const Bf16GemmChoiceScope&) = delete;
  Bf16GemmChoiceScope& operator=(const Bf16GemmChoiceScope&) = delete;

 private:
  Bf16GemmChoice before_;
};

// What a bf16 run should be told when its products do not run in bf16 (empty where they do): the
// portable path gives bf16's numerics a little below fp32's speed, with less memory (measured on
// a Zen 5 running AVX2 code: 0.93-0.98x fp32 tokens/s, 11-15% less peak RSS; on an Intel Xeon,
// since the portable path runs the fp32 kernels on rounded operands, 0.91-0.92x with AVX2 code
// and 0.85-0.87x with AVX-512 code; docs/precision.md). On a CPU with AVX512-BF16 where the
// native path does not pay, the note says why and names KEEL_BF16_GEMM=native.
std::string bf16_emulation_note();
// The same for a given choice and CPU (what a run on that CPU would be told).
std::string bf16_emulation_note(Bf16GemmChoice choice, const Bf16CpuTraits& cpu);

}  // namespace keel::kernels
