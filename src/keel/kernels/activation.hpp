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

// The backward of a layer that did not keep its activation's output: that output recomputed and
// the input gradient written in one pass, one evaluation of the activation per element, where
// the forward kernel then the backward kernel above would each evaluate it. Overwriting.
//   y = act(x) (activation_forward's bits), dx = act'(x)·dy; dx may be dy itself.
void activation_backward_and_output(const float* x, const float* dy, float* y, float* dx, int64_t n, Activation act);
//   h = act(gate)·up (gated_forward's bits), dgate = act'(gate)·up·dh, dup = act(gate)·dh; dup
//   may be dh itself and dgate gate itself (each element is read before it is written).
void gated_backward_and_output(const float* gate, const float* up, const float* dh, float* h, float* dgate,
                               float* dup, int64_t n, Activation act);

}  // namespace keel::kernels
