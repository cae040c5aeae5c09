#include "keel/core/stage_timer.hpp"
#include "keel/kernels/activation.hpp"

#include <cmath>
#include <numbers>

#include "keel/kernels/fast_math.hpp"

namespace keel::kernels {

namespace {

// Value and derivative of each activation at one point. Templated on the kind so the element
// loops carry no switch.
template <Activation A>
struct Act;

// SiLU and the tanh GELU use the branch-free exp/tanh of fast_math.hpp so their loops
// vectorize (libm's expf and tanhf are scalar calls without -ffast-math: 8x the time on AVX2).
// The loops ask for 16 lanes (simdlen): they are bound by arithmetic (an exp and a division per
// element), and GCC's tuning for Intel's AVX-512 cores otherwise picks 256-bit vectors; 512-bit
// ones ran the tanh GELU's passes 1.25-1.35x faster on an Intel Xeon. On AVX2 a step is two vectors.
template <>
struct Act<Activation::Silu> {
  static float f(float x) { return x / (1.f + detail::fast_exp(-x)); }
  static float df(float x) {
    const float s = 1.f / (1.f + detail::fast_exp(-x));
    return s * (1.f + x * (1.f - s));
  }
};

template <>
struct Act<Activation::Gelu> {
  static float f(float x) { return 0.5f * x * (1.f + std::erf(x * float(std::numbers::sqrt2 / 2))); }
  static float df(float x) {
    const float cdf = 0.5f * (1.f + std::erf(x * float(std::numbers::sqrt2 / 2)));
    const float pdf = std::exp(-0.5f * x * x) * float(std::numbers::inv_sqrtpi / std::numbers::sqrt2);
    return cdf + x * pdf;
  }
};

template <>
struct Act<Activation::GeluTanh> {
  // Hendrycks & Gimpel 2016, eq. for the tanh approximation: 0.5·x·(1 + tanh(u)) with
  // u = √(2/π)·(x + 0.044715·x³). Computed as x·σ(2u), the same function (½(1 + tanh u) = σ(2u)):
  // one exp and one division, where tanh took an exp, a division and a series for small u, both
  // evaluated in every lane (1.9x SiLU's time per element on an Intel Xeon; docs/performance.md).
  static constexpr float kC = 0.7978845608028654f, kA = 0.044715f;
  static float sigmoid_2u(float x) { return 1.f / (1.f + detail::fast_exp(-2.f * kC * (x + kA * x * x * x))); }
  static float f(float x) { return x * sigmoid_2u(x); }
  static float df(float x) {
    // d/dx x·σ(2u) = σ + x·σ·(1-σ)·2u', u' = √(2/π)·(1 + 3·0.044715·x²).
    const float s = sigmoid_2u(x);
    return s + x * s * (1.f - s) * (2.f * kC) * (1.f + 3.f * kA * x * x);
  }
};

template <>
struct Act<Activation::Relu> {
  static float f(float x) { return x > 0.f ? x : 0.f; }
  static float df(float x) { return x > 0.f ? 1.f : 0.f; }
};

template <class Fn>
void dispatch(Activation act, Fn fn) {
  switch (act) {
    case Activation::Silu: fn(Act<Activation::Silu>{}); return;
    case Activation::Gelu: fn(Act<Activation::Gelu>{}); return;
    case Activation::GeluTanh: fn(Act<Activation::GeluTanh>{}); return;
    case Activation::Relu: fn(Act<Activation::Relu>{}); return;
  }
}

}  // namespace

// x: (n) -> y: (n)
void activation_forward(const float* x, float* y, int64_t n, Activation act) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
  dispatch(act, [&](auto a) {
    using A = decltype(a);
#pragma omp parallel for simd schedule(static) simdlen(16)
    for (int64_t i = 0; i < n; ++i) y[i] = A::f(x[i]);
  });
}

// x, dy: (n); accumulates (or overwrites) dx: (n)
void activation_backward(const float* x, const float* dy, float* dx, int64_t n, Activation act, GradWrite write) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
  with_grad_write(write, [&](auto add) {
    dispatch(act, [&](auto a) {
      using A = decltype(a);
#pragma omp parallel for simd schedule(static) simdlen(16)
      for (int64_t i = 0; i < n; ++i) dx[i] = (add ? dx[i] : 0.f) + A::df(x[i]) * dy[i];
    });
  });
}

// gate, up: (n) -> h: (n)
void gated_forward(const float* gate, const float* up, float* h, int64_t n, Activation act) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
  dispatch(act, [&](auto a) {
    using A = decltype(a);
#pragma omp parallel for simd schedule(static) simdlen(16)
    for (int64_t i = 0; i < n; ++i) h[i] = A::f(gate[i]) * up[i];
  });
}

// gate, up, dh: (n); accumulates (or overwrites) dgate, dup: (n) (either may be null)
void gated_backward(const float* gate, const float* up, const float* dh, float* dgate, float* dup, int64_t n,
                    Activation act, GradWrite write) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
  with_grad_write(write, [&](auto add) {
    dispatch(act, [&](auto a) {
      using A = decltype(a);
      if (dgate != nullptr && dup != nullptr) {  // one pass over the three inputs
#pragma omp parallel for simd schedule(static) simdlen(16)
        for (int64_t i = 0; i < n; ++i) {
          dgate[i] = (add ? dgate[i] : 0.f) + A::df(gate[i]) * up[i] * dh[i];
          dup[i] = (add ? dup[i] : 0.f) + A::f(gate[i]) * dh[i];
        }
        return;
      }
      if (dgate != nullptr) {
#pragma omp parallel for simd schedule(static) simdlen(16)
        for (int64_t i = 0; i < n; ++i) dgate[i] = (add ? dgate[i] : 0.f) + A::df(gate[i]) * up[i] * dh[i];
      }
      if (dup != nullptr) {
#pragma omp parallel for simd schedule(static) simdlen(16)
        for (int64_t i = 0; i < n; ++i) dup[i] = (add ? dup[i] : 0.f) + A::f(gate[i]) * dh[i];
      }
    });
  });
}

// x, dy: (n) -> y, dx: (n)
void activation_backward_and_output(const float* x, const float* dy, float* y, float* dx, int64_t n, Activation act) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
  dispatch(act, [&](auto a) {
    using A = decltype(a);
#pragma omp parallel for simd schedule(static) simdlen(16)
    for (int64_t i = 0; i < n; ++i) {
      const float xi = x[i], dyi = dy[i];  // read before dx (which may be dy) is written
      y[i] = A::f(xi);
      dx[i] = 0.f + A::df(xi) * dyi;  // as activation_backward's overwrite computes it
    }
  });
}

// gate, up, dh: (n) -> h, dgate, dup: (n)
void gated_backward_and_output(const float* gate, const float* up, const float* dh, float* h, float* dgate,
                               float* dup, int64_t n, Activation act) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Elementwise);
  dispatch(act, [&](auto a) {
    using A = decltype(a);
#pragma omp parallel for simd schedule(static) simdlen(16)
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i], u = up[i], d = dh[i];  // read before dgate (gate) and dup (dh) are written
      h[i] = A::f(g) * u;
      dgate[i] = 0.f + A::df(g) * u * d;
      dup[i] = 0.f + A::f(g) * d;
    }
  });
}

}  // namespace keel::kernels
