#pragma once
// Pointwise activations and their gated (GLU) forms.
#include <cstdint>

#include "keel/kernels/grad_write.hpp"

namespace keel::kernels {

enum class Activation {
  Silu,      // x·σ(x) (HF "silu"/"swish")
  Gelu,      // exact erf form (HF "gelu")
  GeluTanh,  // tanh approximation (HF "gelu_new", "gelu_pytorch_tanh")
  Relu,
};

// x: (n) -> y: (n)
void activation_forward(const float* x, float* y, int64_t n, Activation act);
// Accumulates dx += act'(x)·dy (or overwrites dx = act'(x)·dy; then dx may be dy itself).
void activation_backward(const float* x, const float* dy, float* dx, int64_t n, Activation act,
                         GradWrite write = GradWrite::Accumulate);

// gate, up: (n) -> h = act(gate)·up: (n)  (SwiGLU / GeGLU / ReGLU)
void gated_forward(const float* gate, const float* up, float* h, int64_t n, Activation act);
// Accumulates dgate += act'(gate)·up·dh and dup += act(gate)·dh (or overwrites both; then dup may
// be dh itself, as each element of dh is read before dup's is written: the MLP's backward keeps
// one wide buffer fewer).
void gated_backward(const float* gate, const float* up, const float* dh, float* dgate, float* dup, int64_t n,
                    Activation act, GradWrite write = GradWrite::Accumulate);

}  // namespace keel::kernels
