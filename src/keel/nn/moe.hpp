#pragma once
// Mixture-of-Experts FFN: a router picks top-k experts per token (kernels/router.hpp), tokens are
// grouped per expert (a counting sort, stable in token order) so each expert runs one GEMM per
// projection over all of its tokens, and the expert outputs are combined with the routing
// weights. DeepSeek-V3-style layers add shared experts (a plain gated MLP over every token) and
// an e_score_correction_bias buffer that only steers selection and is moved by the
// auxiliary-loss-free rule (update_score_bias), never by the optimizer.
//
// Tensors by role (Router, ExpertGate/Up/Down with the expert index, Shared*), spelled by the
// family's name table (Mixtral's block_sparse_moe.experts.E.w1, the others' mlp.experts.E.*).
// Backward accumulates like every module.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "keel/arch/model_spec.hpp"
#include "keel/core/arena.hpp"
#include "keel/kernels/activation.hpp"
#include "keel/kernels/clamped_swiglu.hpp"
#include "keel/kernels/router.hpp"
#include "keel/nn/modules.hpp"
#include "keel/nn/parameters.hpp"

namespace keel::nn {

kernels::RouterConfig router_config(const arch::MoeSpec& moe);

class Moe {
 public:
  // The routed-expert FFN of decoder layer `layer`; names by role from the family's table.
  Moe(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer);
  // x: (n, hidden) -> returns y: (n, hidden) from the arena. x must stay valid until backward.
  float* forward(ParameterStore& store, Arena& arena, const float* x, int64_t n);
  // Accumulates dx (n, hidden), the expert and router weight gradients (not the bias).
  void backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, int64_t n);
  // The same output with nothing saved: y: (n, hidden), overwritten.
  void infer(const ParameterStore& store, const float* x, float* y, int64_t n) const;
  // The incremental path: infer into the arena.
  float* forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n) const {
    float* y = arena.alloc(static_cast<size_t>(n * hidden_));
    infer(store, x, y, n);
    return y;
  }

  int64_t experts() const { return router_.experts; }
  // Of the last forward: each expert's share of the n·k token assignments (sums to 1), and the
  // mean router entropy in nats.
  const std::vector<float>& load() const { return load_; }
  double entropy() const { return entropy_; }
  // The experts each token chose in the last forward/backward pass: (n, k), slots by rank.
  const std::vector<int32_t>& selected() const { return routing_.indices; }
  // Adds the last forward's assignment counts to those the next bias update uses.
  void accumulate_counts();
  // The counts accumulated since the last update (data parallelism sums them over the ranks).
  std::vector<int64_t>& pending_counts() { return pending_counts_; }
  // DeepSeek-V3 §2.1.2 (auxiliary-loss-free balancing): bias_e += speed·sign(mean − count_e)
  // over the counts accumulated since the last update, which are then cleared. No-op without
  // a correction bias (clears the counts).
  void update_score_bias(ParameterStore& store, float speed);

 private:
  struct Expert {
    ParamRef gate, up, down;
  };
  // Routing of one batch: the selection and the grouped row layout.
  struct Routing {
    std::vector<int32_t> indices;   // (n, k) selected experts
    std::vector<int64_t> offsets;   // (E + 1) first grouped row of each expert
    std::vector<int32_t> row_token; // grouped row -> token
    std::vector<int64_t> slot_row;  // token·k + slot -> grouped row
  };
  // Router, grouping, gather and the expert GEMMs into caller-owned buffers: probs (n, E),
  // weights (n, k), xg/ye (n·k, hidden), g/u/h (n·k, width).
  void route_and_run(const ParameterStore& store, const float* x, int64_t n, float* probs, float* weights, Routing& r,
                     float* xg, float* g, float* u, float* h, float* ye) const;
  // y (n, hidden) += Σ_slot weight · expert output, per token in slot order.
  void combine(const Routing& r, const float* weights, const float* ye, float* y, int64_t n) const;
  // gpt-oss: one expert's slice of the fused stacks ([in, out] each) and its biases.
  struct FusedExpert {
    const float *gate_up, *gate_up_bias, *down, *down_bias;
  };
  FusedExpert fused_expert(const ParameterStore& store, int64_t e) const;
  void activate(const float* g, const float* u, float* h, int64_t m) const;
  // Columns of the gate buffer per row: width, or 2·width for gpt-oss's interleaved gate_up.
  int64_t gate_cols() const { return fused_ ? 2 * width_ : width_; }

  kernels::RouterConfig router_;
  int64_t hidden_, width_;
  kernels::Activation act_;
  ParamRef gate_, bias_;
  ParamRef router_bias_;  // gpt-oss's mlp.router.bias: part of the logits, trained
  bool fused_ = false;    // gpt-oss's fused experts with the clamped SwiGLU
  kernels::ClampedSwiglu swiglu_;
  ParamRef gate_up_, gate_up_bias_, down_, down_bias_;
  std::vector<Expert> experts_;
  std::optional<Mlp> shared_;
  Expert shared_refs_;  // the shared expert's weights, for infer()
  int64_t shared_width_ = 0;
  // Saved by forward.
  const float* x_ = nullptr;
  float *probs_ = nullptr, *weights_ = nullptr;   // (n, E), (n, k)
  float *xg_ = nullptr, *g_ = nullptr, *u_ = nullptr, *ye_ = nullptr;  // grouped rows (h is recomputed)
  Routing routing_;
  std::vector<float> load_;
  double entropy_ = 0;
  std::vector<int64_t> pending_counts_;
};

}  // namespace keel::nn
