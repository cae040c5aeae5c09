#pragma once
// How a backward kernel writes a gradient: added to what the buffer holds (the default: a buffer
// several ops contribute to, such as a residual's), or overwriting it, for a buffer this kernel is
// the only writer of; the caller then skips zeroing it first (docs/performance.md: the zeroing
// was a tenth of a d512 layer's memory traffic).
#include <type_traits>

namespace keel::kernels {

enum class GradWrite { Accumulate, Overwrite };

// Calls body(std::true_type) to accumulate, body(std::false_type) to overwrite: the choice is a
// compile-time constant inside the loops.
template <typename Body>
void with_grad_write(GradWrite write, Body body) {
  if (write == GradWrite::Accumulate) body(std::true_type{});
  else body(std::false_type{});
}

}  // namespace keel::kernels
