#include "keel/core/parallel_fill.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace keel {

namespace {

// 128 KiB: a chunk is long enough that handing it out costs nothing beside writing it.
constexpr size_t kChunk = size_t{1} << 15;

template <typename Body>
void over_chunks(size_t count, Body body) {
  if (count == 0) return;  // an empty buffer's pointer may be null, which memset must not get
  if (count < 2 * kChunk || omp_in_parallel()) {
    body(size_t{0}, count);
    return;
  }
  const int64_t chunks = static_cast<int64_t>((count + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kChunk;
    body(begin, std::min(count, begin + kChunk));
  }
}

}  // namespace

void parallel_zero(float* p, size_t count) {
  over_chunks(count, [p](size_t b, size_t e) { std::memset(p + b, 0, (e - b) * sizeof(float)); });
}

void parallel_copy(float* dst, const float* src, size_t count) {
  over_chunks(count, [dst, src](size_t b, size_t e) { std::memcpy(dst + b, src + b, (e - b) * sizeof(float)); });
}

}  // namespace keel
