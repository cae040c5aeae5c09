#pragma once
// Zeroing and copying large float buffers on the OpenMP team. A training step zeroes every
// gradient buffer it accumulates into (the parameter gradients, and per layer the activation
// gradients of its sublayers: 65 MB a layer on the d512 Qwen3 step) and copies the residual
// gradients; done by one thread, the other waits at the next barrier, and it was 4-5% of the step
// (perf, docs/performance.md). Chunks are handed out dynamically, so a preempted thread holds
// back one chunk, not half the buffer. Small buffers, and calls from inside a parallel region,
// stay on the calling thread.
#include <cstddef>

namespace keel {

void parallel_zero(float* p, size_t count);
void parallel_copy(float* dst, const float* src, size_t count);

}  // namespace keel
