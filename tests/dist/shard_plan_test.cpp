// The ZeRO-1 shard plan and the sharded optimizers without MPI: ranks simulated in one process,
// each stepping its own copy of the store with plan.ownership(rank), then their owned pieces put
// together as the parameter all-gather would. The result must be the one-process step bit for
// bit, including a Muon matrix that straddles the flat midpoint of the store (DeepSpeed's ZeRO
// bug: Newton–Schulz on the half of a matrix a rank happened to hold).
#include "keel/dist/shard_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <cstring>
#include <random>
#include <vector>

#include "keel/optim/adamw.hpp"
#include "keel/optim/muon.hpp"
#include "keel/optim/newton_schulz.hpp"

namespace keel::dist {
namespace {

// embed (10×4), one Muon matrix (8×8), a norm (8), a second matrix (6×8), a buffer (3): the
// midpoint of the flat buffer falls inside the first matrix.
nn::ParameterStore make_store() {
  nn::ParameterStore store;
  store.add("embed", {10, 4}, nn::Init::Normal, false);
  store.add("w1", {8, 8}, nn::Init::Normal, true, true);
  store.add("norm", {8}, nn::Init::Ones, false);
  store.add("w2", {6, 8}, nn::Init::Normal, true, true);
  store.add_buffer("bias", {3});
  store.finalize();
  store.initialize(7, 0.5f);
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (float& x : store.grads()) x = g(rng);
  return store;
}

TEST(ShardPlan, CoversEveryOptimizedElementExactlyOnce) {
  const nn::ParameterStore store = make_store();
  for (int world = 1; world <= 5; ++world) {
    const ShardPlan plan = plan_shards(store, world, {1, 3});
    std::vector<int> covered(static_cast<size_t>(store.size()), 0);
    int64_t owned = 0;
    for (const Piece& p : plan.pieces) {
      for (int64_t i = p.begin; i < p.end; ++i) ++covered[static_cast<size_t>(store.entries()[p.entry].offset + i)];
    }
    for (int64_t f : plan.owned_floats) owned += f;
    for (size_t e = 0; e < store.entries().size(); ++e) {
      const nn::ParamInfo& p = store.entries()[e];
      for (int64_t i = 0; i < p.numel; ++i) EXPECT_EQ(covered[static_cast<size_t>(p.offset + i)], p.buffer ? 0 : 1) << p.name;
    }
    EXPECT_EQ(owned, 40 + 64 + 8 + 48) << world;  // all but the buffer
  }
}

TEST(ShardPlan, MuonMatrixStraddlingTheMidpointIsOwnedWhole) {
  const nn::ParameterStore store = make_store();
  const nn::ParamInfo& w1 = store.entries()[1];
  const int64_t midpoint = store.size() / 2;  // of the flat buffer a naive ZeRO would cut in two
  ASSERT_GT(midpoint, w1.offset);  // a flat split in two would cut w1...
  ASSERT_LT(midpoint, w1.offset + w1.numel);
  const ShardPlan plan = plan_shards(store, 2, {1, 3});
  int pieces_of_w1 = 0;
  for (const Piece& p : plan.pieces) {
    if (p.entry != 1) continue;
    ++pieces_of_w1;
    EXPECT_EQ(p.begin, 0);
    EXPECT_EQ(p.end, w1.numel);
  }
  EXPECT_EQ(pieces_of_w1, 1);  // ...the plan does not
  // The two matrices land on different ranks (largest cost first, least-loaded rank).
  EXPECT_GT(plan.muon_cost[0], 0.0);
  EXPECT_GT(plan.muon_cost[1], 0.0);
}

// What the bug computes: Newton–Schulz of the top half of a matrix is not the top half of
// Newton–Schulz of the matrix.
TEST(ShardPlan, NewtonSchulzOfASliceIsNotASliceOfNewtonSchulz) {
  nn::ParameterStore store = make_store();
  const nn::ParamInfo& w1 = store.entries()[1];
  const float* g = store.grads().data() + w1.offset;
  std::vector<float> whole(64), half(32), ws(static_cast<size_t>(optim::newton_schulz_workspace_floats(8, 8)));
  optim::newton_schulz5(g, whole.data(), 8, 8, ws.data(), 5);
  optim::newton_schulz5(g, half.data(), 4, 8, ws.data(), 5);
  double diff = 0;
  for (int i = 0; i < 32; ++i) diff = std::max(diff, static_cast<double>(std::abs(whole[static_cast<size_t>(i)] - half[static_cast<size_t>(i)])));
  EXPECT_GT(diff, 0.05);
}

// Every simulated rank steps a copy; the owners' pieces are gathered into one store.
template <class MakeOptimizer>
std::vector<float> sharded_step(const ShardPlan& plan, MakeOptimizer make, int steps) {
  std::vector<std::unique_ptr<nn::ParameterStore>> ranks;
  std::vector<std::unique_ptr<optim::Optimizer>> opts;
  for (int r = 0; r < plan.world; ++r) {
    ranks.push_back(std::make_unique<nn::ParameterStore>(make_store()));
    opts.push_back(make(*ranks.back(), plan.ownership(r)));
  }
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < plan.world; ++r) opts[static_cast<size_t>(r)]->step(*ranks[static_cast<size_t>(r)], 0.01f);
    // The all-gather: each piece from its owner, into every rank.
    for (const Piece& p : plan.pieces) {
      const int64_t off = ranks[0]->entries()[p.entry].offset + p.begin;
      const float* src = ranks[static_cast<size_t>(p.owner)]->values().data() + off;
      for (auto& rs : ranks) {
        if (rs->values().data() + off != src) std::memcpy(rs->values().data() + off, src, static_cast<size_t>(p.numel()) * sizeof(float));
      }
    }
  }
  return {ranks[0]->values().begin(), ranks[0]->values().end()};
}

TEST(ShardedOptimizers, ZeroOneAdamWIsTheOneProcessStepBitForBit) {
  const nn::ParameterStore start = make_store();
  nn::ParameterStore single = make_store();
  optim::AdamW full(single, {});
  for (int s = 0; s < 3; ++s) full.step(single, 0.01f);
  for (int world : {2, 3}) {
    const ShardPlan plan = plan_shards(start, world, {});
    auto got = sharded_step(plan, [](nn::ParameterStore&, optim::Ownership own) {
      return std::make_unique<optim::AdamW>(optim::AdamWConfig{}, std::move(own));
    }, 3);
    EXPECT_EQ(got, std::vector<float>(single.values().begin(), single.values().end())) << world;
  }
}

TEST(ShardedOptimizers, DistributedMuonIsTheOneProcessStepBitForBit) {
  const nn::ParameterStore start = make_store();
  nn::ParameterStore single = make_store();
  optim::Muon full(single, {});
  ASSERT_EQ(full.muon_entries(), (std::vector<size_t>{1, 3}));
  for (int s = 0; s < 3; ++s) full.step(single, 0.01f);
  for (int world : {2, 3}) {
    const ShardPlan plan = plan_shards(start, world, optim::Muon::route(start, {}));
    auto got = sharded_step(plan, [](nn::ParameterStore& store, optim::Ownership own) {
      return std::make_unique<optim::Muon>(store, optim::MuonConfig{}, std::move(own));
    }, 3);
    EXPECT_EQ(got, std::vector<float>(single.values().begin(), single.values().end())) << world;
  }
}

TEST(ShardPlan, BalancesNewtonSchulzWorkAcrossRanks) {
  nn::ParameterStore store;
  for (int i = 0; i < 12; ++i) store.add("w" + std::to_string(i), {16 + 4 * (i % 3), 16}, nn::Init::Normal, true, true);
  store.finalize();
  std::vector<size_t> all(12);
  for (size_t i = 0; i < 12; ++i) all[i] = i;
  const ShardPlan plan = plan_shards(store, 4, all);
  const double lo = *std::min_element(plan.muon_cost.begin(), plan.muon_cost.end());
  const double hi = *std::max_element(plan.muon_cost.begin(), plan.muon_cost.end());
  EXPECT_LT(hi - lo, 24.0 * 16 * 16 + 1);  // within one largest matrix's cost
  for (const auto& owned : plan.owned) EXPECT_EQ(owned.size(), 3u);
}

}  // namespace
}  // namespace keel::dist
