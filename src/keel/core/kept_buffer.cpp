#include "keel/core/kept_buffer.hpp"

namespace keel::detail {

std::atomic<int64_t>& kept_scratch_counter() {
  static std::atomic<int64_t> bytes{0};
  return bytes;
}

}  // namespace keel::detail
