#include "keel/core/arena.hpp"

#include <sys/mman.h>

namespace keel {

bool Arena::reserve_address_space(size_t bytes) {
  const size_t floats = bytes / sizeof(float);
  // Address space, not memory: MAP_NORESERVE asks for no commit charge, so the kernel's default
  // overcommit heuristic grants it; pages are zero-filled and become resident as they are
  // written. Under strict overcommit (vm.overcommit_memory = 2) it fails and nothing changes.
  void* p = mmap(nullptr, floats * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return false;
  const size_t mapped = floats * sizeof(float);
  blocks_.clear();
  blocks_.push_back({std::shared_ptr<float>(static_cast<float*>(p), [mapped](float* q) { munmap(q, mapped); }), floats});
  reserved_ = true;
  used_ = total_used_ = high_water_ = 0;
  return true;
}

}  // namespace keel
