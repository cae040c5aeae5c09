#pragma once
// Muon (KellerJordan/Muon; Moonlight, "Muon is Scalable for LLM Training", arXiv:2502.16982)
// for the hidden matrices of a ParameterStore, AdamW for everything else.
//
// Per Muon matrix W (A, B) with gradient G, Moonlight's form (toy_train.py; paper eqs. 1, 3, 4):
//   buf ← β·buf + G                  (SGD-sum momentum, β = 0.95)
//   U   ← G + β·buf                  (Nesterov; U = buf without it)
//   O   ← NS5(U)                     (whole matrix, never per head: paper §2.2 warns that small
//                                     per-head matrices get too-large updates)
//   W   ← W·(1 − lr·wd)              (decay with the base lr)
//   W   ← W − lr·scale·O
// scale = 0.2·sqrt(max(A, B)) (Moonlight update-RMS matching, so Muon shares AdamW's lr and wd),
// 0.2/RMS(O) (Moonlight §3.1 "Update Norm": RMS exactly 0.2, one extra pass over O), or
// sqrt(max(1, A/B)) (Keller Jordan; update RMS 1/sqrt(B), lr ~ 0.02). A, B are the stored
// shape's first dimension and the product of the rest.
//
// Why the default lands at ≈0.18 rather than 0.2: 0.2·sqrt(max(A, B)) assumes O has unit singular
// values, but NS5's coefficients trade accuracy for speed and leave them in ≈[0.68, 1.14] with an
// RMS of ≈0.88 (tests/optim/muon_test.cpp measures both). UpdateNorm removes that gap exactly.
//
// Routing by name: a parameter uses Muon when the store marks it `matrix` (attention and MLP
// projections; not embeddings, lm_head, norms or biases), unless a pattern overrides it.
#include <cstdint>
#include <string>
#include <vector>

#include "keel/core/arena.hpp"
#include "keel/nn/parameters.hpp"
#include "keel/optim/adamw.hpp"

namespace keel::optim {

enum class MuonScaling {
  Moonlight,     // 0.2·sqrt(max(A, B)): update RMS 0.2
  KellerJordan,  // sqrt(max(1, A/B)): update RMS 1/sqrt(B)
  UpdateNorm,    // 0.2/RMS(O): update RMS exactly 0.2 whatever NS5's singular values are
};

// "moonlight", "keller_jordan" or "update_norm"; throws keel::Error(source, "optimizer.muon_scaling")
// otherwise (source: the run config the name came from).
MuonScaling parse_muon_scaling(const std::string& name, const std::string& source = "muon");

struct MuonConfig {
  float momentum = 0.95f;
  bool nesterov = true;
  int ns_steps = 5;
  MuonScaling scaling = MuonScaling::Moonlight;
  float update_rms = 0.2f;      // Moonlight's target RMS (paper App. A, Table 8)
  float weight_decay = 0.1f;    // Muon matrices; decays only entries the store marks weight_decay
  AdamWConfig adamw;            // the AdamW group, same lr
  // Name patterns: a pattern with '*' or '?' is a glob over the whole name, otherwise a substring.
  // force_adamw wins over force_muon; force_muon needs a parameter of two or more dimensions.
  std::vector<std::string> force_adamw;
  std::vector<std::string> force_muon;
};

// Glob ('*' any run, '?' one character) over the whole name, or substring when neither appears.
bool name_matches(const std::string& pattern, const std::string& name);

class Muon : public Optimizer {
 public:
  // Throws keel::Error (field "force_muon") when a pattern forces Muon onto a 0-D or 1-D parameter.
  Muon(const nn::ParameterStore& store, MuonConfig config);
  // Owns only these slices (ZeRO-1 with distributed Muon): a Muon matrix must be owned whole,
  // and Newton–Schulz runs here only for the matrices owned.
  Muon(const nn::ParameterStore& store, MuonConfig config, Ownership ownership);
  // The store entries Muon updates under `config` (the rest go to AdamW), in store order. Throws
  // keel::Error (field "force_muon") when a pattern forces Muon onto a 0-D or 1-D parameter.
  static std::vector<size_t> route(const nn::ParameterStore& store, const MuonConfig& config);

  std::string name() const override { return "muon"; }
  // One update of every parameter from the store's gradients (times grad_scale) at learning rate lr.
  void step(nn::ParameterStore& store, float lr, float grad_scale = 1.0f) override;

  bool uses_muon(const std::string& name) const;
  // Owned entries of each group: indices into store.entries().
  const std::vector<size_t>& muon_entries() const { return muon_; }
  const std::vector<size_t>& adamw_entries() const { return adamw_; }
  // Multiplier on lr·O for a (rows, cols) matrix under the configured scaling; o (numel floats)
  // is the orthogonalized update, read only by UpdateNorm.
  float update_scale(int64_t rows, int64_t cols, const float* o = nullptr) const;

  const MuonConfig& config() const { return config_; }
  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t s) override { step_ = s; adamw_opt_.set_steps_taken(s); }
  // momentum (Muon matrices) and its AdamW group's exp_avg, exp_avg_sq; all store-shaped.
  std::vector<std::string> state_names() const override { return {"momentum", "exp_avg", "exp_avg_sq"}; }
  std::span<float> state(const std::string& state_name, const nn::ParamInfo& p) override;
  const Ownership& ownership() const override { return adamw_opt_.ownership(); }
  std::span<float> state(const std::string& state_name, const OwnedSlice& slice) override;
  // Momentum of the Muon matrices at the ownership's state offsets (the store's own in one
  // process; zero elsewhere).
  FloatBuffer& momentum_buffer() { return momentum_; }
  AdamW& adamw() { return adamw_opt_; }
  // Wall time of the Newton–Schulz calls in the last step(), seconds.
  double last_ns_seconds() const { return last_ns_seconds_; }

 private:
  MuonConfig config_;
  std::vector<size_t> muon_, adamw_;
  std::vector<size_t> adamw_slices_;  // indices into ownership().slices() of the AdamW group
  std::vector<std::string> muon_names_;
  FloatBuffer momentum_;
  FloatBuffer update_, ortho_, workspace_;  // scratch sized for the largest Muon matrix
  AdamW adamw_opt_;
  int64_t step_ = 0;
  double last_ns_seconds_ = 0;
};

}  // namespace keel::optim
