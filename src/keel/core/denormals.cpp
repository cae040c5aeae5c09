#include "keel/core/denormals.hpp"

#if defined(__x86_64__) || defined(__SSE__)
#include <xmmintrin.h>
#define KEEL_HAS_MXCSR 1
#else
#define KEEL_HAS_MXCSR 0
#endif

namespace keel {

namespace {

#if KEEL_HAS_MXCSR
constexpr unsigned kFlushToZero = 0x8000;       // MXCSR bit 15: subnormal results become 0
constexpr unsigned kDenormalsAreZero = 0x0040;  // MXCSR bit 6: subnormal inputs read as 0
constexpr unsigned kFlushBits = kFlushToZero | kDenormalsAreZero;
#endif

void set_this_thread(bool on) {
#if KEEL_HAS_MXCSR
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(on ? (csr | kFlushBits) : (csr & ~kFlushBits));
#else
  (void)on;
#endif
}

}  // namespace

bool can_flush_denormals() { return KEEL_HAS_MXCSR != 0; }

void set_flush_denormals(bool on) {
  set_this_thread(on);
  // The pool's threads keep the MXCSR they started with; each sets its own.
#pragma omp parallel
  set_this_thread(on);
}

bool flush_denormals_enabled() {
#if KEEL_HAS_MXCSR
  return (_mm_getcsr() & kFlushBits) == kFlushBits;
#else
  return false;
#endif
}

}  // namespace keel
