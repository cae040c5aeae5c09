#include "keel/kernels/embedding.hpp"

#include <gtest/gtest.h>

#include "gradient_check.hpp"

namespace keel::kernels {
namespace {

using testing::random_vector;

TEST(EmbeddingKernel, ForwardGathersRows) {
  const int64_t vocab = 9, dim = 37, n = 6;
  const auto table = random_vector(size_t(vocab * dim), 1);
  const std::vector<int32_t> ids = {3, 0, 8, 3, 3, 5};
  std::vector<float> out(size_t(n * dim));
  embedding_forward(ids.data(), table.data(), out.data(), n, dim);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(out[size_t(i * dim + j)], table[size_t(ids[size_t(i)] * dim + j)]);
}

// Repeated ids must all land (no lost updates) and in row order, so the result is bit-identical
// to the serial loop.
TEST(EmbeddingKernel, BackwardAccumulatesRepeatedIdsDeterministically) {
  const int64_t vocab = 7, dim = 53, n = 300;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 5) % 3 == 0 ? 2 : (i * 3) % vocab);
  const auto dout = random_vector(size_t(n * dim), 2);
  auto dtable = random_vector(size_t(vocab * dim), 3);
  auto expected = dtable;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < dim; ++j) expected[size_t(ids[size_t(i)] * dim + j)] += dout[size_t(i * dim + j)];
  embedding_backward(ids.data(), dout.data(), dtable.data(), n, dim);
  for (size_t i = 0; i < expected.size(); ++i) ASSERT_EQ(dtable[i], expected[i]) << i;
}

TEST(EmbeddingKernel, GradientMatchesFiniteDifferences) {
  const int64_t vocab = 5, dim = 3, n = 4;
  const std::vector<int32_t> ids = {1, 4, 1, 0};
  auto table = random_vector(size_t(vocab * dim), 4);
  const auto g = random_vector(size_t(n * dim), 5);
  std::vector<float> out(size_t(n * dim)), dtable(table.size(), 0.f);
  auto loss = [&] {
    embedding_forward(ids.data(), table.data(), out.data(), n, dim);
    return testing::dot(out, g);
  };
  embedding_backward(ids.data(), g.data(), dtable.data(), n, dim);
  testing::expect_gradient(table, dtable, loss, "dtable");
}

// keel.embed_scale: out = scale * row, and the table's gradient carries the same factor.
TEST(EmbeddingKernel, ScaledGradientMatchesFiniteDifferences) {
  const int64_t vocab = 5, dim = 3, n = 4;
  const float scale = 2.5f;
  const std::vector<int32_t> ids = {1, 4, 1, 0};
  auto table = random_vector(size_t(vocab * dim), 6);
  const auto g = random_vector(size_t(n * dim), 7);
  std::vector<float> out(size_t(n * dim)), dtable(table.size(), 0.f);
  embedding_forward(ids.data(), table.data(), out.data(), n, dim, scale);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(out[size_t(i * dim + j)], scale * table[size_t(ids[size_t(i)] * dim + j)]);
  auto loss = [&] {
    embedding_forward(ids.data(), table.data(), out.data(), n, dim, scale);
    return testing::dot(out, g);
  };
  embedding_backward(ids.data(), g.data(), dtable.data(), n, dim, scale);
  testing::expect_gradient(table, dtable, loss, "dtable");
}

}  // namespace
}  // namespace keel::kernels
