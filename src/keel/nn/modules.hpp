#pragma once
// The modules a dense transformer is made of: Norm, Attention, Mlp, and the Sublayer that wires
// a module into the residual stream with pre-, post- or sandwich norms. Each module registers
// its parameters under their HF names, saves what its backward needs in the step's arena, and
// its backward ACCUMULATES into the input gradient and the parameter gradients.
#include <optional>
#include <string>
#include <vector>

#include "keel/arch/model_spec.hpp"
#include "keel/core/arena.hpp"
#include "keel/kernels/activation.hpp"
#include "keel/kernels/rope.hpp"
#include "keel/nn/parameters.hpp"

namespace keel::nn {

// Shapes of the current step: n = batch * seq tokens, each sequence starting at position 0.
struct StepShape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t tokens() const { return batch * seq; }
};

kernels::Activation to_kernel_activation(arch::Activation a);

class Norm {
 public:
  Norm(ParameterStore& store, const std::string& prefix, int64_t dim, arch::NormKind kind, float eps);
  // x: (n, dim) -> returns y: (n, dim) allocated in the arena. x must stay valid until backward.
  float* forward(ParameterStore& store, Arena& arena, const float* x, int64_t n);
  // dy: (n, dim); accumulates dx and the weight (and bias) gradients.
  void backward(ParameterStore& store, const float* dy, float* dx, int64_t n);

 private:
  ParamRef weight_, bias_;
  arch::NormKind kind_;
  int64_t dim_;
  float eps_;
  const float* x_ = nullptr;
  float* mean_ = nullptr;
  float* rstd_ = nullptr;
};

class Attention {
 public:
  Attention(ParameterStore& store, const std::string& prefix, const arch::ModelSpec& spec, const kernels::RopeTable* rope);
  // x: (n, hidden) -> returns y: (n, hidden). max_logit: (heads) running max, updated in place.
  float* forward(ParameterStore& store, Arena& arena, const float* x, const StepShape& s, float* max_logit);
  // Accumulates dx (n, hidden) and the parameter gradients.
  void backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, const StepShape& s);

  int64_t heads() const { return heads_; }

 private:
  bool gpt2_;                      // fused Conv1D c_attn / c_proj in [in, out] layout
  int64_t hidden_, heads_, kv_heads_, head_dim_;
  bool qk_norm_;
  float norm_eps_, softcap_;
  const kernels::RopeTable* rope_;  // null: positions are learned (GPT-2)
  ParamRef wq_, bq_, wk_, bk_, wv_, bv_, wo_, bo_, q_norm_, k_norm_;
  ParamRef w_qkv_, b_qkv_;          // GPT-2
  // Saved for backward.
  const float* x_ = nullptr;
  float *q_raw_ = nullptr, *k_raw_ = nullptr;  // projections before QK-Norm (only with qk_norm)
  float *q_rstd_ = nullptr, *k_rstd_ = nullptr;
  float *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;  // attention inputs (after norm and RoPE)
  float *out_ = nullptr, *lse_ = nullptr;
};

class Mlp {
 public:
  // Gated (SwiGLU/GeGLU/ReGLU) with HF names gate_proj/up_proj/down_proj, or GPT-2's plain
  // c_fc/c_proj MLP. width > 0: an expert-shaped MLP (MoE shared experts) of that width, no biases.
  Mlp(ParameterStore& store, const std::string& prefix, const arch::ModelSpec& spec, int64_t width = 0);
  float* forward(ParameterStore& store, Arena& arena, const float* x, int64_t n);
  void backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, int64_t n);

 private:
  bool gpt2_, gated_, bias_;
  int64_t hidden_, width_;
  kernels::Activation act_;
  ParamRef w_gate_, b_gate_, w_up_, b_up_, w_down_, b_down_;
  const float* x_ = nullptr;
  float *gate_ = nullptr, *up_ = nullptr, *h_ = nullptr;
};

// Wires a module into the residual stream:
//   pre:      out = x + f(N_before(x))
//   post:     out = N_wrap(x + f(x))
//   sandwich: out = x + N_after(f(N_before(x)))
struct Sublayer {
  std::optional<Norm> before, after, wrap;
};

}  // namespace keel::nn
