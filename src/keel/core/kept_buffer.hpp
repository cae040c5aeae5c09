#pragma once
// Scratch that a kernel keeps from call to call (usually thread_local): allocating it afresh each
// step faults in and zeroes every page again, which on a VM costs more than the work it holds
// (cross_entropy's logits were 4% of a step in perf). Growing drops the old contents, without
// copying them: every caller overwrites what it reads.
#include <cstddef>
#include <vector>

namespace keel {

template <typename T>
T* kept_buffer(std::vector<T>& buf, size_t count) {
  if (buf.size() < count) {
    buf = std::vector<T>();
    buf.resize(count);
  }
  return buf.data();
}

}  // namespace keel
