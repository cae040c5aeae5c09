#pragma once
// The modules a dense transformer is made of: Norm, Attention, Mlp, and the Sublayer that wires
// a module into the residual stream with pre-, post- or sandwich norms. Each module registers
// its parameters by role (arch/tensor_names.hpp), saves what its backward needs in the step's
// arena, and its backward ACCUMULATES into the input gradient and the parameter gradients
// (Attention's and Mlp's may overwrite the input gradient instead, for a caller whose buffer has
// no other writer: no zeroing pass first).
// Each also has an incremental path (forward_incremental): the same computation for new tokens
// of one sequence, with a KV cache, saving nothing; generation runs only through it.
#include <optional>
#include <string>
#include <vector>

#include "keel/arch/families.hpp"
#include "keel/arch/model_spec.hpp"
#include "keel/core/arena.hpp"
#include "keel/kernels/activation.hpp"
#include "keel/kernels/attention.hpp"
#include "keel/kernels/rope.hpp"
#include "keel/nn/kv_cache.hpp"
#include "keel/nn/parameters.hpp"
#include "keel/nn/qk_norm.hpp"

namespace keel::nn {

// Shapes of the current step: n = batch * seq tokens. Training and evaluation start every
// sequence at position 0; the incremental path (one sequence, batch 1) starts at
// first_position, the number of tokens already in the KV cache.
struct StepShape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t first_position = 0;
  int64_t tokens() const { return batch * seq; }
};

kernels::Activation to_kernel_activation(arch::Activation a);

// RoPE at the step's positions: per sequence from 0, or from first_position when decoding.
void rope_at(float* x, const kernels::RopeTable& table, const StepShape& s, int64_t heads, int64_t head_dim);

class Norm {
 public:
  // role: the norm's kind and layer; the weight (and LayerNorm's bias) are registered for it.
  // unit_offset: Gemma's RMSNorm, x̂·(1 + w) with w initialized at zero (Gemma2RMSNorm).
  Norm(ParameterStore& store, const arch::TensorNameTable& names, arch::TensorKind kind, int64_t layer, int64_t dim,
       arch::NormKind norm_kind, float eps, bool unit_offset = false);
  // x: (n, dim) -> returns y: (n, dim), written to `out` or, where it is null, allocated in the
  // arena. x must stay valid until backward (y need not: the backward reads x and its statistics).
  float* forward(ParameterStore& store, Arena& arena, const float* x, int64_t n, float* out = nullptr);
  // dy: (n, dim); accumulates dx and the weight (and bias) gradients.
  void backward(ParameterStore& store, const float* dy, float* dx, int64_t n);
  // The same y with nothing saved (the incremental path).
  float* forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n) const;
  // Where the last forward wrote y, and y written again there from what that forward saved (x
  // and its statistics) and the gain as it is now: the same bits while the parameters have not
  // changed. A pre-norm's y may be gone from its place before the backward (bf16 packing drops
  // it from its stretch; without packing the next pre-norm writes over it: SharedNormed): the
  // sublayer's backward writes it again (Block::backward_sublayer).
  float* output() const { return y_; }
  bool output_gone() const { return output_gone_; }
  void mark_output_gone() { output_gone_ = true; }
  void recompute_output(const ParameterStore& store, int64_t n);

 private:
  float* compute(const ParameterStore& store, Arena& arena, const float* x, int64_t n, float* out, float*& mean,
                 float*& rstd) const;
  // The gain the kernels multiply by: the weight itself, or 1 + weight in `scratch`.
  const float* gain(const ParameterStore& store, float* scratch) const;
  ParamRef weight_, bias_;
  arch::NormKind kind_;
  bool unit_offset_ = false;
  int64_t dim_;
  float eps_;
  const float* x_ = nullptr;
  float* y_ = nullptr;
  bool output_gone_ = false;
  float* mean_ = nullptr;
  float* rstd_ = nullptr;
};

class Attention {
 public:
  Attention(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer, const kernels::RopeTable* rope);
  // x: (n, hidden) -> returns y: (n, hidden). max_logit: (heads) running max, updated in place.
  float* forward(ParameterStore& store, Arena& arena, const float* x, const StepShape& s, float* max_logit);
  // Accumulates dx (n, hidden) (or overwrites it: dx_write) and the parameter gradients.
  void backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, const StepShape& s,
                kernels::GradWrite dx_write = kernels::GradWrite::Accumulate);
  // n new tokens of one sequence after the cache's rows: the same projections, QK-Norm and RoPE
  // as forward, their keys and values appended to the cache, attention over every cached row.
  float* forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n,
                             KvCache& cache) const;
  // Rows: (kv_heads · head_dim) keys and as many values per token.
  KvCache make_cache(int64_t max_rows) const;

  int64_t heads() const { return heads_; }

  // One kv head and its query heads at a time, each group's q, k, v, attention output and their
  // gradients the only n-row temporaries: the lean top blocks of a bf16 step (model.cpp,
  // TransformerModel::lean_block), whose attention keeps nothing from forward to backward. For
  // the projection layouts of nn.Linear, without an output gate, sinks or full-width QK-Norm.
  bool splits_by_kv_head() const;
  // xn: the normed input (n, hidden) as forward reads it -> y: (n, hidden), overwritten with
  // o_proj's output (rounded under bf16 as forward's). max_logit as in forward.
  void forward_by_kv_head(const ParameterStore& store, Arena& arena, const float* xn, const StepShape& s,
                          float* max_logit, float* y) const;
  // Recomputes each group's forward from xn, then its backward: dxn (n, hidden) overwritten with
  // ∂L/∂xn for dy = ∂L/∂y; the parameter gradients accumulate.
  void backward_by_kv_head(ParameterStore& store, Arena& arena, const float* xn, const float* dy, float* dxn,
                           const StepShape& s) const;

 private:
  // The attention inputs of n tokens: q, k (after QK-Norm and RoPE), v; the pre-norm
  // projections and their rstd only with QK-Norm. With QK-Norm the training forward keeps q_raw
  // and k_raw only and the backward recomputes q and k (an RMSNorm and a rotation), rather than
  // keep both forms of each.
  struct Inputs {
    float *q = nullptr, *k = nullptr, *v = nullptr, *q_raw = nullptr, *k_raw = nullptr;
    float *q_rstd = nullptr, *k_rstd = nullptr;
    float* gate = nullptr;  // the output gate's pre-sigmoid values (n, heads·head_dim)
    float* qkv = nullptr;   // GPT-2: rows of [q | k | v] that q, k and v point into
  };
  // Under bf16, rounds what of q, k and v is not bf16 values yet (q and k that RoPE rotated).
  void round_inputs(const Inputs& in, int64_t n) const;
  // heads_now = false (QK-Norm only): q and k are left null, for normed_heads into buffers of
  // the caller's choosing (the training forward's temporaries, the backward's recomputation).
  Inputs project(const ParameterStore& store, Arena& arena, const float* x, const StepShape& s,
                 bool heads_now = true) const;
  // QK-Norm then RoPE from in's q_raw, k_raw into in.q, in.k (rounded under bf16).
  void normed_heads(const ParameterStore& store, const Inputs& in, const StepShape& s) const;
  kernels::AttentionDims dims(const StepShape& s) const;
  // Kv head g's group: its q, k (QK-Norm, RoPE, rounded as normed_heads makes them), v, and
  // with QK-Norm q_raw, k_raw and their statistics, from the normed input xn; qk_norm: this
  // layer's QK-Norm over one group's heads. And the group's attention dims.
  Inputs project_kv_head(const ParameterStore& store, Arena& arena, const float* xn, const StepShape& s, int64_t g,
                         const std::optional<QkNorm>& qk_norm) const;
  kernels::AttentionDims kv_head_dims(const StepShape& s) const;
  float* output(const ParameterStore& store, Arena& arena, const float* attn, int64_t n) const;
  // What o_proj reads: the attention output, times σ(gate) with the output gate. Also applies
  // the sinks to out and lse (in place) first.
  const float* finish(const ParameterStore& store, Arena& arena, const Inputs& in, float* out, float* lse,
                      const kernels::AttentionDims& d) const;

  arch::ProjectionLayout layout_;  // Gpt2Conv1D: fused c_attn / c_proj in [in, out] layout
  int64_t hidden_, heads_, kv_heads_, head_dim_;
  float softcap_;
  float scale_;      // 1/√head_dim, or Gemma's query_pre_attn_scalar^-1/2
  int64_t window_;   // > 0 on a sliding-window (local) layer
  const kernels::RopeTable* rope_;  // null: positions are learned (GPT-2)
  ParamRef wq_, bq_, wk_, bk_, wv_, bv_, wo_, bo_;
  ParamRef w_qkv_, b_qkv_;          // GPT-2
  ParamRef sinks_;                  // gpt-oss's per-head sink logits (attention_sink.hpp)
  bool output_gate_ = false;        // Qwen3-Next's σ(gate) on each head's output (output_gate.hpp)
  std::optional<QkNorm> qk_norm_;
  // Saved for backward (which puts dq in out_'s place once the attention kernel has read it).
  const float* x_ = nullptr;
  Inputs saved_;
  float *out_ = nullptr, *lse_ = nullptr;
  const float* o_input_ = nullptr;  // out_, or out_·σ(gate) with the output gate
};

class Mlp {
 public:
  // Dense FFN of a layer: gated (SwiGLU/GeGLU/ReGLU; HF gate_proj/up_proj/down_proj) or plain
  // (up, activation, down; GPT-2's c_fc/c_proj). shared: an MoE layer's shared experts, gated,
  // of the given width, no biases.
  Mlp(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer, bool shared = false, int64_t width = 0);
  float* forward(ParameterStore& store, Arena& arena, const float* x, int64_t n);
  // Accumulates dx (n, hidden) (or overwrites it: dx_write) and the parameter gradients.
  void backward(ParameterStore& store, Arena& arena, const float* dy, float* dx, int64_t n,
                kernels::GradWrite dx_write = kernels::GradWrite::Accumulate);
  float* forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n) const;
  // What backward reads, from x and nothing else: gate and up (no h, no down projection).
  // Where forward's output is not kept (the lean top blocks of a bf16 step, model.cpp).
  void forward_for_backward(const ParameterStore& store, Arena& arena, const float* x, int64_t n);

 private:
  float* compute(const ParameterStore& store, Arena& arena, const float* x, int64_t n, float*& gate, float*& up) const;
  void activate(const float* gate, const float* up, float* h, int64_t n) const;
  bool conv1d_, gated_, bias_;
  int64_t hidden_, width_;
  kernels::Activation act_;
  ParamRef w_gate_, b_gate_, w_up_, b_up_, w_down_, b_down_;
  const float* x_ = nullptr;
  // h is recomputed from them; the backward overwrites gate with its gradient and up with h.
  float *gate_ = nullptr, *up_ = nullptr;
};

// Wires a module into the residual stream:
//   pre:      out = x + f(N_before(x))
//   post:     out = N_wrap(x + f(x))
//   sandwich: out = x + N_after(f(N_before(x)))
struct Sublayer {
  std::optional<Norm> before, after, wrap;
};

}  // namespace keel::nn
