#include "keel/kernels/attention_sink.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gradient_check.hpp"

namespace keel::kernels {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::random_vector;

AttentionDims dims(int64_t b, int64_t t, int64_t h, int64_t hkv, int64_t dk, int64_t dv, float softcap,
                   int64_t window = 0) {
  AttentionDims d{b, t, h, hkv, dk, dv, float(1 / std::sqrt(double(dk))), softcap};
  d.window = window;
  return d;
}

// Written as gpt-oss's eager attention: the sink is one more column of each row's logits, the
// softmax runs over keys and sink together, and the sink's column is dropped afterwards.
std::vector<double> naive_with_sink(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, const std::vector<float>& sinks,
                                    const AttentionDims& d) {
  std::vector<double> out(size_t(d.batch * d.seq * d.heads * d.v_dim), 0.0);
  const int64_t group = d.heads / d.kv_heads;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t i = 0; i < d.seq; ++i) {
        const int64_t kh = h / group;
        const int64_t first = d.window > 0 ? std::max<int64_t>(0, i - d.window + 1) : 0;
        std::vector<double> s;
        for (int64_t j = first; j <= i; ++j) {
          double x = 0;
          for (int64_t c = 0; c < d.qk_dim; ++c)
            x += double(q[size_t(((b * d.seq + i) * d.heads + h) * d.qk_dim + c)]) *
                 k[size_t(((b * d.seq + j) * d.kv_heads + kh) * d.qk_dim + c)];
          x *= d.scale;
          if (d.softcap > 0) x = d.softcap * std::tanh(x / d.softcap);
          s.push_back(x);
        }
        double m = sinks[size_t(h)];
        for (double x : s) m = std::max(m, x);
        double z = std::exp(sinks[size_t(h)] - m);
        for (double x : s) z += std::exp(x - m);
        for (int64_t j = first; j <= i; ++j) {
          const double p = std::exp(s[size_t(j - first)] - m) / z;
          for (int64_t c = 0; c < d.v_dim; ++c)
            out[size_t(((b * d.seq + i) * d.heads + h) * d.v_dim + c)] +=
                p * v[size_t(((b * d.seq + j) * d.kv_heads + kh) * d.v_dim + c)];
        }
      }
  return out;
}

struct Case {
  AttentionDims d;
  std::vector<float> q, k, v, sinks;
};

Case make_case(const AttentionDims& d, uint32_t seed) {
  // Sinks from -2 to 3: some rows give the sink most of the weight, some almost none.
  return {d, random_vector(size_t(d.batch * d.seq * d.heads * d.qk_dim), seed, -1.5f, 1.5f),
          random_vector(size_t(d.batch * d.seq * d.kv_heads * d.qk_dim), seed + 1, -1.5f, 1.5f),
          random_vector(size_t(d.batch * d.seq * d.kv_heads * d.v_dim), seed + 2),
          random_vector(size_t(d.heads), seed + 3, -2.f, 3.f)};
}

void forward(Case& c, std::vector<float>& out, std::vector<float>& lse) {
  const AttentionDims& d = c.d;
  out.assign(size_t(d.batch * d.seq * d.heads * d.v_dim), 0.f);
  lse.assign(size_t(d.batch * d.heads * d.seq), 0.f);
  std::vector<float> mx(size_t(d.heads), -std::numeric_limits<float>::infinity());
  attention_forward(c.q.data(), c.k.data(), c.v.data(), out.data(), lse.data(), mx.data(), d);
  attention_sink_forward(out.data(), lse.data(), c.sinks.data(), d);
}

const AttentionDims kCases[] = {dims(2, 9, 4, 2, 8, 8, 0.f), dims(1, 70, 4, 1, 12, 8, 0.f),
                                dims(2, 9, 2, 1, 8, 6, 2.f, 3), dims(1, 1, 2, 2, 8, 8, 0.f)};

TEST(AttentionSink, ForwardMatchesSoftmaxWithSinkColumn) {
  for (const AttentionDims& d : kCases) {
    Case c = make_case(d, 21);
    std::vector<float> out, lse;
    forward(c, out, lse);
    const auto ref = naive_with_sink(c.q, c.k, c.v, c.sinks, d);
    double biggest_change = 0;
    std::vector<float> plain(out.size()), plain_lse(lse.size()), mx(size_t(d.heads));
    attention_forward(c.q.data(), c.k.data(), c.v.data(), plain.data(), plain_lse.data(), mx.data(), d);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], ref[i], 2e-6) << "T=" << d.seq << " i=" << i;
      biggest_change = std::max(biggest_change, double(std::abs(plain[i] - out[i])));
    }
    EXPECT_GT(biggest_change, 0.05) << "the sinks must change the output noticeably";
  }
}

TEST(AttentionSink, LseIncludesTheSink) {
  Case c = make_case(dims(1, 5, 2, 2, 8, 8, 0.f), 3);
  std::vector<float> out, lse;
  std::vector<float> plain(size_t(5 * 2 * 8)), plain_lse(10), mx(2);
  attention_forward(c.q.data(), c.k.data(), c.v.data(), plain.data(), plain_lse.data(), mx.data(), c.d);
  forward(c, out, lse);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 5; ++i) {
      const double want = std::log(std::exp(double(plain_lse[size_t(h * 5 + i)])) + std::exp(double(c.sinks[size_t(h)])));
      EXPECT_NEAR(lse[size_t(h * 5 + i)], want, 1e-5);
    }
}

void check_gradients(const AttentionDims& d, uint32_t seed) {
  Case c = make_case(d, seed);
  const size_t out_n = size_t(d.batch * d.seq * d.heads * d.v_dim);
  const auto g = random_vector(out_n, seed + 9);
  std::vector<float> out, lse;
  auto loss = [&] {
    forward(c, out, lse);
    return dot(out, g);
  };
  loss();
  std::vector<float> dq(c.q.size(), 1.f), dk(c.k.size(), 1.f), dv(c.v.size(), 1.f), ds(c.sinks.size(), 1.f);
  attention_backward(c.q.data(), c.k.data(), c.v.data(), out.data(), lse.data(), g.data(), dq.data(), dk.data(),
                     dv.data(), d);
  attention_sink_backward(out.data(), lse.data(), c.sinks.data(), g.data(), ds.data(), d);
  for (auto* t : {&dq, &dk, &dv, &ds})
    for (float& x : *t) x -= 1.f;
  const std::string tag = "T=" + std::to_string(d.seq) + " window=" + std::to_string(d.window) + " ";
  const bool qk_nonzero = d.seq > 1;
  expect_gradient(c.q, dq, loss, tag + "dq", 1e-2, 2e-3, 1e-2, 60, qk_nonzero);
  expect_gradient(c.k, dk, loss, tag + "dk", 1e-2, 2e-3, 1e-2, 60, qk_nonzero);
  expect_gradient(c.v, dv, loss, tag + "dv", 1e-2, 2e-3, 1e-2, 60);
  expect_gradient(c.sinks, ds, loss, tag + "dsinks", 1e-2, 2e-3, 1e-2, 60);
}

TEST(AttentionSink, GradientsGqa) { check_gradients(kCases[0], 31); }
TEST(AttentionSink, GradientsMqaAcrossBlocks) { check_gradients(kCases[1], 32); }
TEST(AttentionSink, GradientsSlidingWindowSoftcap) { check_gradients(kCases[2], 33); }
TEST(AttentionSink, GradientsSingleToken) { check_gradients(kCases[3], 34); }

}  // namespace
}  // namespace keel::kernels
