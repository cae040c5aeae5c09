#include "keel/core/stage_timer.hpp"
#include "keel/kernels/attention.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "keel/core/error.hpp"
#include "keel/core/kept_buffer.hpp"
#include "keel/core/parallel_fill.hpp"
#include "keel/kernels/block_gemm.hpp"
#include "keel/kernels/fast_math.hpp"

namespace keel::kernels {

namespace {

// Query rows and keys per block: 64×64 fp32 scores (16 KiB) stay in L1/L2. Every product of
// blocks (Q·Kᵀ, P·V and the backward's five) is a block_gemm on the thread that owns the task.
// Its B operand is always untransposed, so the Kᵀ and Vᵀ of the products Q·Kᵀ and dO·Vᵀ are packed
// once per key block; K, V, Q and dO blocks read as B are copied contiguous as well, since their
// row strides (heads·width, 3·hidden) are often multiples of 4 KiB, whose rows share L1 sets.
constexpr int64_t kBq = 64;
constexpr int64_t kBk = 64;
static_assert(kBq == kBk, "pack_transposed pads to kBk columns, also for query blocks");
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// On a diagonal block (its keys at its queries' positions) a query sees only the keys up to its
// own, so the products there run in strips of this many rows, each over only the columns or the
// terms its rows can see: 62.5% of the whole block's work. Masked entries are zeroed by the
// softmax passes, which never read what a strip left out.
constexpr int64_t kStrip = 16;

void check_dims(const AttentionDims& d) {
  KEEL_CHECK(d.batch >= 0 && d.seq >= 0 && d.heads > 0 && d.kv_heads > 0 && d.qk_dim > 0 && d.v_dim > 0);
  KEEL_CHECK(d.heads % d.kv_heads == 0);
  KEEL_CHECK(d.window >= 0);
}

// The first key position the query at `pos` sees (0 without a window).
int64_t first_key(const AttentionDims& d, int64_t pos) {
  return d.window > 0 ? std::max<int64_t>(0, pos - d.window + 1) : 0;
}

// rows × cols at stride ld -> out: (cols, kBk) contiguous, the transpose; columns from `rows` to
// kBk are zero, so a ragged last key block multiplies as a full one would.
void pack_transposed(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out) {
  transpose_block(x, rows, cols, ld, out, kBk);
  if (rows < kBk)
    for (int64_t c = 0; c < cols; ++c) std::fill(out + c * kBk + rows, out + (c + 1) * kBk, 0.f);
}

// rows × cols at stride ld -> out: (rows, cols) contiguous.
void pack_rows(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out) {
  for (int64_t r = 0; r < rows; ++r) std::copy(x + r * ld, x + r * ld + cols, out + r * cols);
}

// One query per sequence (a decoding step over a cache of P + 1 keys): the scores of a head are
// plain dot products with the key rows, which are contiguous, so packing Kᵀ blocks for a
// one-row score block would cost more than it saves. Same contract as attention_forward.
void decode_step(const float* q, const float* k, const float* v, float* out, float* lse, float* max_logit,
                 const AttentionDims& d) {
  const int64_t H = d.heads, Hkv = d.kv_heads, Dk = d.qk_dim, Dv = d.v_dim, keys = d.q_offset + 1;
  const int64_t qs = d.q_stride > 0 ? d.q_stride : H * Dk;
  const int64_t ks = d.k_stride > 0 ? d.k_stride : Hkv * Dk, vs = d.v_stride > 0 ? d.v_stride : Hkv * Dv;
  const int64_t group = H / Hkv, tasks = d.batch * H;
  const float cap = d.softcap;
  std::vector<float> task_max(size_t(tasks), kNegInf);
#pragma omp parallel if (tasks * keys * (Dk + Dv) > 16384)
  {
    std::vector<float> sc(static_cast<size_t>(keys)), o(static_cast<size_t>(Dv));
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / H, h = task % H, kvh = h / group;
      const float* qv = q + b * qs + h * Dk;
      const float* kb = k + b * keys * ks + kvh * Dk;
      const float* vb = v + b * keys * vs + kvh * Dv;
      const int64_t j0 = first_key(d, keys - 1);
      float smax = kNegInf;
      for (int64_t j = j0; j < keys; ++j) {
        const float* kr = kb + j * ks;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < Dk; ++c) dot += qv[c] * kr[c];
        sc[size_t(j)] = dot * d.scale;
        smax = std::max(smax, sc[size_t(j)]);
      }
      task_max[size_t(task)] = smax;
      if (cap > 0.f) {
        for (int64_t j = j0; j < keys; ++j) sc[size_t(j)] = cap * detail::fast_tanh(sc[size_t(j)] / cap);
        smax = cap * detail::fast_tanh(smax / cap);
      }
      float sum = 0.f;
      for (int64_t j = j0; j < keys; ++j) {
        sc[size_t(j)] = detail::fast_exp(sc[size_t(j)] - smax);
        sum += sc[size_t(j)];
      }
      std::fill(o.begin(), o.end(), 0.f);
      for (int64_t j = j0; j < keys; ++j) {
        const float p = sc[size_t(j)];
        const float* vr = vb + j * vs;
#pragma omp simd
        for (int64_t c = 0; c < Dv; ++c) o[size_t(c)] += p * vr[c];
      }
      const float inv = 1.f / sum;
      float* dst = out + task * Dv;
      for (int64_t c = 0; c < Dv; ++c) dst[c] = o[size_t(c)] * inv;
      lse[task] = smax + std::log(sum);  // (B, H, 1)
    }
  }
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t h = task % H;
    max_logit[h] = std::max(max_logit[h], task_max[size_t(task)]);
  }
}

// Floats of Q and dO rows a backward task copies contiguous at once (4 MiB a thread), except
// that a chunk holds at least one query block of every head of the kv head; tests lower it to
// reach several chunks at small shapes (detail::set_attention_backward_chunk_floats).
std::atomic<int64_t> backward_chunk_floats{int64_t(1) << 20};

// The backward wants at least this many tasks, so that a team of a few threads stays busy to
// the end under dynamic scheduling. A constant, not the team size: the split must not depend on it.
constexpr int64_t kBackwardTasks = 8;

// Splits a sequence's q_blocks query blocks into runs for the backward, when fewer than
// kBackwardTasks (sequence, kv head) pairs would leave threads idle. Returns the first block of
// each run and q_blocks at the end. Runs take about equal work: a query block's work is the key
// blocks it sees, which grows along a causal sequence, so later runs hold fewer blocks.
std::vector<int64_t> backward_query_runs(const AttentionDims& d, int64_t q_blocks, int64_t pairs) {
  const int64_t runs = std::max<int64_t>(1, std::min(q_blocks, (kBackwardTasks + pairs - 1) / pairs));
  std::vector<int64_t> work_before(size_t(q_blocks + 1), 0);
  for (int64_t i = 0; i < q_blocks; ++i)
    work_before[size_t(i + 1)] = work_before[size_t(i)] + i - first_key(d, i * kBq) / kBk + 1;
  std::vector<int64_t> start{0};
  int64_t cut = 0;
  for (int64_t r = 1; r < runs; ++r) {
    const double target = double(work_before[size_t(q_blocks)]) * double(r) / double(runs);
    auto off = [&](int64_t i) { return std::abs(double(work_before[size_t(i)]) - target); };
    while (cut < q_blocks && off(cut + 1) <= off(cut)) ++cut;
    start.push_back(cut);
  }
  start.push_back(q_blocks);
  return start;
}

// A row of the backward's block, keys [lo, valid): P = exp(z - lse) over the scores q·k in pr,
// with z the (capped) logit, and dS = P·(dP - delta)·∂z/∂(q·k) over dP in dr. Two instances, not
// a test of the cap inside the loop: GCC if-converts that test, and the uncapped loop then paid
// for the masked-out tanh and its divisions (a sixth of the backward's own time in perf).
// The exp loops here and in the forward ask for 16 lanes, as activation.cpp's do and for its
// reason (Intel tuning otherwise picks 256-bit vectors): 2-4% off the forward and the backward at
// GPT-2's and the d512 model's shapes on an Intel Xeon, interleaved runs of attention_bench. No
// loop reduces across lanes, so the bits do not change.
template <bool Capped>
inline void probs_and_score_grads(float* pr, float* dr, int64_t lo, int64_t valid, float scale, float cap, float li,
                                  float di) {
#pragma omp simd simdlen(16)
  for (int64_t j = lo; j < valid; ++j) {
    const float sc = pr[j] * scale;
    float z = sc, dz = scale;
    if constexpr (Capped) {
      const float t = detail::fast_tanh(sc / cap);
      z = cap * t;
      dz = scale * (1.f - t * t);
    }
    const float pj = detail::fast_exp(z - li);
    pr[j] = pj;
    dr[j] = pj * (dr[j] - di) * dz;
  }
}

}  // namespace

// q: (B,T,Hq,Dqk), k: (B,T,Hkv,Dqk), v: (B,T,Hkv,Dv) -> out: (B,T,Hq,Dv), lse: (B,Hq,T); max_logit: (Hq)
void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse, float* max_logit,
                       const AttentionDims& d) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Attention);
  check_dims(d);
  const int64_t T = d.seq, H = d.heads, Hkv = d.kv_heads, Dk = d.qk_dim, Dv = d.v_dim;
  const int64_t P = d.q_offset, Tk = P + T;  // cached positions before the queries, key rows
  const int64_t qs = d.q_stride > 0 ? d.q_stride : H * Dk;
  const int64_t ks = d.k_stride > 0 ? d.k_stride : Hkv * Dk, vs = d.v_stride > 0 ? d.v_stride : Hkv * Dv;
  const int64_t group = H / Hkv, q_blocks = (T + kBq - 1) / kBq;
  const int64_t tasks = d.batch * H * q_blocks;
  const float cap = d.softcap, scale = d.scale;  // locals: a store to the scores cannot alias them
  std::vector<float> task_max(size_t(tasks), kNegInf);
  if (T == 1) {
    decode_step(q, k, v, out, lse, max_logit, d);
    return;
  }

  // In training (no cache, no window: every key block is read by many query blocks), V of every
  // (sequence, kv head, key block) is first copied contiguous, (kBk, Dv) blocks, since its row
  // strides (3·hidden, heads·width) are often multiples of 1 KiB, whose rows share a quarter of
  // L1's sets. A prefill over a cache or a window reads V in place instead: it would copy keys it
  // never reads.
  const int64_t k_blocks = (Tk + kBk - 1) / kBk, kv_blocks = d.batch * Hkv * k_blocks, vb_floats = kBk * Dv;
  const bool copy_v = P == 0 && d.window == 0;
  // Kept between calls, grown without copying: a fresh allocation each layer would be fresh
  // pages each time, whose faults cost more than the copy. Bounded by the largest V a layer has.
  // The calling thread's buffer; the team reads it through the pointer.
  thread_local KeptBuffer<float> vb_kept;
  float* const vb = copy_v ? vb_kept.get(size_t(kv_blocks * vb_floats)) : nullptr;
#pragma omp parallel
  {
    if (copy_v) {
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < kv_blocks; ++blk) {
        const int64_t b = blk / (Hkv * k_blocks), kvh = (blk / k_blocks) % Hkv, k0 = (blk % k_blocks) * kBk;
        pack_rows(v + (b * Tk + k0) * vs + kvh * Dv, std::min(kBk, Tk - k0), Dv, vs, vb + blk * vb_floats);
      }  // the for's barrier: every block is copied before any task reads one
    }
    // Scores transposed, Sᵀ = K·Qᵀ (keys × queries): a query's softmax statistics then run down
    // the columns, one vector of queries per key row, with no reduction across a vector.
    std::vector<float> st(size_t(kBk * kBq)), qt(size_t(Dk * kBq)), o(size_t(kBq * Dv));
    std::vector<float> m(kBq), l(kBq), bmax(kBq), bsum(kBq), corr(kBq);
    // Largest query blocks (most keys) first, so the dynamic schedule ends balanced.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t qb = q_blocks - 1 - task % q_blocks, bh = task / q_blocks;
      const int64_t b = bh / H, h = bh % H, kvh = h / group;
      const int64_t q0 = qb * kBq, nq = std::min(kBq, T - q0);
      pack_transposed(q + (b * T + q0) * qs + h * Dk, nq, Dk, qs, qt.data());
      const float* kbase = k + b * Tk * ks + kvh * Dk;
      const int64_t first_blk = (b * Hkv + kvh) * k_blocks;
      std::fill(o.begin(), o.end(), 0.f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.f);
      float tmax = kNegInf;
      // The window's band starts at the block's first query's first key.
      for (int64_t k0 = first_key(d, P + q0) / kBk * kBk; k0 < P + q0 + nq; k0 += kBk) {
        const int64_t nk = std::min(kBk, P + q0 + nq - k0);
        const bool diagonal = k0 == P + q0;  // training (P = 0): the last block of each query block
        if (diagonal) {  // key row j is seen by queries j.. (nk == nq here)
          for (int64_t j0 = 0; j0 < nk; j0 += kStrip)
            block_gemm(false, std::min(kStrip, nk - j0), nq - j0, Dk, kbase + (k0 + j0) * ks, ks, qt.data() + j0, kBq,
                       st.data() + j0 * kBq + j0, kBq, false);
        } else {
          block_gemm(false, nk, nq, Dk, kbase + k0 * ks, ks, qt.data(), kBq, st.data(), kBq, false);
        }
        // Key k0 + j is seen by the queries i in [lo, hi): causal from its own position on,
        // and with a window only while it is among the last `window` positions.
        auto seen_by = [&](int64_t j, int64_t& lo, int64_t& hi) {
          lo = std::clamp<int64_t>(k0 + j - P - q0, 0, nq);
          hi = d.window > 0 ? std::clamp<int64_t>(k0 + j + d.window - P - q0, lo, nq) : nq;
        };
        // A whole block (every query sees every key, no cap: most blocks of a long sequence) takes
        // loops of fixed length over the raw scores: per-row bounds cost as much as the exps.
        // The max is taken before scaling (max(scale·s) = scale·max(s) for scale > 0, rounding
        // is monotone), so the first pass only reads the scores.
        const bool whole = cap == 0.f && scale > 0.f && nq == kBq && nk == kBk && k0 + kBk - 1 <= P + q0 &&
                           first_key(d, P + q0 + kBq - 1) <= k0;
        std::fill(bmax.begin(), bmax.end(), kNegInf);
        if (whole) {
          for (int64_t j = 0; j < kBk; ++j) {
            const float* sr = st.data() + j * kBq;
#pragma omp simd
            for (int64_t i = 0; i < kBq; ++i) bmax[size_t(i)] = sr[i] > bmax[size_t(i)] ? sr[i] : bmax[size_t(i)];
          }
#pragma omp simd
          for (int64_t i = 0; i < kBq; ++i) bmax[size_t(i)] *= scale;
        } else {
          for (int64_t j = 0; j < nk; ++j) {
            int64_t lo, hi;
            seen_by(j, lo, hi);
            float* sr = st.data() + j * kBq;
#pragma omp simd
            for (int64_t i = lo; i < hi; ++i) {
              sr[i] *= scale;
              bmax[size_t(i)] = std::max(bmax[size_t(i)], sr[i]);
            }
            if (cap > 0.f) {
#pragma omp simd
              for (int64_t i = lo; i < hi; ++i) sr[i] = cap * detail::fast_tanh(sr[i] / cap);
            }
          }
        }
        // The running statistics of the block's queries, in vectors of queries: a loop over
        // them one at a time, with a scalar exp each, cost more than the exps of the scores.
        tmax = std::max(tmax, detail::max_in_lanes(bmax.data(), nq));
        if (cap > 0.f) {
          // tanh is monotone, so the capped maximum is the cap of the maximum.
#pragma omp simd
          for (int64_t i = 0; i < nq; ++i)
            bmax[size_t(i)] = bmax[size_t(i)] > kNegInf ? cap * detail::fast_tanh(bmax[size_t(i)] / cap) : kNegInf;
        }
#pragma omp simd
        for (int64_t i = 0; i < nq; ++i) {
          const float mold = m[size_t(i)], top = bmax[size_t(i)];
          const float mnew = mold < top ? top : mold;
          // A query none of whose keys came yet keeps m = -inf (and O = 0, l = 0): factor 1.
          // (Both -inf would make the difference NaN, whose conversion in fast_exp is undefined;
          // fast_exp(0) is exactly 1.)
          corr[size_t(i)] = detail::fast_exp(mnew == mold ? 0.f : mold - mnew);
          m[size_t(i)] = mnew;
          bsum[size_t(i)] = 0.f;
        }
        // P = exp(z - m) where the key is seen, 0 elsewhere, so P·V runs over the whole block.
        if (whole) {
          for (int64_t j = 0; j < kBk; ++j) {
            float* sr = st.data() + j * kBq;
#pragma omp simd simdlen(16)
            for (int64_t i = 0; i < kBq; ++i) {
              const float p = detail::fast_exp(sr[i] * scale - m[size_t(i)]);
              sr[i] = p;
              bsum[size_t(i)] += p;
            }
          }
        } else {
          for (int64_t j = 0; j < nk; ++j) {
            int64_t lo, hi;
            seen_by(j, lo, hi);
            float* sr = st.data() + j * kBq;
            // Guarded: below the diagonal block both ranges are empty, and GCC makes each fill a
            // memset call, two per key row.
            if (lo > 0) std::fill(sr, sr + lo, 0.f);
#pragma omp simd simdlen(16)
            for (int64_t i = lo; i < hi; ++i) {
              sr[i] = detail::fast_exp(sr[i] - m[size_t(i)]);
              bsum[size_t(i)] += sr[i];
            }
            if (hi < nq) std::fill(sr + hi, sr + nq, 0.f);
          }
        }
#pragma omp simd
        for (int64_t i = 0; i < nq; ++i) l[size_t(i)] = l[size_t(i)] * corr[size_t(i)] + bsum[size_t(i)];
        for (int64_t i = 0; i < nq; ++i) {
          if (corr[size_t(i)] != 1.f) {
            float* orow = o.data() + i * Dv;
#pragma omp simd
            for (int64_t c = 0; c < Dv; ++c) orow[c] *= corr[size_t(i)];
          }
        }
        // O += P·V = (Sᵀ)ᵀ·V over the block; on the diagonal, query rows i0.. over keys up to their strip's last.
        const float* vblk = copy_v ? vb + (first_blk + k0 / kBk) * vb_floats : v + (b * Tk + k0) * vs + kvh * Dv;
        const int64_t vld = copy_v ? Dv : vs;
        if (diagonal) {
          for (int64_t i0 = 0; i0 < nq; i0 += kStrip)
            block_gemm(true, std::min(kStrip, nq - i0), Dv, std::min(nk, i0 + kStrip), st.data() + i0, kBq, vblk, vld,
                       o.data() + i0 * Dv, Dv, true);
        } else {
          block_gemm(true, nq, Dv, nk, st.data(), kBq, vblk, vld, o.data(), Dv, true);
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = q0 + i;
        const float inv = 1.f / l[size_t(i)];
        float* dst = out + ((b * T + t) * H + h) * Dv;
#pragma omp simd
        for (int64_t c = 0; c < Dv; ++c) dst[c] = o[size_t(i * Dv + c)] * inv;
        lse[(b * H + h) * T + t] = m[size_t(i)] + std::log(l[size_t(i)]);
      }
      task_max[size_t(task)] = tmax;
    }
  }
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t h = (task / q_blocks) % H;
    max_logit[h] = std::max(max_logit[h], task_max[size_t(task)]);
  }
}

// Accumulates dq: (B,T,Hq,Dqk), dk: (B,T,Hkv,Dqk), dv: (B,T,Hkv,Dv)
void attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, const AttentionDims& d) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Attention);
  check_dims(d);
  KEEL_CHECK(d.q_offset == 0);  // training shapes only
  const int64_t B = d.batch, T = d.seq, H = d.heads, Hkv = d.kv_heads, Dk = d.qk_dim, Dv = d.v_dim;
  const int64_t qs = d.q_stride > 0 ? d.q_stride : H * Dk;
  const int64_t ks = d.k_stride > 0 ? d.k_stride : Hkv * Dk, vs = d.v_stride > 0 ? d.v_stride : Hkv * Dv;
  const int64_t group = H / Hkv;
  const float cap = d.softcap, scale = d.scale;

  // delta_t = Σ_c dout·out = Σ_j P_j·dP_j, the softmax-Jacobian term (FlashAttention-2, eq. in §3.1.2).
  std::vector<float> delta(size_t(B * H * T));
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t h = 0; h < H; ++h) {
      const float* o = out + (bt * H + h) * Dv;
      const float* g = dout + (bt * H + h) * Dv;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t c = 0; c < Dv; ++c) acc += o[c] * g[c];
      delta[size_t(((bt / T) * H + h) * T + bt % T)] = acc;
    }
  if (dq == out) {  // out is read no more: dq takes its place, starting from zero
    KEEL_CHECK(Dk == Dv && qs == H * Dk);
    parallel_zero(dq, static_cast<size_t>(B * T * qs));
  }

  // Tasks are (sequence, kv head, run of query blocks). A task owns dq of its query rows for the
  // heads of its kv head, so dq is summed over key blocks in the same order whatever the split.
  // With one run per (sequence, kv head) it also owns that kv head's dk and dv and adds into them;
  // with several (too few pairs to keep a team busy: MQA or a long sequence at batch 1), each
  // run writes its share of dk and dv to its own slice and the slices are added in run order
  // afterwards. The split depends only on the shapes, so the bits do not depend on the team.
  const int64_t q_blocks = (T + kBq - 1) / kBq, pairs = B * Hkv;
  const std::vector<int64_t> run_start = backward_query_runs(d, q_blocks, pairs);
  const int64_t runs = int64_t(run_start.size()) - 1, tasks = pairs * runs;
  // A run of query rows [qa, qe) reads the key rows [key_begin, key_end).
  auto key_end = [&](int64_t r) { return std::min(T, run_start[size_t(r + 1)] * kBq); };
  auto key_begin = [&](int64_t r) {
    const int64_t qa = run_start[size_t(r)] * kBq;
    return qa >= key_end(r) ? key_end(r) : first_key(d, qa) / kBk * kBk;  // an empty run reads nothing
  };
  const int64_t slice = T * (Dk + Dv);  // a run's dk rows then dv rows, dense
  thread_local KeptBuffer<float> slices_kept;  // kept between calls, as the forward's V copy
  float* const slices = runs > 1 ? slices_kept.get(size_t(tasks * slice)) : nullptr;
  // dk, dv rows t0.. of sequence b, kv head kvh += `rows` dense rows of dks (Dk wide) and dvs (Dv).
  auto add_kv_rows = [&](int64_t b, int64_t kvh, int64_t t0, int64_t rows, const float* dks, const float* dvs) {
    for (int64_t j = 0; j < rows; ++j) {
      float* dkr = dk + (b * T + t0 + j) * ks + kvh * Dk;
      float* dvr = dv + (b * T + t0 + j) * vs + kvh * Dv;
#pragma omp simd
      for (int64_t c = 0; c < Dk; ++c) dkr[c] += dks[j * Dk + c];
#pragma omp simd
      for (int64_t c = 0; c < Dv; ++c) dvr[c] += dvs[j * Dv + c];
    }
  };
  // A task's query rows are taken in chunks of at most chunk_rows; the Q and dO rows of a
  // chunk, for every head of the kv head, are copied contiguous once, where each key block
  // copied them again (a fifth of the backward's time outside its products at T = 4,096).
  const int64_t chunk_rows =
      std::max<int64_t>(1, backward_chunk_floats.load() / (group * kBq * (Dk + Dv))) * kBq;
#pragma omp parallel
  {
    std::vector<float> p(size_t(kBq * kBk)), ds(size_t(kBq * kBk));
    std::vector<float> dkb(size_t(kBk * Dk)), dvb(size_t(kBk * Dv));
    // The key block as Kᵀ, Vᵀ and K rows, contiguous, and the chunk's Q and dO rows, kept
    // between calls (the thread's own buffer).
    std::vector<float> kt(size_t(Dk * kBk)), vt(size_t(Dv * kBk)), kc(size_t(kBk * Dk));
    thread_local KeptBuffer<float> chunk_kept;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t pair = task / runs, run = task % runs, b = pair / Hkv, kvh = pair % Hkv;
      const int64_t qa = run_start[size_t(run)] * kBq, qe = key_end(run);
      if (qa >= qe) continue;
      const float* kbase = k + b * T * ks + kvh * Dk;
      const float* vbase = v + b * T * vs + kvh * Dv;
      float* dk_slice = slices + task * slice;
      float* dv_slice = dk_slice + T * Dk;
      for (int64_t ca = qa; ca < qe; ca += chunk_rows) {
        const int64_t ce = std::min(qe, ca + chunk_rows), chunk_blocks = (ce - ca + kBq - 1) / kBq;
        // Block (head g of the group, query block c of the chunk): kBq rows of Q, then kBq of dO.
        const int64_t block_floats = kBq * (Dk + Dv);
        float* const chunk = chunk_kept.get(size_t(group * chunk_blocks * block_floats));
        for (int64_t g = 0; g < group; ++g)
          for (int64_t c = 0; c < chunk_blocks; ++c) {
            const int64_t q0 = ca + c * kBq, nq = std::min(kBq, T - q0), h = kvh * group + g;
            float* qrows = chunk + (g * chunk_blocks + c) * block_floats;
            pack_rows(q + (b * T + q0) * qs + h * Dk, nq, Dk, qs, qrows);
            pack_rows(dout + ((b * T + q0) * H + h) * Dv, nq, Dv, H * Dv, qrows + kBq * Dk);
          }
        // Key blocks from the first the chunk's first query sees. After the task's first chunk,
        // those before ca were met by the chunks before (their sums are added to) and those from
        // ca on are new; in the first chunk all are new.
        for (int64_t k0 = first_key(d, ca) / kBk * kBk; k0 < ce; k0 += kBk) {
          const int64_t nk = std::min(kBk, T - k0);
          bool first_product = true;  // overwrites dkb and dvb: no zeroing of the key block's sums
          pack_transposed(kbase + k0 * ks, nk, Dk, ks, kt.data());
          pack_transposed(vbase + k0 * vs, nk, Dv, vs, vt.data());
          pack_rows(kbase + k0 * ks, nk, Dk, ks, kc.data());
          for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
            // The chunk's queries that see this key block: from its own block on, and without a
            // window to the chunk's end; with one, only until the block's last key drops out of the band.
            const int64_t q_end = d.window > 0 ? std::min(ce, k0 + nk - 1 + d.window) : ce;
            for (int64_t q0 = std::max(ca, (k0 / kBq) * kBq); q0 < q_end; q0 += kBq) {
              const int64_t nq = std::min(kBq, T - q0);
              const float* lse_r = lse + (b * H + h) * T + q0;
              const float* delta_r = delta.data() + (b * H + h) * T + q0;
              const float* qc = chunk + ((h - kvh * group) * chunk_blocks + (q0 - ca) / kBq) * block_floats;
              const float* gc = qc + kBq * Dk;
              const bool diagonal = q0 == k0;  // query row i sees keys ..i (nq == nk here)
              if (diagonal) {
                for (int64_t i0 = 0; i0 < nq; i0 += kStrip) {
                  const int64_t rows = std::min(kStrip, nq - i0), keys = std::min(nk, i0 + kStrip);
                  block_gemm(false, rows, keys, Dk, qc + i0 * Dk, Dk, kt.data(), kBk, p.data() + i0 * kBk, kBk, false);
                  block_gemm(false, rows, keys, Dv, gc + i0 * Dv, Dv, vt.data(), kBk, ds.data() + i0 * kBk, kBk, false);
                }
              } else {
                block_gemm(false, nq, nk, Dk, qc, Dk, kt.data(), kBk, p.data(), kBk, false);  // q·k
                block_gemm(false, nq, nk, Dv, gc, Dv, vt.data(), kBk, ds.data(), kBk, false);  // dP
              }
              // A whole block (as in the forward) runs rows of fixed length.
              const bool whole = cap == 0.f && nq == kBq && nk == kBk && k0 + kBk - 1 <= q0 &&
                                 first_key(d, q0 + kBq - 1) <= k0;
              if (whole) {
                for (int64_t i = 0; i < kBq; ++i)
                  probs_and_score_grads<false>(p.data() + i * kBk, ds.data() + i * kBk, 0, kBk, scale, cap, lse_r[i],
                                               delta_r[i]);
              } else {
                for (int64_t i = 0; i < nq; ++i) {
                  const int64_t valid = std::max<int64_t>(0, std::min(nk, q0 + i - k0 + 1));
                  const int64_t lo = std::min(valid, std::max<int64_t>(0, first_key(d, q0 + i) - k0));
                  float* pr = p.data() + i * kBk;
                  float* dr = ds.data() + i * kBk;
                  const float li = lse_r[i], di = delta_r[i];
                  if (lo > 0)  // guarded, as the forward's fills: empty below the diagonal
                    for (int64_t j = 0; j < lo; ++j) pr[j] = dr[j] = 0.f;
                  if (cap > 0.f)
                    probs_and_score_grads<true>(pr, dr, lo, valid, scale, cap, li, di);
                  else
                    probs_and_score_grads<false>(pr, dr, lo, valid, scale, cap, li, di);
                  if (valid < kBk)
                    for (int64_t j = valid; j < kBk; ++j) pr[j] = dr[j] = 0.f;
                }
              }
              // dV_blk += Pᵀ·dO ; dK_blk += dSᵀ·Q ; dQ += dS·K_blk over the whole block (masked
              // entries of P and dS are 0).
              // On the diagonal, key rows j0.. take the queries from j0 on, query rows i0.. the keys up to
              // their strip's last.
              float* dq_rows = dq + (b * T + q0) * qs + h * Dk;
              if (diagonal) {
                for (int64_t j0 = 0; j0 < nk; j0 += kStrip) {
                  const int64_t rows = std::min(kStrip, nk - j0), from = j0 * kBk + j0;
                  block_gemm(true, rows, Dv, nq - j0, p.data() + from, kBk, gc + j0 * Dv, Dv, dvb.data() + j0 * Dv, Dv,
                             !first_product);
                  block_gemm(true, rows, Dk, nq - j0, ds.data() + from, kBk, qc + j0 * Dk, Dk, dkb.data() + j0 * Dk, Dk,
                             !first_product);
                }
                for (int64_t i0 = 0; i0 < nq; i0 += kStrip)
                  block_gemm(false, std::min(kStrip, nq - i0), Dk, std::min(nk, i0 + kStrip), ds.data() + i0 * kBk, kBk,
                             kc.data(), Dk, dq_rows + i0 * qs, qs, true);
              } else {
                block_gemm(true, nk, Dv, nq, p.data(), kBk, gc, Dv, dvb.data(), Dv, !first_product);
                block_gemm(true, nk, Dk, nq, ds.data(), kBk, qc, Dk, dkb.data(), Dk, !first_product);
                block_gemm(false, nq, Dk, nk, ds.data(), kBk, kc.data(), Dk, dq_rows, qs, true);
              }
              first_product = false;
            }
          }
          if (first_product) {  // no query of the chunk sees the block (cannot happen for the chunks made above)
            std::fill(dkb.begin(), dkb.end(), 0.f);
            std::fill(dvb.begin(), dvb.end(), 0.f);
          }
          if (runs == 1) {
            add_kv_rows(b, kvh, k0, nk, dkb.data(), dvb.data());
          } else if (ca == qa || k0 >= ca) {  // the run's slice meets this key block first
            std::copy(dkb.begin(), dkb.begin() + nk * Dk, dk_slice + k0 * Dk);
            std::copy(dvb.begin(), dvb.begin() + nk * Dv, dv_slice + k0 * Dv);
          } else {
            for (int64_t x = 0; x < nk * Dk; ++x) dk_slice[k0 * Dk + x] += dkb[size_t(x)];
            for (int64_t x = 0; x < nk * Dv; ++x) dv_slice[k0 * Dv + x] += dvb[size_t(x)];
          }
        }
      }
    }
    if (runs > 1) {
      // Every run's slice is written (the for's barrier); each key row adds the runs that read it,
      // in run order.
#pragma omp for schedule(static)
      for (int64_t row = 0; row < pairs * T; ++row) {
        const int64_t pair = row / T, t = row % T;
        for (int64_t run = 0; run < runs; ++run) {
          if (t < key_begin(run) || t >= key_end(run)) continue;
          const float* run_slice = slices + (pair * runs + run) * slice;
          add_kv_rows(pair / Hkv, pair % Hkv, t, 1, run_slice + t * Dk, run_slice + T * Dk + t * Dv);
        }
      }
    }
  }
}

namespace detail {
int64_t set_attention_backward_chunk_floats(int64_t floats) { return backward_chunk_floats.exchange(floats); }
}  // namespace detail

// Same contract as attention_forward; plain loops in double over a full T×T score matrix.
void attention_reference_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                                 float* max_logit, const AttentionDims& d) {
  check_dims(d);
  const int64_t T = d.seq, H = d.heads, Hkv = d.kv_heads, Dk = d.qk_dim, Dv = d.v_dim, group = H / Hkv;
  const int64_t P = d.q_offset, Tk = P + T;
  const int64_t qs = d.q_stride > 0 ? d.q_stride : H * Dk;
  const int64_t ks = d.k_stride > 0 ? d.k_stride : Hkv * Dk, vs = d.v_stride > 0 ? d.v_stride : Hkv * Dv;
  std::vector<double> z(static_cast<size_t>(Tk));
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / group;
      for (int64_t t = 0; t < T; ++t) {
        const float* qt = q + (b * T + t) * qs + h * Dk;
        const int64_t last = P + t;  // the query's own position
        const int64_t first = d.window > 0 ? std::max<int64_t>(0, last - d.window + 1) : 0;
        double zmax = -std::numeric_limits<double>::infinity();
        for (int64_t u = first; u <= last; ++u) {
          const float* ku = k + (b * Tk + u) * ks + kvh * Dk;
          double dot = 0;
          for (int64_t c = 0; c < Dk; ++c) dot += double(qt[c]) * ku[c];
          const double s = double(d.scale) * dot;
          max_logit[h] = std::max(max_logit[h], float(s));
          z[size_t(u)] = d.softcap > 0.f ? double(d.softcap) * std::tanh(s / d.softcap) : s;
          zmax = std::max(zmax, z[size_t(u)]);
        }
        double sum = 0;
        for (int64_t u = first; u <= last; ++u) sum += std::exp(z[size_t(u)] - zmax);
        float* ot = out + ((b * T + t) * H + h) * Dv;
        for (int64_t c = 0; c < Dv; ++c) {
          double acc = 0;
          for (int64_t u = first; u <= last; ++u)
            acc += std::exp(z[size_t(u)] - zmax) / sum * v[(b * Tk + u) * vs + kvh * Dv + c];
          ot[c] = float(acc);
        }
        lse[(b * H + h) * T + t] = float(zmax + std::log(sum));
      }
    }
}

}  // namespace keel::kernels
