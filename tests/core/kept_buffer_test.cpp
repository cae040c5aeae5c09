#include "keel/core/kept_buffer.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

namespace keel {
namespace {

TEST(KeptBuffer, CountsTheBytesItHoldsUntilItGoes) {
  const int64_t base = kept_scratch_bytes();
  {
    KeptBuffer<float> a;
    EXPECT_EQ(kept_scratch_bytes(), base);
    ASSERT_NE(a.get(1000), nullptr);
    EXPECT_EQ(kept_scratch_bytes(), base + 4000);
    a.get(10);  // fits: nothing is reallocated or counted again
    EXPECT_EQ(kept_scratch_bytes(), base + 4000);
    EXPECT_EQ(a.size(), 1000u);
    a.get(3000);  // grows: the old buffer's bytes go, the new one's come
    EXPECT_EQ(kept_scratch_bytes(), base + 12000);
    KeptBuffer<uint16_t> words;
    words.get(7);
    EXPECT_EQ(kept_scratch_bytes(), base + 12014);
  }
  EXPECT_EQ(kept_scratch_bytes(), base);
}

TEST(KeptBuffer, AThreadsBufferGoesWithItsThread) {
  const int64_t base = kept_scratch_bytes();
  int64_t seen = -1;
  std::thread worker([&] {
    thread_local KeptBuffer<double> kept;
    kept.get(100);
    seen = kept_scratch_bytes();
  });
  worker.join();
  EXPECT_EQ(seen, base + 800);
  EXPECT_EQ(kept_scratch_bytes(), base);  // its thread_local died with the thread
}

}  // namespace
}  // namespace keel
