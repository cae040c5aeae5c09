#include "keel/core/stage_timer.hpp"
#include "keel/kernels/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "keel/core/bf16.hpp"
#include "keel/core/error.hpp"
#include "keel/core/kept_buffer.hpp"
#include "keel/kernels/fast_math.hpp"
#include "keel/kernels/gemm.hpp"
#include "keel/kernels/precision.hpp"

namespace keel::kernels {

namespace {

// Rows per chunk: about 8 Mi logits (32 MiB) per chunk, and at least 256 rows. Every chunk
// re-reads and re-writes all of dw (vocab × hidden) in a weight-gradient product whose inner
// dimension is the chunk's rows, and its logits and dh products have that many rows. With a
// 64-row floor (before) a d256 model with a vocabulary of 151,936 ran its step's GEMMs at
// 261-271 GFLOP/s, with 256 at 324-338: 1.16x the tokens/s, and 1.08x at GPT-2's 50,257
// (docs/performance.md). The price is the buffer: 256 rows of 151,936 logits are 155 MB.
int64_t chunk_rows(int64_t n, int64_t vocab) {
  const int64_t rows = std::clamp<int64_t>((int64_t(1) << 23) / std::max<int64_t>(vocab, 1), 256, 4096);
  return std::min(rows, std::max<int64_t>(n, 1));
}

}  // namespace

// h: (n, c), w: (vocab, c), targets: (n); accumulates dh: (n, c), dw: (vocab, c)
LmHeadLoss lm_head_cross_entropy(const float* h, const float* w, const int32_t* targets, int64_t n, int64_t c,
                                 int64_t vocab, float z_loss, float final_softcap, float grad_scale, float* dh,
                                 float* dw) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Loss);
  const bool want_grad = dh != nullptr || dw != nullptr;
  const int64_t rows = chunk_rows(n, vocab);
  // The chunk's logits (32 MiB at vocab 8,192, 155 MB at 151,936): kept from call to call, since allocating them
  // afresh faulted in and zeroed every page each step (4% of a step in perf); the GEMM below
  // overwrites them.
  // Rows at a stride off the multiples of 1 KiB: at vocab 8,192 (or any multiple of 256) the
  // weight gradient below, logitsᵀ·h, would otherwise copy each panel of the logits to a padded
  // stride first (gemm.cpp's rule against cache-set aliasing; 64 MB of copies a step at vocab
  // 8,192 and 2,048 tokens) and the logits product would write rows that share cache sets.
  const int64_t ld = gemm_unaliased_stride(vocab);
  thread_local KeptBuffer<float> logits_buffer;
  std::span<float> logits(logits_buffer.get(size_t(rows * ld)), size_t(rows * ld));
  std::vector<double> row_ce(static_cast<size_t>(rows)), row_z(static_cast<size_t>(rows));
  // Under native bf16 every product rounds its operands to bf16 words first: the weight, which
  // each chunk reads twice (the logits and dh), is rounded once per call instead (at Qwen3-0.6B's
  // vocabulary, 1 × 1,024 tokens in 4 chunks: 7 passes over 156 M values fewer a step). The same
  // words, so the same bits.
  thread_local KeptBuffer<uint16_t> w_words_buffer;
  const uint16_t* w_words = nullptr;
  if (matmul_precision() == Precision::Bf16 && bf16_gemm_path() == Bf16GemmPath::Native) {
    uint16_t* words = w_words_buffer.get(size_t(vocab * c));
    bf16_words(w, vocab, c, c, words);
    w_words = words;
  }
  // On the portable path (no AVX512-BF16, or no AMX to make it pay) the weight is rounded once per call too, into an
  // fp32 copy that the fp32 gemm reads (SharedBf16Operand), where it is at most 64 MB; a larger one
  // stays with the packed kernel, which rounds it as it packs, rather than cost its own size again.
  const bool portable_bf16 = matmul_precision() == Precision::Bf16 && w_words == nullptr;
  constexpr int64_t kMaxRoundedWeight = int64_t(16) << 20;  // floats
  const SharedBf16Operand rounded_w(portable_bf16 && vocab * c <= kMaxRoundedWeight ? w : nullptr, vocab, c);
  // C = op(A)·op(W) + beta·C, the weight as gemm_mixed would take it or as the words above.
  auto times_w = [&](bool trans_w, int64_t m, int64_t nn, int64_t k, const float* a, int64_t lda, float beta,
                     float* out, int64_t ldo) {
    if (w_words != nullptr) gemm_bf16_words_b(false, trans_w, m, nn, k, 1.f, a, lda, w_words, c, beta, out, ldo);
    else gemm_mixed(false, trans_w, m, nn, k, 1.f, a, lda, w, c, beta, out, ldo);
  };
  const float cap = final_softcap;
  LmHeadLoss loss;
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    const int64_t nr = std::min(rows, n - r0);
    const int32_t* tg = targets + r0;
    bool any = false;
    for (int64_t i = 0; i < nr; ++i) {
      KEEL_CHECK(tg[i] >= -1 && tg[i] < vocab);
      any = any || tg[i] >= 0;
    }
    if (!any) continue;  // nothing to score and a zero gradient
    times_w(true, nr, vocab, c, h + r0 * c, c, 0.f, logits.data(), ld);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nr; ++i) {
      float* z = logits.data() + i * ld;
      row_ce[size_t(i)] = row_z[size_t(i)] = 0;
      if (tg[i] < 0) {
        if (want_grad) std::fill(z, z + vocab, 0.f);
        continue;
      }
      if (cap > 0.f) {
#pragma omp simd
        for (int64_t j = 0; j < vocab; ++j) z[j] = cap * detail::fast_tanh(z[j] / cap);
      }
      const float zmax = detail::max_in_lanes(z, vocab);
      const float zt = z[tg[i]];
      float sum = 0.f;
      if (want_grad && cap == 0.f) {
        // Keep e^(z - max) in place: the gradient below is then one multiply per logit, not a
        // second exp (the logits are not needed again without a cap).
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < vocab; ++j) {
          z[j] = detail::fast_exp(z[j] - zmax);
          sum += z[j];
        }
      } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < vocab; ++j) sum += detail::fast_exp(z[j] - zmax);
      }
      const double lse = double(zmax) + std::log(double(sum));
      row_ce[size_t(i)] = lse - double(zt);
      row_z[size_t(i)] = lse * lse;
      if (!want_grad) continue;
      if (cap == 0.f) {
        // softmax_j·a = e^(z_j - max)·a/sum
        const float a = float(double(grad_scale) * (1.0 + 2.0 * double(z_loss) * lse) / double(sum));
#pragma omp simd
        for (int64_t j = 0; j < vocab; ++j) z[j] *= a;
        z[tg[i]] -= grad_scale;
        continue;
      }
      // ∂/∂z_j [lse - z_t + λ·lse²] = softmax_j·(1 + 2λ·lse) - [j = t]; the cap adds 1 - (z/cap)².
      const float lse_f = float(lse);
      const float a = grad_scale * (1.f + 2.f * z_loss * lse_f);
#pragma omp simd
      for (int64_t j = 0; j < vocab; ++j) {
        float g = a * detail::fast_exp(z[j] - lse_f);
        if (cap > 0.f) g *= 1.f - (z[j] / cap) * (z[j] / cap);
        z[j] = g;
      }
      const float dcap = cap > 0.f ? 1.f - (zt / cap) * (zt / cap) : 1.f;
      z[tg[i]] -= grad_scale * dcap;
    }
    // Fixed-order sums keep the loss bit-identical for any thread count.
    for (int64_t i = 0; i < nr; ++i)
      if (tg[i] >= 0) {
        loss.ce_sum += row_ce[size_t(i)];
        loss.z_sum += row_z[size_t(i)];
        ++loss.count;
      }
    if (rounded_w.active()) {
      // The logits' gradient is read only by the two products below, each of which rounds it to
      // bf16: rounded here once, in place, they take it as it is (the same values, no copy).
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < nr; ++i) {
        float* z = logits.data() + i * ld;
#pragma omp simd
        for (int64_t j = 0; j < vocab; ++j) z[j] = bf16_to_float(float_to_bf16(z[j]));
      }
    }
    const SharedBf16Operand rounded_grad(rounded_w.active() ? logits.data() : nullptr, nr, vocab, ld, true);
    if (dh != nullptr) times_w(false, nr, c, vocab, logits.data(), ld, 1.f, dh + r0 * c, c);
    if (dw != nullptr) gemm_mixed(true, false, vocab, c, nr, 1.f, logits.data(), ld, h + r0 * c, c, 1.f, dw, c);
  }
  return loss;
}

// h: (n, c), w: (vocab, c) -> logits: (n, vocab)
void lm_head_logits(const float* h, const float* w, float* logits, int64_t n, int64_t c, int64_t vocab,
                    float final_softcap) {
  gemm_mixed(false, true, n, vocab, c, 1.f, h, c, w, c, 0.f, logits, vocab);
  if (final_softcap > 0.f) {
    const int64_t total = n * vocab;
    const float cap = final_softcap;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < total; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
}

}  // namespace keel::kernels
