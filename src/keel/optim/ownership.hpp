#pragma once
// What part of the parameters an optimizer updates and keeps state for. One process owns every
// parameter whole; under ZeRO-1 (dist/shard_plan.hpp) each rank owns a slice of each
// elementwise (AdamW) parameter and whole Muon matrices, and keeps state only for those.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "keel/nn/parameters.hpp"

namespace keel::optim {

// Elements [begin, end) of store entry `entry`; its state starts at state_offset in the
// optimizer's state buffers.
struct OwnedSlice {
  size_t entry = 0;
  int64_t begin = 0, end = 0;
  int64_t state_offset = 0;
  int64_t numel() const { return end - begin; }
};

class Ownership {
 public:
  // Every parameter whole, with state at the store's own offsets (the single-process layout).
  static Ownership everything(const nn::ParameterStore& store);
  // These slices (in store order), with state packed one after another.
  explicit Ownership(std::vector<OwnedSlice> slices);
  Ownership() = default;

  const std::vector<OwnedSlice>& slices() const { return slices_; }
  // Made by everything(): state at the store's offsets.
  bool is_everything() const { return everything_; }
  // Floats of each state buffer.
  int64_t state_floats() const { return state_floats_; }
  // The slice of `entry`, or null when none of it is owned.
  const OwnedSlice* find(size_t entry) const;
  // True when the slice covers the whole of the store entry.
  static bool whole(const OwnedSlice& s, const nn::ParamInfo& p) { return s.begin == 0 && s.end == p.numel; }

 private:
  std::vector<OwnedSlice> slices_;
  std::vector<int64_t> by_entry_;  // entry -> index into slices_, -1 when not owned
  int64_t state_floats_ = 0;
  bool everything_ = false;
  void index();
};

}  // namespace keel::optim
