#include "keel/optim/ownership.hpp"

#include <algorithm>

#include "keel/core/error.hpp"

namespace keel::optim {

Ownership Ownership::everything(const nn::ParameterStore& store) {
  Ownership o;
  for (size_t i = 0; i < store.entries().size(); ++i) {
    const nn::ParamInfo& p = store.entries()[i];
    o.slices_.push_back({i, 0, p.numel, p.offset});
  }
  o.state_floats_ = store.size();
  o.everything_ = true;
  o.index();
  return o;
}

Ownership::Ownership(std::vector<OwnedSlice> slices) : slices_(std::move(slices)) {
  int64_t offset = 0;
  for (OwnedSlice& s : slices_) {
    KEEL_CHECK(s.end >= s.begin);
    s.state_offset = offset;
    offset += s.numel();
  }
  state_floats_ = offset;
  index();
}

void Ownership::index() {
  size_t max_entry = 0;
  for (const OwnedSlice& s : slices_) max_entry = std::max(max_entry, s.entry + 1);
  by_entry_.assign(max_entry, -1);
  for (size_t i = 0; i < slices_.size(); ++i) {
    KEEL_CHECK(by_entry_[slices_[i].entry] < 0);  // at most one slice per entry
    by_entry_[slices_[i].entry] = static_cast<int64_t>(i);
  }
}

const OwnedSlice* Ownership::find(size_t entry) const {
  if (entry >= by_entry_.size() || by_entry_[entry] < 0) return nullptr;
  return &slices_[static_cast<size_t>(by_entry_[entry])];
}

}  // namespace keel::optim
