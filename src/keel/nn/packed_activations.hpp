#pragma once
// bf16 activation storage (run.precision = "bf16", run.bf16_activations = "all" or "packed"). Under bf16
// mixed precision most of what a block saves for its backward is bf16 values already (every
// round_activation: projections' outputs, q/k/v, the attention output, gate and up),
// held in fp32 slots. After a sublayer's forward (TransformerModel::forward_block gives each
// attention and each MLP a stretch of its own) its stretch of the activation arena is compacted
// in place: the recorded bf16 tensors to 2 bytes a value, everything else (residual stream,
// norm statistics, log-sum-exps, router state) copied as it is, and the next stretch is laid
// out right after the compacted copy. Before its backward the stretch is expanded back to where
// it was, so every pointer the modules hold is valid again; what it overwrites then (later
// stretches' copies) is dead by that time. Tensors declared unused after the forward (the
// sublayer's output, once copied out of the stretch for the next one; the normed input, which the
// model writes again after the expansion) are dropped from the copy altogether and come back as
// NaN (the backward never reads them as they come back). Memory: the compacted copies
// plus one sublayer expanded, instead of every block in fp32. Nothing is
// rounded that was not already rounded: gradients are bit-identical to keeping the values in fp32
// slots (tested, which also catches a tensor wrongly declared unused).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "keel/core/arena.hpp"
#include "keel/kernels/precision.hpp"
#include "keel/nn/recompute.hpp"

namespace keel::nn {

// run.bf16_activations: how a bf16 training step holds what the blocks keep for the backward.
//   Fp32:   bf16 values in fp32 slots (4 bytes each), the rest fp32.
//   Packed: the bf16 values in 2 bytes, the residual stream's copies in fp32 (gradients
//           bit-identical to Fp32).
//   All:    the default since 2026-12-07 (experiments/bf16_residual/ saw no cost in loss):
//           Packed, plus the residual stream's copies that the backward reads (each block's
//           input and the sums inside it, the norms' inputs) rounded to bf16 when packed, and
//           no fp32 copy of a block's output left between the blocks. Without recomputation the
//           forward is unchanged (it reads the fp32 values); the backward reads the rounded
//           ones, as in training with a bf16 residual stream (Megatron-LM's default,
//           fp32_residual_connection off). Without recomputation the top two blocks
//           run lean (TransformerModel::lean_block): only their input and the sum after
//           their attention kept, in bf16, the rest recomputed in the backward.
//           Under recompute = attention or blocks, each block's input, which the
//           recomputation starts from, is kept in bf16 too, and the forward reads it rounded
//           (TransformerModel::kept_inputs_bf16), so the recomputation sees the forward's values.
enum class Bf16Activations { Fp32, Packed, All };
std::optional<Bf16Activations> parse_bf16_activations(std::string_view name);
std::string_view bf16_activations_name(Bf16Activations a);

namespace detail {
// How PackedActivations moves one piece of `count` values between its fp32 place and its compacted
// place `gap` bytes below (values stored `elem` bytes each: 2 for bf16, 4 for fp32; packing moves
// it down, expanding back up): the waves in the order they run. A split wave's values are moved
// by the team at once, kWaveSlice values a task; the others by one thread in order.
constexpr int64_t kWaveSlice = int64_t{1} << 16;
struct Wave {
  int64_t begin, end;  // values [begin, end)
  bool split;
};
std::vector<Wave> piece_waves(bool pack, int64_t count, int64_t gap, size_t elem);
}  // namespace detail

class PackedActivations {
 public:
  // A fresh training forward over `blocks` stretches.
  void start(size_t blocks);
  // Stretch b is any part of the forward the caller numbers (the model: attention 2l, MLP 2l + 1).
  // Where stretch b's forward records the tensors it rounds (a kernels::Bf16Capture target).
  std::vector<kernels::FloatSpan>* capture(size_t block);
  // Where stretch b's forward lists the tensors its backward never reads (they are not kept).
  std::vector<kernels::FloatSpan>* unused(size_t block);
  // After stretch b's forward, which allocated everything since `since` in `arena`: compacts that
  // stretch in place and leaves the arena just past the compacted copy. A stretch that is not
  // one run of memory (the arena grew a block during the first step) stays as it is.
  void pack(size_t block, Arena& arena, const Arena::Mark& since);
  // After the last stretch's forward: moves the arena past the furthest point any stretch will
  // expand to, so what is allocated from here on (the loss, the backward) is never overwritten.
  void reserve(Arena& arena) const;
  // Before stretch b's backward: its stretch as the forward left it.
  void unpack(size_t block);
  // Of the last training step: bytes the packed bf16 tensors would take in fp32, bytes of the
  // unused tensors dropped (as they lay in the arena), and the bytes of all blocks' compacted
  // copies (bf16 tensors at 2 bytes, the rest at 4).
  size_t packed_fp32_bytes() const { return packed_fp32_bytes_; }
  size_t dropped_bytes() const { return dropped_bytes_; }
  size_t compacted_bytes() const { return compacted_bytes_; }

 private:
  struct Piece {
    size_t from, to;  // byte offsets in the stretch before and after compaction
    int64_t count;    // floats
    size_t stored;    // bytes a value takes in the compacted copy: 4 (fp32), 2 (bf16), 0 (dropped)
  };
  struct Stretch {
    char* base = nullptr;
    size_t bytes = 0;
    std::vector<Piece> pieces;
  };
  std::vector<std::vector<kernels::FloatSpan>> spans_, unused_;
  std::vector<Stretch> stretches_;
  const char* reach_ = nullptr;  // the furthest end of a packed stretch in the arena's newest block
  size_t reach_block_ = 0;       // the arena's block count when reach_ was set
  size_t packed_fp32_bytes_ = 0, dropped_bytes_ = 0, compacted_bytes_ = 0;
};

}  // namespace keel::nn
