#pragma once
// Scratch that a kernel keeps from call to call (usually thread_local): allocating it afresh each
// step faults in and zeroes every page again, which on a VM costs more than the work it holds
// (cross_entropy's logits were 4% of a step in perf). Growing drops the old contents, without
// copying them: every caller overwrites what it reads.
//
// Such buffers stay at their largest size for the life of their thread, beside the arena, the
// parameters and the optimizer state, so every KeptBuffer counts its bytes into one process-wide
// total (kept_scratch_bytes, reported by `keel bench --json` as kept_scratch_mb): memory that
// decides what fits is measured, not guessed (the native bf16 path's operand words, the LM
// head's logits chunk).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace keel {

namespace detail {
std::atomic<int64_t>& kept_scratch_counter();
}  // namespace detail

// Bytes held by every KeptBuffer alive in the process, on every thread.
inline int64_t kept_scratch_bytes() { return detail::kept_scratch_counter().load(std::memory_order_relaxed); }

template <typename T>
class KeptBuffer {
 public:
  KeptBuffer() = default;
  KeptBuffer(const KeptBuffer&) = delete;
  KeptBuffer& operator=(const KeptBuffer&) = delete;
  ~KeptBuffer() { count_bytes(-bytes()); }

  // At least `count` values (their contents unspecified), reallocated only to grow.
  T* get(size_t count) {
    if (buf_.size() < count) {
      const int64_t before = bytes();
      buf_ = std::vector<T>();  // the old one goes before the new one comes
      buf_.resize(count);
      count_bytes(bytes() - before);
    }
    return buf_.data();
  }
  T* data() { return buf_.data(); }
  size_t size() const { return buf_.size(); }

 private:
  int64_t bytes() const { return static_cast<int64_t>(buf_.size() * sizeof(T)); }
  static void count_bytes(int64_t delta) {
    if (delta != 0) detail::kept_scratch_counter().fetch_add(delta, std::memory_order_relaxed);
  }
  std::vector<T> buf_;
};

}  // namespace keel
