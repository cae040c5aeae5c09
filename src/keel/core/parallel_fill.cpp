#include "keel/core/parallel_fill.hpp"

#include <cstring>

namespace keel {

void parallel_zero(float* p, size_t count) {
  parallel_chunks(count, [p](size_t b, size_t e) { std::memset(p + b, 0, (e - b) * sizeof(float)); });
}

void parallel_copy(float* dst, const float* src, size_t count) {
  parallel_chunks(count, [dst, src](size_t b, size_t e) { std::memcpy(dst + b, src + b, (e - b) * sizeof(float)); });
}

}  // namespace keel
