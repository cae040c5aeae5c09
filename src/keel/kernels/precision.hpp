#pragma once
// Matmul precision of the calling thread: fp32, or bf16 mixed precision (bf16 operands, fp32
// accumulation; see docs/precision.md). Like torch.autocast it is thread-local state that a
// scope sets and restores, so the model switches every matmul below it with one line and the
// kernels keep their fp32 signatures. The default, fp32, is the path keel always had.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace keel::kernels {

enum class Precision { Fp32, Bf16 };

// "fp32" / "bf16".
std::string_view precision_name(Precision p);
// The inverse of precision_name; nullopt for anything else.
std::optional<Precision> parse_precision(std::string_view name);

// Of the calling thread (OpenMP workers are never asked: kernels read it before their
// parallel regions).
Precision matmul_precision();

// Sets the calling thread's matmul precision for its lifetime, then restores the previous one.
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision previous_;
};

// x: (n), rounded in place to the nearest bf16 value (ties to even) and kept as fp32: how keel
// stores a bf16 activation (emulated storage, docs/precision.md).
void round_to_bf16(float* x, int64_t n);
// round_to_bf16 when the calling thread's precision is bf16; nothing in fp32. Under a
// Bf16Capture of the calling thread it also records x: its values are exact bf16 from here on.
void round_activation(float* x, int64_t n);
// x is about to hold values that are not bf16 (a residual sum written over a projection's
// output): forgets every span recorded under the calling thread's Bf16Capture that overlaps
// [x, x + n), so packing copies it as fp32 instead of rounding it.
void unround_activation(const float* x, int64_t n);

// bf16_activations = "all": x is a residual-stream tensor that a backward reads (a norm's
// input, a block's input). Under a Bf16Capture opened with residual_too it is recorded as it is,
// not rounded: the forward goes on reading its fp32 values, and only the copy kept for the
// backward is rounded to the nearest bf16 when packing compacts it (lossy, unlike every
// round_activation span). Nothing happens otherwise.
void keep_residual_as_bf16(const float* x, int64_t n);

// A run of floats.
struct FloatSpan {
  float* data;
  int64_t count;
};

// While alive, every round_activation of the calling thread in bf16 appends its span to *out:
// the tensors a block stored as bf16 values, which bf16 activation storage then holds packed
// (nn/packed_activations.hpp). With residual_too, keep_residual_as_bf16 appends its spans as
// well. Scopes nest; the innermost one records.
class Bf16Capture {
 public:
  explicit Bf16Capture(std::vector<FloatSpan>* out, bool residual_too = false);
  ~Bf16Capture();
  Bf16Capture(const Bf16Capture&) = delete;
  Bf16Capture& operator=(const Bf16Capture&) = delete;

 private:
  std::vector<FloatSpan>* previous_;
  bool previous_residual_;
};

// src: (n) floats -> dst: (n) bf16 values (rounded to nearest even; exact for values that
// round_to_bf16 produced). dst may overlap src if it starts at or below it (packing in place or
// towards the front of a buffer).
void pack_bf16(const float* src, uint16_t* dst, int64_t n);
// src: (n) bf16 values -> dst: (n) floats. dst may overlap src if it starts at or above it (the
// inverse move).
void unpack_bf16(const uint16_t* src, float* dst, int64_t n);

}  // namespace keel::kernels
