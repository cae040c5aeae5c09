#include "keel/core/parallel_fill.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

namespace keel {
namespace {

// Sizes below, at and around the split into chunks, and one with a ragged last chunk; every
// element is written and nothing past the end.
TEST(ParallelFill, ZeroAndCopyCoverEveryElementAndNoMore) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{1} << 16, (size_t{1} << 20) + 12345}) {
    SCOPED_TRACE(n);
    std::vector<float> buf(n + 16, 7.f), src(n + 16), dst(n + 16, -1.f);
    for (size_t i = 0; i < src.size(); ++i) src[i] = float(i % 1009) * 0.5f;
    parallel_zero(buf.data(), n);
    parallel_zero(nullptr, 0);  // an empty FloatBuffer's zero(): no memset on a null pointer
    parallel_copy(nullptr, nullptr, 0);
    parallel_copy(dst.data(), src.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(buf[i], 0.f) << i;
      ASSERT_EQ(dst[i], src[i]) << i;
    }
    for (size_t i = n; i < n + 16; ++i) {
      EXPECT_EQ(buf[i], 7.f);
      EXPECT_EQ(dst[i], -1.f);
    }
  }
}

// Called from inside a parallel region (a kernel's own team), concurrent calls on their own
// buffers each zero the whole of theirs.
TEST(ParallelFill, WorksInsideAParallelRegion) {
  const size_t n = size_t{1} << 18;
  std::vector<std::vector<float>> bufs(4, std::vector<float>(n, 3.f));
#pragma omp parallel for num_threads(2)
  for (int i = 0; i < 4; ++i) parallel_zero(bufs[size_t(i)].data(), n);
  for (const auto& b : bufs)
    for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(b[i], 0.f);
}

}  // namespace
}  // namespace keel
