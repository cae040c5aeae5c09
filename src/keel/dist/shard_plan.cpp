#include "keel/dist/shard_plan.hpp"

#include <algorithm>
#include <numeric>

#include "keel/core/error.hpp"

namespace keel::dist {

namespace {

double newton_schulz_cost(const nn::ParamInfo& p) {
  const double a = static_cast<double>(p.shape[0]);
  const double b = static_cast<double>(p.numel) / a;
  return a * b * std::min(a, b);
}

}  // namespace

ShardPlan plan_shards(const nn::ParameterStore& store, int world, const std::vector<size_t>& whole_entries) {
  KEEL_CHECK(world >= 1);
  const auto& entries = store.entries();
  ShardPlan plan;
  plan.world = world;
  plan.muon_cost.assign(static_cast<size_t>(world), 0.0);

  // Whole matrices: largest cost first (ties: store order), each to the least-loaded rank (ties:
  // the lowest rank).
  std::vector<size_t> whole(whole_entries);
  std::sort(whole.begin(), whole.end());
  whole.erase(std::unique(whole.begin(), whole.end()), whole.end());
  std::vector<size_t> by_cost(whole);
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](size_t x, size_t y) {
    return newton_schulz_cost(entries.at(x)) > newton_schulz_cost(entries.at(y));
  });
  std::vector<int> whole_owner(entries.size(), -1);
  for (size_t e : by_cost) {
    const auto least = std::min_element(plan.muon_cost.begin(), plan.muon_cost.end());
    const int r = static_cast<int>(least - plan.muon_cost.begin());
    whole_owner[e] = r;
    plan.muon_cost[static_cast<size_t>(r)] += newton_schulz_cost(entries[e]);
  }

  for (size_t e = 0; e < entries.size(); ++e) {
    const nn::ParamInfo& p = entries[e];
    if (p.buffer) continue;
    if (whole_owner[e] >= 0) {
      plan.pieces.push_back({e, 0, p.numel, whole_owner[e]});
      continue;
    }
    for (int r = 0; r < world; ++r) {
      const int64_t b = p.numel * r / world, end = p.numel * (r + 1) / world;
      if (end > b) plan.pieces.push_back({e, b, end, r});
    }
  }
  plan.owned.assign(static_cast<size_t>(world), {});
  plan.owned_floats.assign(static_cast<size_t>(world), 0);
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    const Piece& piece = plan.pieces[i];
    plan.owned[static_cast<size_t>(piece.owner)].push_back(i);
    plan.owned_floats[static_cast<size_t>(piece.owner)] += piece.numel();
  }
  return plan;
}

optim::Ownership ShardPlan::ownership(int rank) const {
  std::vector<optim::OwnedSlice> slices;
  for (size_t i : owned.at(static_cast<size_t>(rank))) {
    const Piece& p = pieces[i];
    slices.push_back({p.entry, p.begin, p.end, 0});
  }
  return optim::Ownership(std::move(slices));
}

}  // namespace keel::dist
