#pragma once
// Subnormal floats (|x| < 1.2e-38) take a slow microcode path on many x86 cores, up to ~100
// cycles an operation. Training makes them where values decay towards zero (a post-norm run at a
// high LR in experiments/norm_placement ran 5.5x slower on an Intel Xeon with them than with them
// flushed, and its losses and gradient norms were bit-identical either way). Flushing (x86 MXCSR
// flush-to-zero + denormals-are-zero) changes only values below 1.2e-38.
namespace keel {

// Whether this build can flush (x86-64 with SSE; elsewhere the calls below do nothing).
bool can_flush_denormals();

// Sets or clears flush-to-zero and denormals-are-zero on the calling thread and on every thread
// of the OpenMP pool (threads created later inherit the creating thread's setting).
void set_flush_denormals(bool on);

// Whether the calling thread flushes.
bool flush_denormals_enabled();

}  // namespace keel
