#include "keel/kernels/attention.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gradient_check.hpp"

namespace keel::kernels {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::random_vector;

struct Inputs {
  std::vector<float> q, k, v;
};

Inputs make_inputs(const AttentionDims& d, uint32_t seed, float range) {
  return {random_vector(size_t(d.batch * d.seq * d.heads * d.qk_dim), seed, -range, range),
          random_vector(size_t(d.batch * d.seq * d.kv_heads * d.qk_dim), seed + 1, -range, range),
          random_vector(size_t(d.batch * d.seq * d.kv_heads * d.v_dim), seed + 2)};
}

AttentionDims dims(int64_t b, int64_t t, int64_t h, int64_t hkv, int64_t dk, int64_t dv, float softcap) {
  return {b, t, h, hkv, dk, dv, float(1 / std::sqrt(double(dk))), softcap};
}

// Blocked kernel vs the naive T×T reference: output, lse and per-head max logit. T = 150 spans
// three 64-key blocks with a ragged tail; GQA ratios 1, 2, 4; qk_dim != v_dim; softcap on/off.
TEST(AttentionKernel, ForwardMatchesReference) {
  const AttentionDims cases[] = {dims(2, 150, 4, 4, 24, 16, 0.f), dims(1, 150, 4, 2, 24, 24, 0.f),
                                 dims(2, 77, 8, 2, 16, 20, 0.f),  dims(1, 150, 4, 1, 24, 16, 3.f),
                                 dims(3, 1, 2, 1, 8, 8, 0.f),     dims(1, 64, 2, 2, 64, 64, 2.f),
                                 dims(2, 1, 4, 2, 16, 16, 2.f),  // one token: the decoding kernel, capped
                                 // odd widths (every microkernel tail), values wider than one
                                 // 64-column chunk of the block product
                                 dims(1, 130, 2, 1, 13, 7, 1.5f), dims(2, 100, 2, 2, 32, 80, 0.f)};
  for (const AttentionDims& d : cases) {
    const Inputs in = make_inputs(d, 7, 2.f);  // range 2: logits of a few units, so softcap bites
    const size_t out_n = size_t(d.batch * d.seq * d.heads * d.v_dim), lse_n = size_t(d.batch * d.heads * d.seq);
    std::vector<float> out(out_n), out_ref(out_n), lse(lse_n), lse_ref(lse_n);
    std::vector<float> mx(size_t(d.heads), -std::numeric_limits<float>::infinity()), mx_ref = mx;
    attention_forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), mx.data(), d);
    attention_reference_forward(in.q.data(), in.k.data(), in.v.data(), out_ref.data(), lse_ref.data(), mx_ref.data(),
                                d);
    const std::string tag = "T=" + std::to_string(d.seq) + " H=" + std::to_string(d.heads) +
                            " Hkv=" + std::to_string(d.kv_heads) + " cap=" + std::to_string(d.softcap);
    for (size_t i = 0; i < out_n; ++i) ASSERT_NEAR(out[i], out_ref[i], 2e-5) << tag << " out " << i;
    for (size_t i = 0; i < lse_n; ++i) ASSERT_NEAR(lse[i], lse_ref[i], 2e-5 * (1 + std::abs(lse_ref[i]))) << tag;
    for (int64_t h = 0; h < d.heads; ++h) {
      ASSERT_NEAR(mx[size_t(h)], mx_ref[size_t(h)], 1e-5 * (1 + std::abs(mx_ref[size_t(h)]))) << tag << " head " << h;
      EXPECT_TRUE(std::isfinite(mx[size_t(h)]));
    }
  }
}

// Decoding with a cache: queries at positions P.. over P + T cached key rows equal the last T
// rows of full causal attention over all P + T positions, blocked kernel and reference alike.
// Also with keys and values interleaved in one row (MLA's absorbed cache: values are the first
// v_dim floats of each key row).
TEST(AttentionKernel, CacheOffsetMatchesFullAttention) {
  struct Case { int64_t prefix, t, h, hkv, dk, dv; bool shared_rows; float cap = 0.f; };
  const Case cases[] = {{0, 5, 4, 2, 16, 16, false}, {70, 1, 4, 2, 24, 24, false}, {129, 3, 4, 1, 12, 8, false},
                        {63, 1, 8, 1, 40, 32, true},  {5, 70, 2, 1, 20, 16, true},
                        {100, 90, 4, 2, 13, 80, false},  // a prefill of several blocks after a cache of several
                        // soft-capped (Gemma 2): one token decoded (decode_step's tanh), and a few
                        {70, 1, 4, 2, 24, 24, false, 2.f}, {129, 1, 8, 1, 40, 32, true, 1.5f},
                        {129, 3, 4, 1, 12, 8, false, 3.f}};
  for (const Case& c : cases) {
    const int64_t total = c.prefix + c.t;
    const std::string tag = "P=" + std::to_string(c.prefix) + " T=" + std::to_string(c.t) + " cap=" + std::to_string(c.cap);
    AttentionDims full = dims(1, total, c.h, c.hkv, c.dk, c.dv, c.cap);
    const std::vector<float> q = random_vector(size_t(total * c.h * c.dk), 21, -2.f, 2.f);
    // Rows of the cache: [k (hkv·dk)] or, shared, one row of dk floats whose first dv are v.
    const int64_t row = c.shared_rows ? c.dk : c.hkv * c.dk;
    const std::vector<float> kbuf = random_vector(size_t(total * row), 22, -2.f, 2.f);
    std::vector<float> k = kbuf, v;
    if (c.shared_rows) {
      for (int64_t u = 0; u < total; ++u)
        for (int64_t j = 0; j < c.dv; ++j) v.push_back(kbuf[size_t(u * row + j)]);
    } else {
      v = random_vector(size_t(total * c.hkv * c.dv), 23);
    }
    std::vector<float> out_full(size_t(total * c.h * c.dv)), lse_full(size_t(total * c.h));
    std::vector<float> mx(size_t(c.h), -std::numeric_limits<float>::infinity());
    attention_reference_forward(q.data(), k.data(), v.data(), out_full.data(), lse_full.data(), mx.data(), full);

    AttentionDims step = dims(1, c.t, c.h, c.hkv, c.dk, c.dv, c.cap);
    step.q_offset = c.prefix;
    const float* vp = v.data();
    if (c.shared_rows) {
      step.k_stride = row;
      step.v_stride = row;
      vp = kbuf.data();
    }
    const float* q_new = q.data() + c.prefix * c.h * c.dk;
    for (bool reference : {false, true}) {
      std::vector<float> out(size_t(c.t * c.h * c.dv)), lse(size_t(c.t * c.h)), m = mx;
      if (reference) attention_reference_forward(q_new, kbuf.data(), vp, out.data(), lse.data(), m.data(), step);
      else attention_forward(q_new, kbuf.data(), vp, out.data(), lse.data(), m.data(), step);
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], out_full[size_t(c.prefix * c.h * c.dv) + i], 2e-5) << tag << " ref=" << reference << " " << i;
      for (int64_t t = 0; t < c.t; ++t)
        for (int64_t h = 0; h < c.h; ++h)
          ASSERT_NEAR(lse[size_t(h * c.t + t)], lse_full[size_t(h * total + c.prefix + t)], 2e-5 * (1 + std::abs(lse[size_t(h * c.t + t)])))
              << tag;
    }
  }
}

AttentionDims windowed(AttentionDims d, int64_t window) {
  d.window = window;
  return d;
}

// Sliding windows against the reference: bands narrower than a block, straddling blocks, as
// wide as one block, wider than the sequence; with GQA, softcap and a ragged tail.
TEST(AttentionKernel, SlidingWindowForwardMatchesReference) {
  const AttentionDims cases[] = {windowed(dims(2, 150, 4, 2, 24, 16, 0.f), 5),
                                 windowed(dims(1, 150, 4, 1, 24, 16, 3.f), 64),
                                 windowed(dims(1, 200, 2, 2, 16, 16, 0.f), 100),
                                 windowed(dims(2, 77, 8, 2, 16, 20, 0.f), 65),
                                 windowed(dims(1, 150, 4, 4, 8, 8, 2.f), 1),
                                 windowed(dims(1, 40, 2, 1, 8, 8, 0.f), 1000),
                                 // a band wide enough that whole blocks lie inside it
                                 windowed(dims(1, 400, 2, 1, 16, 16, 0.f), 200)};
  for (const AttentionDims& d : cases) {
    const Inputs in = make_inputs(d, 17, 2.f);
    const size_t out_n = size_t(d.batch * d.seq * d.heads * d.v_dim), lse_n = size_t(d.batch * d.heads * d.seq);
    std::vector<float> out(out_n), out_ref(out_n), lse(lse_n), lse_ref(lse_n);
    std::vector<float> mx(size_t(d.heads), -std::numeric_limits<float>::infinity()), mx_ref = mx;
    attention_forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), mx.data(), d);
    attention_reference_forward(in.q.data(), in.k.data(), in.v.data(), out_ref.data(), lse_ref.data(), mx_ref.data(),
                                d);
    const std::string tag = "T=" + std::to_string(d.seq) + " W=" + std::to_string(d.window);
    for (size_t i = 0; i < out_n; ++i) ASSERT_NEAR(out[i], out_ref[i], 2e-5) << tag << " out " << i;
    for (size_t i = 0; i < lse_n; ++i) ASSERT_NEAR(lse[i], lse_ref[i], 2e-5 * (1 + std::abs(lse_ref[i]))) << tag;
    for (int64_t h = 0; h < d.heads; ++h) ASSERT_NEAR(mx[size_t(h)], mx_ref[size_t(h)], 1e-5 * (1 + std::abs(mx_ref[size_t(h)])));
    if (d.window == 1) {
      // Each query sees only its own key: the output is its own value row.
      for (int64_t t = 0; t < d.seq; ++t)
        for (int64_t h = 0; h < d.heads; ++h)
          for (int64_t c = 0; c < d.v_dim; ++c)
            ASSERT_NEAR(out[size_t((t * d.heads + h) * d.v_dim + c)],
                        in.v[size_t((t * d.kv_heads + h / (d.heads / d.kv_heads)) * d.v_dim + c)], 1e-6);
    }
    if (d.window >= d.seq) {
      // A window covering the sequence is plain causal attention.
      AttentionDims plain = d;
      plain.window = 0;
      std::vector<float> o2(out_n), l2(lse_n), m2(size_t(d.heads), -std::numeric_limits<float>::infinity());
      attention_forward(in.q.data(), in.k.data(), in.v.data(), o2.data(), l2.data(), m2.data(), plain);
      EXPECT_EQ(o2, out);
    }
  }
}

// Decoding with a window: the last T rows of full windowed attention over P + T positions.
TEST(AttentionKernel, SlidingWindowCacheOffsetMatchesFullAttention) {
  struct Case { int64_t prefix, t, window; };
  for (const Case c : {Case{70, 1, 16}, Case{129, 3, 64}, Case{10, 1, 4}, Case{5, 70, 30}}) {
    const int64_t total = c.prefix + c.t, h = 4, hkv = 2, dk = 16, dv = 8;
    AttentionDims full = windowed(dims(1, total, h, hkv, dk, dv, 0.f), c.window);
    const std::vector<float> q = random_vector(size_t(total * h * dk), 31, -2.f, 2.f);
    const std::vector<float> k = random_vector(size_t(total * hkv * dk), 32, -2.f, 2.f);
    const std::vector<float> v = random_vector(size_t(total * hkv * dv), 33);
    std::vector<float> out_full(size_t(total * h * dv)), lse_full(size_t(total * h));
    std::vector<float> mx(size_t(h), -std::numeric_limits<float>::infinity());
    attention_reference_forward(q.data(), k.data(), v.data(), out_full.data(), lse_full.data(), mx.data(), full);
    AttentionDims step = windowed(dims(1, c.t, h, hkv, dk, dv, 0.f), c.window);
    step.q_offset = c.prefix;
    std::vector<float> out(size_t(c.t * h * dv)), lse(size_t(c.t * h)), m = mx;
    attention_forward(q.data() + c.prefix * h * dk, k.data(), v.data(), out.data(), lse.data(), m.data(), step);
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], out_full[size_t(c.prefix * h * dv) + i], 2e-5) << "P=" << c.prefix << " W=" << c.window;
  }
}

// max_logit is merged with the caller's value, never overwritten by a smaller one.
TEST(AttentionKernel, MaxLogitKeepsLargerIncomingValue) {
  const AttentionDims d = dims(1, 5, 2, 2, 8, 8, 0.f);
  const Inputs in = make_inputs(d, 3, 1.f);
  std::vector<float> out(size_t(5 * 2 * 8)), lse(10), mx = {1e6f, -std::numeric_limits<float>::infinity()};
  attention_forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), mx.data(), d);
  EXPECT_EQ(mx[0], 1e6f);
  EXPECT_LT(mx[1], 1e6f);
  EXPECT_TRUE(std::isfinite(mx[1]));
}

void check_gradients(const AttentionDims& d, uint32_t seed) {
  Inputs in = make_inputs(d, seed, 1.5f);
  const size_t out_n = size_t(d.batch * d.seq * d.heads * d.v_dim);
  const auto g = random_vector(out_n, seed + 5);
  std::vector<float> out(out_n), lse(size_t(d.batch * d.heads * d.seq)), mx(size_t(d.heads));
  auto loss = [&] {
    attention_forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), mx.data(), d);
    return dot(out, g);
  };
  loss();
  // Accumulation contract: start the gradients at 1 and subtract it afterwards.
  std::vector<float> dq(in.q.size(), 1.f), dk(in.k.size(), 1.f), dv(in.v.size(), 1.f);
  attention_backward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), g.data(), dq.data(), dk.data(),
                     dv.data(), d);
  for (auto* t : {&dq, &dk, &dv})
    for (float& x : *t) x -= 1.f;
  const std::string tag = "T=" + std::to_string(d.seq) + " H=" + std::to_string(d.heads) +
                          " Hkv=" + std::to_string(d.kv_heads) + " cap=" + std::to_string(d.softcap) + " ";
  // With T = 1 or a window of 1 each softmax has one entry, so q and k get exactly zero gradient.
  const bool qk_nonzero = d.seq > 1 && d.window != 1;
  expect_gradient(in.q, dq, loss, tag + "dq", 1e-2, 2e-3, 1e-2, 60, qk_nonzero);
  expect_gradient(in.k, dk, loss, tag + "dk", 1e-2, 2e-3, 1e-2, 60, qk_nonzero);
  expect_gradient(in.v, dv, loss, tag + "dv", 1e-2, 2e-3, 1e-2, 60);
}

TEST(AttentionKernel, GradientsSingleToken) { check_gradients(dims(2, 1, 2, 2, 8, 8, 0.f), 11); }
TEST(AttentionKernel, GradientsMhaOddHeadDim) { check_gradients(dims(2, 7, 3, 3, 24, 10, 0.f), 12); }
TEST(AttentionKernel, GradientsGqa2AcrossBlocks) { check_gradients(dims(1, 70, 4, 2, 24, 16, 0.f), 13); }
TEST(AttentionKernel, GradientsMqa4Softcap) { check_gradients(dims(1, 67, 4, 1, 12, 8, 1.5f), 14); }
TEST(AttentionKernel, GradientsGqa2Softcap) { check_gradients(dims(2, 9, 4, 2, 24, 24, 2.f), 15); }

// dq may be the attention output's own buffer (Attention::backward puts it there): the same
// bits for dq, dk and dv as with a zeroed dq of its own: GQA over two sequences, and one longer
// sequence with two heads and soft-capping. Not zeroing dq once the output is read fails it
// (tried).
TEST(AttentionKernel, DqInTheOutputsPlaceGivesTheSameBits) {
  for (const AttentionDims& d : {dims(2, 150, 4, 2, 24, 24, 0.f), dims(1, 300, 2, 2, 16, 16, 1.5f)}) {
    const Inputs in = make_inputs(d, 61, 2.f);
    const size_t out_n = size_t(d.batch * d.seq * d.heads * d.v_dim), lse_n = size_t(d.batch * d.heads * d.seq);
    const std::vector<float> g = random_vector(out_n, 64);
    std::vector<float> out(out_n), lse(lse_n), mx(size_t(d.heads), -std::numeric_limits<float>::infinity());
    attention_forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), mx.data(), d);
    std::vector<float> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
    attention_backward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), g.data(), dq.data(), dk.data(),
                       dv.data(), d);
    std::vector<float> shared = out, dk2(in.k.size()), dv2(in.v.size());
    attention_backward(in.q.data(), in.k.data(), in.v.data(), shared.data(), lse.data(), g.data(), shared.data(),
                       dk2.data(), dv2.data(), d);
    EXPECT_EQ(shared, dq);
    EXPECT_EQ(dk2, dk);
    EXPECT_EQ(dv2, dv);
    EXPECT_NE(dq, out);
  }
}

// Forward and backward give the same bits on one thread and on two (the thread governor changes
// the team between steps; a resumed run must not diverge): every block product and reduction is
// done whole by the thread that owns its task.
TEST(AttentionKernel, BitIdenticalForOneAndTwoThreads) {
  const AttentionDims d = dims(2, 150, 4, 2, 24, 40, 0.f);
  const Inputs in = make_inputs(d, 31, 2.f);
  const size_t out_n = size_t(d.batch * d.seq * d.heads * d.v_dim), lse_n = size_t(d.batch * d.heads * d.seq);
  const std::vector<float> g = random_vector(out_n, 34);
  struct Result {
    std::vector<float> out, lse, mx, dq, dk, dv;
  };
  auto run = [&](int threads) {
    const int team = omp_get_max_threads();
    omp_set_num_threads(threads);
    Result r{std::vector<float>(out_n), std::vector<float>(lse_n),
             std::vector<float>(size_t(d.heads), -std::numeric_limits<float>::infinity()),
             std::vector<float>(in.q.size()), std::vector<float>(in.k.size()), std::vector<float>(in.v.size())};
    attention_forward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), r.mx.data(), d);
    attention_backward(in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), g.data(), r.dq.data(),
                       r.dk.data(), r.dv.data(), d);
    omp_set_num_threads(team);
    return r;
  };
  const Result one = run(1), two = run(2);
  EXPECT_EQ(one.out, two.out);
  EXPECT_EQ(one.lse, two.lse);
  EXPECT_EQ(one.mx, two.mx);
  EXPECT_EQ(one.dq, two.dq);
  EXPECT_EQ(one.dk, two.dk);
  EXPECT_EQ(one.dv, two.dv);
  double norm = 0;
  for (float x : one.dq) norm += double(x) * x;
  EXPECT_GT(norm, 1e-6);  // the gradients are not trivially zero
}

// The backward's exact gradients in double over each head's full T×T scores (dense layouts,
// no cache): P = softmax(z), z = cap·tanh(s/cap) or s, s = scale·q·k; dS = P·(dP - Σ P·dP)·∂z/∂s.
void reference_backward(const Inputs& in, const std::vector<float>& g, const AttentionDims& d, std::vector<double>& dq,
                        std::vector<double>& dk, std::vector<double>& dv) {
  const int64_t T = d.seq, H = d.heads, Hkv = d.kv_heads, Dk = d.qk_dim, Dv = d.v_dim, group = H / Hkv;
  dq.assign(in.q.size(), 0.0), dk.assign(in.k.size(), 0.0), dv.assign(in.v.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(T)), dz(p.size()), dp(p.size());
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t kvh = h / group, first = d.window > 0 ? std::max<int64_t>(0, t - d.window + 1) : 0;
        const size_t qrow = size_t(((b * T + t) * H + h) * Dk), grow = size_t(((b * T + t) * H + h) * Dv);
        auto krow = [&](int64_t u) { return size_t(((b * T + u) * Hkv + kvh) * Dk); };
        auto vrow = [&](int64_t u) { return size_t(((b * T + u) * Hkv + kvh) * Dv); };
        double zmax = -1e300;
        for (int64_t u = first; u <= t; ++u) {
          double s = 0;
          for (int64_t c = 0; c < Dk; ++c) s += double(in.q[qrow + size_t(c)]) * in.k[krow(u) + size_t(c)];
          s *= d.scale;
          const double th = d.softcap > 0.f ? std::tanh(s / d.softcap) : 0.0;
          p[size_t(u)] = d.softcap > 0.f ? d.softcap * th : s;
          dz[size_t(u)] = d.softcap > 0.f ? 1 - th * th : 1.0;
          zmax = std::max(zmax, p[size_t(u)]);
        }
        double sum = 0, pdp = 0;
        for (int64_t u = first; u <= t; ++u) sum += p[size_t(u)] = std::exp(p[size_t(u)] - zmax);
        for (int64_t u = first; u <= t; ++u) {
          p[size_t(u)] /= sum;
          double x = 0;
          for (int64_t c = 0; c < Dv; ++c) x += double(g[grow + size_t(c)]) * in.v[vrow(u) + size_t(c)];
          dp[size_t(u)] = x;
          pdp += p[size_t(u)] * x;
        }
        for (int64_t u = first; u <= t; ++u) {
          const double ds = p[size_t(u)] * (dp[size_t(u)] - pdp) * dz[size_t(u)] * d.scale;
          for (int64_t c = 0; c < Dk; ++c) {
            dq[qrow + size_t(c)] += ds * in.k[krow(u) + size_t(c)];
            dk[krow(u) + size_t(c)] += ds * in.q[qrow + size_t(c)];
          }
          for (int64_t c = 0; c < Dv; ++c) dv[vrow(u) + size_t(c)] += p[size_t(u)] * g[grow + size_t(c)];
        }
      }
}

// Every gradient entry against the double reference, for shapes that split the backward's work
// differently: (sequence, kv head) pairs enough for one run each, and MQA or GQA at batch 1 over
// several blocks, whose query blocks are split into runs whose dk and dv shares are added after.
const AttentionDims kBackwardSplits[] = {dims(4, 130, 4, 2, 16, 16, 0.f),             // 8 pairs: one run each
                                         dims(1, 300, 4, 1, 24, 16, 0.f),             // MQA, batch 1: five runs
                                         dims(1, 520, 2, 1, 16, 8, 2.f),              // nine blocks, eight runs
                                         dims(3, 200, 4, 2, 16, 16, 0.f),  // 6 pairs: two runs over four blocks
                                         windowed(dims(1, 400, 4, 1, 16, 16, 0.f), 90),  // runs within a band
                                         windowed(dims(2, 260, 2, 2, 8, 8, 1.f), 64),
                                         // whole blocks inside a wide band
                                         windowed(dims(8, 400, 2, 1, 16, 16, 0.f), 200)};

void expect_backward_matches_reference(const AttentionDims& d) {
  {
    const Inputs in = make_inputs(d, 41, 1.5f);
    const size_t out_n = size_t(d.batch * d.seq * d.heads * d.v_dim);
    const std::vector<float> g = random_vector(out_n, 43);
    std::vector<float> out(out_n), lse(size_t(d.batch * d.heads * d.seq)), mx(size_t(d.heads));
    attention_forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), mx.data(), d);
    std::vector<float> dq(in.q.size(), 0.f), dk(in.k.size(), 0.f), dv(in.v.size(), 0.f);
    attention_backward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), g.data(), dq.data(), dk.data(),
                       dv.data(), d);
    std::vector<double> rq, rk, rv;
    reference_backward(in, g, d, rq, rk, rv);
    const std::string tag = "B=" + std::to_string(d.batch) + " T=" + std::to_string(d.seq) +
                            " Hkv=" + std::to_string(d.kv_heads) + " W=" + std::to_string(d.window) + " ";
    auto expect_close = [&](const std::vector<float>& got, const std::vector<double>& want, const char* what) {
      double scale = 0;
      for (double x : want) scale = std::max(scale, std::abs(x));
      ASSERT_GT(scale, 1e-3) << tag << what;  // not trivially zero
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5 * scale + 1e-4 * std::abs(want[i])) << tag << what << "[" << i << "]";
    };
    expect_close(dq, rq, "dq");
    expect_close(dk, rk, "dk");
    expect_close(dv, rv, "dv");
  }
}

TEST(AttentionKernel, BackwardMatchesDoubleReferenceForEverySplit) {
  for (const AttentionDims& d : kBackwardSplits) expect_backward_matches_reference(d);
}

// The backward copies a task's Q and dO rows in chunks bounded in floats (4 MiB a thread); a
// long sequence or a wide group takes several, whose key blocks are met again by later chunks
// and added to. Chunks of one query block, and of two where the group is 2 and Dk + Dv = 32
// (several two-block chunks in one run, in cases 0, 3 and 6), on every split: still the double
// reference's gradients, and still the same bits on one thread and on two.
TEST(AttentionKernel, BackwardInChunksMatchesDoubleReferenceOnEveryTeam) {
  struct ChunkFloats {
    int64_t old;
    explicit ChunkFloats(int64_t floats) : old(detail::set_attention_backward_chunk_floats(floats)) {}
    ~ChunkFloats() { detail::set_attention_backward_chunk_floats(old); }
  };
  for (const int64_t floats : {int64_t(1), int64_t(2 * 2 * 64 * 32)}) {
    const ChunkFloats chunks(floats);
    for (const AttentionDims& d : kBackwardSplits) expect_backward_matches_reference(d);
    for (const AttentionDims& d : {kBackwardSplits[1], kBackwardSplits[6]}) {
      const Inputs in = make_inputs(d, 47, 1.5f);
      const size_t out_n = size_t(d.batch * d.seq * d.heads * d.v_dim);
      const std::vector<float> g = random_vector(out_n, 48);
      std::vector<float> out(out_n), lse(size_t(d.batch * d.heads * d.seq)), mx(size_t(d.heads));
      attention_forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), mx.data(), d);
      auto grads = [&](int threads) {
        const int team = omp_get_max_threads();
        omp_set_num_threads(threads);
        std::vector<float> dq(in.q.size(), 0.f), dk(in.k.size(), 0.f), dv(in.v.size(), 0.f);
        attention_backward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), g.data(), dq.data(),
                           dk.data(), dv.data(), d);
        omp_set_num_threads(team);
        dq.insert(dq.end(), dk.begin(), dk.end());
        dq.insert(dq.end(), dv.begin(), dv.end());
        return dq;
      };
      EXPECT_EQ(grads(1), grads(2)) << "T=" << d.seq << " floats=" << floats;
    }
  }
}

TEST(AttentionKernel, GradientsOddWidthsWideValues) { check_gradients(dims(1, 70, 2, 1, 13, 80, 0.f), 19); }
TEST(AttentionKernel, GradientsSlidingWindowAcrossBlocks) { check_gradients(windowed(dims(1, 140, 4, 2, 16, 12, 0.f), 70), 16); }
TEST(AttentionKernel, GradientsSlidingWindowNarrowSoftcap) { check_gradients(windowed(dims(2, 9, 2, 1, 8, 8, 2.f), 3), 17); }
TEST(AttentionKernel, GradientsSlidingWindowOne) { check_gradients(windowed(dims(1, 6, 2, 2, 8, 8, 0.f), 1), 18); }

// q, k and v as column blocks of one row [q | k | v | pad] (GPT-2's c_attn output, read in
// place): forward and backward equal the dense layout's, the reference agrees with strides too,
// and the backward writes dq, dk, dv into the same columns, leaving the padding untouched.
TEST(AttentionKernel, InterleavedRowsMatchDenseLayout) {
  for (const AttentionDims& dense : {dims(2, 150, 4, 4, 24, 16, 0.f), dims(1, 70, 4, 2, 24, 16, 1.5f)}) {
    const Inputs in = make_inputs(dense, 31, 1.5f);
    const int64_t n = dense.batch * dense.seq, qw = dense.heads * dense.qk_dim;
    const int64_t kw = dense.kv_heads * dense.qk_dim, vw = dense.kv_heads * dense.v_dim, row = qw + kw + vw + 5;
    std::vector<float> rows(size_t(n * row), 7.f);
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(in.q.begin() + t * qw, qw, rows.begin() + t * row);
      std::copy_n(in.k.begin() + t * kw, kw, rows.begin() + t * row + qw);
      std::copy_n(in.v.begin() + t * vw, vw, rows.begin() + t * row + qw + kw);
    }
    AttentionDims strided = dense;
    strided.q_stride = strided.k_stride = strided.v_stride = row;
    const float *q = rows.data(), *k = q + qw, *v = k + kw;
    const size_t out_n = size_t(n * dense.heads * dense.v_dim), lse_n = size_t(n * dense.heads);
    std::vector<float> out(out_n), out_s(out_n), out_ref(out_n), lse(lse_n), lse_s(lse_n), lse_ref(lse_n);
    std::vector<float> mx(size_t(dense.heads)), mx_s = mx, mx_ref = mx;
    attention_forward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), mx.data(), dense);
    attention_forward(q, k, v, out_s.data(), lse_s.data(), mx_s.data(), strided);
    attention_reference_forward(q, k, v, out_ref.data(), lse_ref.data(), mx_ref.data(), strided);
    for (size_t i = 0; i < out_n; ++i) {
      ASSERT_NEAR(out_s[i], out[i], 1e-6 * (1 + std::abs(out[i]))) << "out " << i;
      ASSERT_NEAR(out_s[i], out_ref[i], 2e-5) << "out vs reference " << i;
    }
    for (size_t i = 0; i < lse_n; ++i) ASSERT_NEAR(lse_s[i], lse[i], 1e-6 * (1 + std::abs(lse[i])));
    for (size_t h = 0; h < mx.size(); ++h) ASSERT_NEAR(mx_s[h], mx_ref[h], 1e-5 * (1 + std::abs(mx_ref[h])));

    const auto g = random_vector(out_n, 37);
    std::vector<float> dq(in.q.size()), dk(in.k.size()), dv(in.v.size()), drows(rows.size(), 0.5f);
    attention_backward(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), g.data(), dq.data(), dk.data(),
                       dv.data(), dense);
    attention_backward(q, k, v, out_s.data(), lse_s.data(), g.data(), drows.data(), drows.data() + qw,
                       drows.data() + qw + kw, strided);
    for (int64_t t = 0; t < n; ++t) {
      const float* r = drows.data() + t * row;
      for (int64_t c = 0; c < qw; ++c) ASSERT_NEAR(r[c] - 0.5f, dq[size_t(t * qw + c)], 1e-5) << "dq " << t << "," << c;
      for (int64_t c = 0; c < kw; ++c) ASSERT_NEAR(r[qw + c] - 0.5f, dk[size_t(t * kw + c)], 1e-5) << "dk " << t;
      for (int64_t c = 0; c < vw; ++c) ASSERT_NEAR(r[qw + kw + c] - 0.5f, dv[size_t(t * vw + c)], 1e-5) << "dv " << t;
      for (int64_t c = qw + kw + vw; c < row; ++c) ASSERT_EQ(r[c], 0.5f) << "padding " << t;
    }
  }
}

}  // namespace
}  // namespace keel::kernels
