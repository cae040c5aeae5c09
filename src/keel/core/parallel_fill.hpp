#pragma once
// Zeroing and copying large float buffers on the OpenMP team. A training step zeroes every
// gradient buffer it accumulates into (the parameter gradients, and per layer the activation
// gradients of its sublayers: 65 MB a layer on the d512 Qwen3 step) and copies the residual
// gradients; done by one thread, the other waits at the next barrier, and it was 4-5% of the step
// (perf, docs/performance.md). Chunks are handed out dynamically, so a preempted thread holds
// back one chunk, not half the buffer. Small buffers, and calls from inside a parallel region,
// stay on the calling thread.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace keel {

// body(begin, end) over [0, count) in 128 KiB chunks (of floats, or of any 4-byte-or-smaller
// element: a chunk is long enough that handing it out costs nothing beside the work on it).
template <typename Body>
void parallel_chunks(size_t count, Body body) {
  constexpr size_t kChunk = size_t{1} << 15;
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

void parallel_zero(float* p, size_t count);
void parallel_copy(float* dst, const float* src, size_t count);

}  // namespace keel
