#pragma once
// Memory by role. A FloatBuffer is one aligned allocation (parameters, gradients, optimizer
// state each get one). An Arena hands out views for activations during a step: the first step
// grows it, reset() folds what was used into a single block, later steps reuse that block (or it
// is one reserved stretch of address space from the start: reserve_address_space).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "keel/core/parallel_fill.hpp"

namespace keel {

inline constexpr size_t kAlignment = 64;  // cache line; AVX-512 loads

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(size_t count) { resize(count); }
  void resize(size_t count) {
    size_t bytes = ((count * sizeof(float) + kAlignment - 1) / kAlignment) * kAlignment;
    float* p = static_cast<float*>(std::aligned_alloc(kAlignment, bytes == 0 ? kAlignment : bytes));
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes == 0 ? kAlignment : bytes);
    data_.reset(p);
    size_ = count;
  }
  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  size_t size() const { return size_; }
  std::span<float> span() { return {data_.get(), size_}; }
  std::span<const float> span() const { return {data_.get(), size_}; }
  void zero() { parallel_zero(data_.get(), size_); }

 private:
  std::unique_ptr<float[], FreeDeleter> data_;
  size_t size_ = 0;
};

class Arena {
 public:
  Arena() = default;
  // Views point into its blocks: moved (a DecodeState is returned by value), never copied.
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&&) = default;
  Arena& operator=(Arena&&) = default;
  // The floats alloc(count) takes: count rounded up to whole 64-byte lines.
  static constexpr size_t padded(size_t count) {
    constexpr size_t kLane = kAlignment / sizeof(float);
    return (count + kLane - 1) / kLane * kLane;
  }
  // Uninitialized floats valid until the next reset().
  float* alloc(size_t count) {
    const size_t taken = padded(count);
    if (blocks_.empty() || used_ + taken > blocks_.back().size) {
      size_t want = std::max(taken, blocks_.empty() ? size_t{1} << 16 : blocks_.back().size);
      blocks_.push_back(allocate_block(want));
      used_ = 0;
    }
    float* p = blocks_.back().data.get() + used_;
    used_ += taken;
    total_used_ += taken;
    high_water_ = std::max(high_water_, total_used_);
    return p;
  }
  // Makes the arena one block of `bytes` of address space whose pages become resident only when
  // first touched (Linux mmap with MAP_NORESERVE): it never grows by adding blocks, so whatever
  // is allocated between a mark and the top is one run of memory from the first step on, and the
  // memory it holds is what a step touches. Returns false (and changes nothing) where the
  // address space cannot be had; the arena then grows block by block as before.
  bool reserve_address_space(size_t bytes);
  // A point to return to: release(mark) gives back everything allocated since, so a block's
  // activations can be dropped once its output is copied out (activation recomputation).
  struct Mark {
    size_t blocks, used, total_used;
  };
  Mark mark() const { return {blocks_.size(), used_, total_used_}; }
  void release(const Mark& m) {
    while (blocks_.size() > m.blocks) blocks_.pop_back();  // grown since (first steps only)
    used_ = m.used;
    total_used_ = m.total_used;
  }
  // The next float alloc() would hand out if it fits in the current block.
  float* top() { return blocks_.empty() ? nullptr : blocks_.back().data.get() + used_; }
  // Whether everything allocated since m lies in one run from m's position (no block was added).
  bool contiguous_since(const Mark& m) const { return blocks_.size() == m.blocks; }
  // Moves the position of the current block forward to p if p lies beyond it in that block, so
  // nothing allocated next lands below p (a reserve for packed activations to unpack into).
  void advance_to(const float* p) {
    if (blocks_.empty()) return;
    const float* base = blocks_.back().data.get();
    if (p < base + used_ || p > base + blocks_.back().size) return;
    const size_t to = static_cast<size_t>(p - base);
    total_used_ += to - used_;
    used_ = to;
    high_water_ = std::max(high_water_, total_used_);
  }
  // Moves the position of the current block to p (rounded up to the alignment), back or
  // forward, if p lies in that block, so that what is allocated next lands from there on; what
  // was handed out above p must be dead by then. Returns false, changing nothing, otherwise.
  bool move_to(const float* p) {
    if (blocks_.empty()) return false;
    const float* base = blocks_.back().data.get();
    if (p < base || p > base + blocks_.back().size) return false;
    const size_t to = std::min(blocks_.back().size, padded(static_cast<size_t>(p - base)));
    total_used_ = total_used_ - used_ + to;
    used_ = to;
    high_water_ = std::max(high_water_, total_used_);
    return true;
  }
  float* alloc_zeroed(size_t count) {
    float* p = alloc(count);
    parallel_zero(p, count);
    return p;
  }
  // Forget every view; if the step needed several blocks, replace them by one that fits all.
  void reset() {
    if (blocks_.size() > 1) {
      blocks_.clear();
      blocks_.push_back(allocate_block(high_water_));
    }
    used_ = 0;
    total_used_ = 0;
  }
  // Floats in use at the most (a reserved arena's address space is not counted: only what was
  // handed out, which is what its steps touch).
  size_t capacity_floats() const {
    if (reserved_) return high_water_;
    size_t n = 0;
    for (const auto& b : blocks_) n += b.size;
    return n;
  }

 private:
  struct Block {
    std::shared_ptr<float> data;  // freed by the deleter that matches how it was obtained
    size_t size = 0;              // floats
  };
  // Untouched memory: a large block costs nothing until its pages are written.
  static Block allocate_block(size_t floats) {
    const size_t bytes = std::max(kAlignment, (floats * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment);
    float* p = static_cast<float*>(std::aligned_alloc(kAlignment, bytes));
    if (p == nullptr) throw std::bad_alloc();
    return {std::shared_ptr<float>(p, FreeDeleter{}), floats};
  }

  std::vector<Block> blocks_;
  bool reserved_ = false;
  size_t used_ = 0;
  size_t total_used_ = 0;
  size_t high_water_ = 0;
};

}  // namespace keel
