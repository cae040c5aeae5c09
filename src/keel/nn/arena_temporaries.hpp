#pragma once
// Floats a forward needs only for a moment (a hidden activation the backward recomputes, a
// product read once by a split): taken from the top of the arena and, when the scope ends, taken
// off the bf16 packing record (their place will hold other values, which packing must not round)
// and given back. Nothing that is kept may be allocated from the arena while one is alive.
#include <cstdint>
#include <vector>

#include "keel/core/arena.hpp"
#include "keel/kernels/precision.hpp"

namespace keel::nn {

class ArenaTemporaries {
 public:
  explicit ArenaTemporaries(Arena& arena) : arena_(arena), mark_(arena.mark()) {}
  ~ArenaTemporaries() {
    for (const kernels::FloatSpan& s : spans_) kernels::unround_activation(s.data, s.count);
    arena_.release(mark_);
  }
  ArenaTemporaries(const ArenaTemporaries&) = delete;
  ArenaTemporaries& operator=(const ArenaTemporaries&) = delete;

  float* alloc(int64_t count) {
    float* p = arena_.alloc(static_cast<size_t>(count));
    spans_.push_back({p, count});
    return p;
  }

 private:
  Arena& arena_;
  Arena::Mark mark_;
  std::vector<kernels::FloatSpan> spans_;
};

}  // namespace keel::nn
