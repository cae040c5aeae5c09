#pragma once
// Who owns what under ZeRO-1 with distributed Muon: a pure function of the store, the world size
// and the set of Muon matrices, so every rank computes the same plan without talking, and a
// checkpoint written at one world size can be read back at another by recomputing the old plan.
//
//   elementwise parameters (AdamW's, and the buffers' bookkeeping aside): split into N
//     contiguous ranges, rank r owning [numel·r/N, numel·(r+1)/N): state falls as exactly 1/N;
//   Muon matrices: owned whole, never split (Newton–Schulz of a slice is not a slice of
//     Newton–Schulz: the DeepSpeed ZeRO + Muon bug), assigned largest-cost first to the rank with
//     the least cost so far (cost = rows·cols·min(rows, cols), Newton–Schulz's matmul work), as
//     Moonlight's Distributed Muon and Megatron's layer-wise distributed optimizer do.
// Buffers (MoE correction biases) are moved identically on every rank by their own rule and are
// in no piece.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "keel/nn/parameters.hpp"
#include "keel/optim/ownership.hpp"

namespace keel::dist {

struct Piece {
  size_t entry = 0;          // index into store.entries()
  int64_t begin = 0, end = 0;  // elements of that entry
  int owner = 0;
  int64_t numel() const { return end - begin; }
};

struct ShardPlan {
  int world = 1;
  std::vector<Piece> pieces;  // in store order; within an entry, by rank
  // Pieces each rank owns (indices into pieces), in store order.
  std::vector<std::vector<size_t>> owned;
  std::vector<int64_t> owned_floats;  // per rank
  std::vector<double> muon_cost;      // per rank: Newton–Schulz work of its matrices

  // The optimizer ownership of `rank` (its slices, state packed in plan order).
  optim::Ownership ownership(int rank) const;
};

// whole_entries: the Muon matrices (store indices, any order).
ShardPlan plan_shards(const nn::ParameterStore& store, int world, const std::vector<size_t>& whole_entries);

}  // namespace keel::dist
