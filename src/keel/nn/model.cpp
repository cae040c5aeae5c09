#include "keel/nn/model.hpp"
#include "keel/core/fixed_order_sum.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "keel/core/error.hpp"
#include "keel/core/parallel_fill.hpp"
#include "keel/core/stage_timer.hpp"
#include "keel/kernels/cross_entropy.hpp"
#include "keel/kernels/embedding.hpp"
#include "keel/kernels/gemm.hpp"
#include "keel/kernels/precision.hpp"

namespace keel::nn {

namespace {

using arch::TensorKind;

// x rounded to bf16 in place and its words written to kept: the forward then reads exactly what
// expand_bf16 gives back.
void keep_as_bf16(float* x, uint16_t* kept, size_t count) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Packing);
  parallel_chunks(count, [&](size_t b, size_t e) {
    kernels::pack_bf16(x + b, kept + b, static_cast<int64_t>(e - b));
    kernels::unpack_bf16(kept + b, x + b, static_cast<int64_t>(e - b));
  });
}

// x's values to the nearest bf16 in kept, x left as it is (the forward goes on reading it).
void words_of(const float* x, uint16_t* kept, size_t count) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Packing);
  parallel_chunks(count, [&](size_t b, size_t e) { kernels::pack_bf16(x + b, kept + b, static_cast<int64_t>(e - b)); });
}

void expand_bf16(const uint16_t* kept, float* x, size_t count) {
  stage_timer::Scope stage_scope(stage_timer::Stage::Packing);
  parallel_chunks(count, [&](size_t b, size_t e) { kernels::unpack_bf16(kept + b, x + b, static_cast<int64_t>(e - b)); });
}

// Builds the norms of one sublayer for the configured placement, by role: pre uses
// input_layernorm before attention and post_attention_layernorm before the FFN (GPT-2's ln_1 and
// ln_2 are the same slots); post wraps with post_attention / post_feedforward; sandwich has all four;
// post_sublayer normalizes each sublayer's output with post_attention / post_feedforward.
Sublayer make_sublayer(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer, bool attention) {
  Sublayer s;
  const float eps = static_cast<float>(spec.norm_eps);
  const arch::TensorNameTable& names = *arch::family_row(spec).names;
  auto norm = [&](TensorKind kind) {
    return Norm(store, names, kind, layer, spec.hidden_size, spec.norm, eps, spec.norm_unit_offset);
  };
  switch (spec.placement) {
    case arch::NormPlacement::Pre:
      s.before.emplace(norm(attention ? TensorKind::InputNorm : TensorKind::PostAttentionNorm));
      break;
    case arch::NormPlacement::Post:
      s.wrap.emplace(norm(attention ? TensorKind::PostAttentionNorm : TensorKind::PostFeedforwardNorm));
      break;
    case arch::NormPlacement::Sandwich:
      s.before.emplace(norm(attention ? TensorKind::InputNorm : TensorKind::PreFeedforwardNorm));
      s.after.emplace(norm(attention ? TensorKind::PostAttentionNorm : TensorKind::PostFeedforwardNorm));
      break;
    case arch::NormPlacement::PostSublayer:
      s.after.emplace(norm(attention ? TensorKind::PostAttentionNorm : TensorKind::PostFeedforwardNorm));
      break;
  }
  return s;
}

std::optional<Attention> make_attention(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer,
                                        const kernels::RopeTable* rope) {
  if (spec.attention.kind == arch::AttentionKind::Mla) return std::nullopt;
  return Attention(store, spec, layer, rope);
}

std::optional<MlaAttention> make_mla(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer,
                                     const kernels::RopeTable* rope) {
  if (spec.attention.kind != arch::AttentionKind::Mla) return std::nullopt;
  return MlaAttention(store, spec, layer, rope);
}

// One residual sublayer, out = wrap(x + after(f(before(x)))), for the training forward and the
// incremental one alike: `norm` runs a Norm (saving for backward or not), `f` the module.
// matmul_input: f reads its input only as a matmul operand (attention's and a dense MLP's
// projections, not a router), so under bf16 the normed input is stored rounded, the value every
// one of its uses takes anyway (packing does not keep it: TransformerModel::drop_normed; without
// packing it goes to the step's shared buffer, normed_out: SharedNormed).
// The sum takes the place of after(f(...)): no backward reads a module's or a norm's output (Norm
// keeps its input, attention its projected heads, an FFN gate and up), so the residual stream
// needs no buffer of its own. Under bf16 that place may have held a rounded projection output;
// the sum is not bf16, so it is taken off the tensors packing stores in 2 bytes (and, under
// bf16_activations = "all", put back as a residual tensor that packing rounds).
// normed_out: where the pre-norm writes its output (SharedNormed), or null for the arena.
template <class Sub, class NormFn, class F>
float* residual(Sub& sub, const float* in, int64_t n, int64_t hidden, bool matmul_input, NormFn&& norm, F&& f,
                float* normed_out = nullptr) {
  const float* f_in = in;
  if (sub.before) {
    float* normed = norm(*sub.before, in, normed_out);
    if (matmul_input) kernels::round_activation(normed, n * hidden);
    f_in = normed;
  }
  float* sum = f(f_in);
  if (sub.after) sum = norm(*sub.after, sum, nullptr);
  const int64_t count = n * hidden;
  kernels::unround_activation(sum, count);
#pragma omp parallel for schedule(static) if (count > 4096)
  for (int64_t i = 0; i < count; ++i) sum[i] += in[i];
  kernels::keep_residual_as_bf16(sum, count);
  if (!sub.wrap) return sum;
  float* out = norm(*sub.wrap, sum, nullptr);
  kernels::keep_residual_as_bf16(out, count);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Block

Block::Block(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer, const kernels::RopeTable* rope)
    : hidden_(spec.hidden_size),
      // Registration order follows the HF checkpoint: norms around attention, attention, MLP.
      attn_norms_(make_sublayer(store, spec, layer, true)),
      mlp_norms_(make_sublayer(store, spec, layer, false)),
      attention_(make_attention(store, spec, layer, rope)),
      mla_(make_mla(store, spec, layer, rope)) {
  if (spec.is_moe_layer(layer)) {
    moe_.emplace(store, spec, layer);
  } else {
    mlp_.emplace(store, spec, layer);
  }
}

float* Block::forward(ParameterStore& store, Arena& arena, const float* x, const StepShape& s, float* max_logit) {
  return forward_mlp(store, arena, forward_attention(store, arena, x, s, max_logit), s);
}

float* Block::forward_attention(ParameterStore& store, Arena& arena, const float* x, const StepShape& s,
                                float* max_logit) {
  const int64_t n = s.tokens();
  auto norm = [&](Norm& nm, const float* in, float* out) { return nm.forward(store, arena, in, n, out); };
  return residual(
      attn_norms_, x, n, hidden_, matmul_input(false), norm,
      [&](const float* in) {
        return attention_ ? attention_->forward(store, arena, in, s, max_logit)
                          : mla_->forward(store, arena, in, s, max_logit);
      },
      claim_shared_normed(attn_norms_));
}

float* Block::forward_mlp(ParameterStore& store, Arena& arena, const float* x1, const StepShape& s) {
  const int64_t n = s.tokens();
  auto norm = [&](Norm& nm, const float* in, float* out) { return nm.forward(store, arena, in, n, out); };
  return residual(
      mlp_norms_, x1, n, hidden_, matmul_input(true), norm,
      [&](const float* in) { return mlp_ ? mlp_->forward(store, arena, in, n) : moe_->forward(store, arena, in, n); },
      claim_shared_normed(mlp_norms_));
}

float* Block::forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n,
                                  KvCache& cache) const {
  auto norm = [&](const Norm& nm, const float* in, float*) { return nm.forward_incremental(store, arena, in, n); };
  float* x1 = residual(attn_norms_, x, n, hidden_, true, norm, [&](const float* in) {
    return attention_ ? attention_->forward_incremental(store, arena, in, n, cache)
                      : mla_->forward_incremental(store, arena, in, n, cache);
  });
  return residual(mlp_norms_, x1, n, hidden_, matmul_input(true), norm, [&](const float* in) {
    return mlp_ ? mlp_->forward_incremental(store, arena, in, n) : moe_->forward_incremental(store, arena, in, n);
  });
}

KvCache Block::make_cache(int64_t max_rows) const {
  return attention_ ? attention_->make_cache(max_rows) : mla_->make_cache(max_rows);
}

void Block::backward_sublayer(Sublayer& sub, ParameterStore& store, Arena& arena, float* grad, const StepShape& s,
                              bool attention, float* spare) {
  const int64_t n = s.tokens();
  const size_t size = static_cast<size_t>(n * hidden_);
  // Reverses Sublayer: out = wrap(x + after(f(before(x)))). grad holds ∂L/∂out on entry and is
  // turned into ∂L/∂x in place: it is the residual path, and the branch's gradient is added into
  // it only after the branch's last read of the gradient it starts from.
  auto f_backward = [&](const float* dy, float* dx, kernels::GradWrite dx_write) {
    if (attention) {
      if (attention_) attention_->backward(store, arena, dy, dx, s, dx_write);
      else mla_->backward(store, arena, dy, dx, s, dx_write);
    } else {
      if (mlp_) mlp_->backward(store, arena, dy, dx, n, dx_write);
      else moe_->backward(store, arena, dy, dx, n);
    }
  };
  // Attention (GQA or MLA) and the dense MLP can overwrite an input gradient; MoE accumulates only.
  const bool branch_overwrites = attention || mlp_.has_value();
  // Everything allocated here is given back at the end, so the attention's backward reuses the
  // memory of the MLP's (the larger of the two, not their sum).
  const Arena::Mark scratch = arena.mark();
  const float* ds = grad;
  if (sub.wrap) {
    float* t = arena.alloc_zeroed(size);
    sub.wrap->backward(store, grad, t, n);
    parallel_copy(grad, t, size);  // the residual path; the branch reads t
    ds = t;
  }
  const float* dy = ds;
  if (sub.after) {
    float* t = arena.alloc_zeroed(size);
    sub.after->backward(store, ds, t, n);
    dy = t;
  }
  if (sub.before) {
    restore_normed_input(store, sub, !attention, n);
    // The branch reads dy (perhaps grad itself) and writes d_in; only the norm writes grad. d_in
    // has no other writer: a branch that can overwrite it skips the zeroing. A spare buffer takes
    // it out of the arena, from under the branch's temporaries (at the peak of a packed step).
    float* d_in = spare != nullptr ? spare : arena.alloc(size);
    if (!branch_overwrites) parallel_zero(d_in, size);
    f_backward(dy, d_in, branch_overwrites ? kernels::GradWrite::Overwrite : kernels::GradWrite::Accumulate);
    sub.before->backward(store, d_in, grad, n);
  } else {
    // Post or post-sublayer norms: the branch reads wrap's or after's gradient, a buffer of its
    // own, and accumulates into grad. Every placement has a norm (make_sublayer), so the branch
    // never reads grad while it writes it.
    KEEL_CHECK(dy != grad);
    f_backward(dy, grad, kernels::GradWrite::Accumulate);
  }
  arena.release(scratch);
}

bool Block::can_run_lean() const {
  auto pre_only = [](const Sublayer& sub) { return sub.before && !sub.after && !sub.wrap; };
  return attention_ && attention_->splits_by_kv_head() && mlp_ && pre_only(attn_norms_) && pre_only(mlp_norms_);
}

namespace {
// Rows of the lean block's MLP a pass: its n-row temporaries (gate, up, dh, the normed input)
// are this many rows, whatever the step's tokens.
constexpr int64_t kLeanRows = 256;

template <class F>
void for_row_runs(int64_t n, F&& f) {
  for (int64_t r0 = 0; r0 < n; r0 += kLeanRows) f(r0, std::min(kLeanRows, n - r0));
}
}  // namespace

void Block::forward_lean(ParameterStore& store, Arena& arena, const float* x, float* x1, float* out, const StepShape& s,
                         float* max_logit, uint16_t* x_words, uint16_t* x1_words) {
  KEEL_CHECK(can_run_lean() && x1 != x && x1 != out);
  const int64_t n = s.tokens(), size = n * hidden_;
  // As every block under "all": the forward reads the fp32 residual stream, the backward its
  // copies rounded to bf16 (here the only things kept).
  words_of(x, x_words, static_cast<size_t>(size));
  {
    const Arena::Mark mark = arena.mark();
    float* xn = attn_norms_.before->forward(store, arena, x, n);
    kernels::round_activation(xn, size);
    attention_->forward_by_kv_head(store, arena, xn, s, max_logit, x1);
    arena.release(mark);
  }
#pragma omp parallel for schedule(static) if (size > 4096)
  for (int64_t i = 0; i < size; ++i) x1[i] += x[i];  // residual: y + x, as Sublayer's sum
  words_of(x1, x1_words, static_cast<size_t>(size));  // likewise the MLP's input
  for_row_runs(n, [&](int64_t r0, int64_t rows) {
    const Arena::Mark mark = arena.mark();
    const int64_t begin = r0 * hidden_, count = rows * hidden_;
    float* xn = mlp_norms_.before->forward(store, arena, x1 + begin, rows);
    kernels::round_activation(xn, count);
    const float* y = mlp_->forward(store, arena, xn, rows);
#pragma omp parallel for schedule(static) if (count > 4096)
    for (int64_t i = 0; i < count; ++i) out[begin + i] = y[i] + x1[begin + i];
    arena.release(mark);
  });
}

void Block::backward_lean(ParameterStore& store, Arena& arena, float* grad, const StepShape& s,
                          const uint16_t* x_words, const uint16_t* x1_words) {
  KEEL_CHECK(can_run_lean());
  const int64_t n = s.tokens(), size = n * hidden_;
  // The MLP's backward, a run of rows at a time: each row's gradient depends on its own row only,
  // and the weight gradients accumulate over the runs.
  for_row_runs(n, [&](int64_t r0, int64_t rows) {
    const Arena::Mark mark = arena.mark();
    const int64_t begin = r0 * hidden_, count = rows * hidden_;
    float* x1 = arena.alloc(static_cast<size_t>(count));
    expand_bf16(x1_words + begin, x1, static_cast<size_t>(count));
    float* xn = mlp_norms_.before->forward(store, arena, x1, rows);
    kernels::round_activation(xn, count);
    mlp_->forward_for_backward(store, arena, xn, rows);
    float* d_in = arena.alloc(static_cast<size_t>(count));
    mlp_->backward(store, arena, grad + begin, d_in, rows, kernels::GradWrite::Overwrite);
    mlp_norms_.before->backward(store, d_in, grad + begin, rows);
    arena.release(mark);
  });
  const Arena::Mark mark = arena.mark();
  float* x = arena.alloc(static_cast<size_t>(size));
  expand_bf16(x_words, x, static_cast<size_t>(size));
  float* xn = attn_norms_.before->forward(store, arena, x, n);
  kernels::round_activation(xn, size);
  float* d_in = arena.alloc(static_cast<size_t>(size));
  attention_->backward_by_kv_head(store, arena, xn, grad, d_in, s);
  attn_norms_.before->backward(store, d_in, grad, n);
  arena.release(mark);
}

float* Block::give_up_normed_input(bool mlp) {
  Sublayer& sub = mlp ? mlp_norms_ : attn_norms_;
  if (!sub.before) return nullptr;
  sub.before->mark_output_gone();
  return sub.before->output();
}

void Block::restore_normed_input(const ParameterStore& store, Sublayer& sub, bool mlp, int64_t n) {
  if (!sub.before || !sub.before->output_gone()) return;
  claim_shared_normed(sub);
  sub.before->recompute_output(store, n);
  if (matmul_input(mlp)) kernels::round_activation(sub.before->output(), n * hidden_);
}

float* Block::claim_shared_normed(Sublayer& sub) {
  if (shared_normed_ == nullptr || !sub.before) return nullptr;
  Norm* norm = &*sub.before;
  if (shared_normed_->holder != nullptr && shared_normed_->holder != norm) shared_normed_->holder->mark_output_gone();
  shared_normed_->holder = norm;
  return shared_normed_->data;
}

void Block::backward_mlp(ParameterStore& store, Arena& arena, float* grad, const StepShape& s, float* spare) {
  backward_sublayer(mlp_norms_, store, arena, grad, s, false, spare);
}

void Block::backward_attention(ParameterStore& store, Arena& arena, float* grad, const StepShape& s, float* spare) {
  backward_sublayer(attn_norms_, store, arena, grad, s, true, spare);
}

void Block::backward(ParameterStore& store, Arena& arena, float* grad, const StepShape& s) {
  backward_mlp(store, arena, grad, s);
  backward_attention(store, arena, grad, s);
}

// ---------------------------------------------------------------------------------------------
// TransformerModel

void check_trainable(const arch::ModelSpec& spec) {
  const arch::FamilyRow& row = arch::family_row(spec);
  if (!row.supports.train) {
    std::string why = "keel cannot build " + spec.model_type + " models (inspect only)";
    std::string layers;
    int64_t count = 0;
    for (int64_t l = 0; l < spec.num_layers; ++l) {
      if (!spec.is_linear_attention_layer(l)) continue;
      if (count < 6) layers += (count ? ", " : "") + std::to_string(l);
      ++count;
    }
    if (count > 0) {
      why = spec.model_type + " cannot be trained: its " + std::to_string(count) +
            " Gated DeltaNet (linear_attention) layers (" + layers + (count > 6 ? ", ..." : "") +
            ") are a linear-attention recurrence keel does not implement; keel inspect reads it, and its gated "
            "attention and zero-centred norms train on other families as keel.attn_output_gate and keel.norm = "
            "\"rmsnorm_1p\"";
    }
    throw Error(spec.source, "model_type", why);
  }
}

TransformerModel::TransformerModel(const arch::ModelSpec& spec) : spec_(spec) {
  const arch::FamilyRow& row = arch::family_row(spec);
  check_trainable(spec);
  // One stretch of address space for the activations (pages resident only once touched), so a
  // block's activations are one run of memory from the first step on: bf16 packing compacts
  // them in place (packed_activations.hpp). 512 GiB of addresses, far above any CPU run's need;
  // where it cannot be had the arena grows block by block and the first step packs less.
  arena_.reserve_address_space(size_t{512} << 30);
  const arch::TensorNameTable& names = *row.names;
  const int64_t h = spec.hidden_size;
  embed_ = store_.add(names, {TensorKind::Embedding}, {spec.vocab_size, h});
  if (spec.attention.learned_positions) {
    positions_ = store_.add(names, {TensorKind::PositionEmbedding}, {spec.max_position_embeddings, h});
  } else {
    rope_ = kernels::make_rope_table(spec.attention.rope.theta, spec.attention.rope.rotary_dim,
                                     spec.max_position_embeddings, spec.attention.rope.scaling, spec.source);
    rope_.interleave = spec.attention.rope.interleave;  // only MLA configs set rope_interleave
  }
  const kernels::RopeTable* rope = spec.attention.learned_positions ? nullptr : &rope_;
  const double local_theta = spec.attention.rope.local_theta;
  if (rope && local_theta > 0) {
    local_rope_ = kernels::make_rope_table(local_theta, spec.attention.rope.rotary_dim, spec.max_position_embeddings,
                                           nlohmann::json(nullptr), spec.source);
  }
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const kernels::RopeTable* layer_rope = rope && local_theta > 0 && spec.is_sliding_layer(l) ? &local_rope_ : rope;
    blocks_.push_back(std::make_unique<Block>(store_, spec, l, layer_rope));
  }
  if (spec.has_final_norm()) {
    final_norm_.emplace(store_, names, TensorKind::FinalNorm, -1, h, spec.norm, static_cast<float>(spec.norm_eps),
                        spec.norm_unit_offset);
  }
  if (!spec.tie_word_embeddings) lm_head_ = store_.add(names, {TensorKind::LmHead}, {spec.vocab_size, h});
  if (spec.norm_weight_decay) store_.decay_norm_gains();
  store_.finalize();
  max_logits_.assign(static_cast<size_t>(spec.num_layers * spec.attention.num_heads),
                     -std::numeric_limits<float>::infinity());
  expert_load_.assign(static_cast<size_t>(spec.num_layers * spec.moe.num_experts), 0.0f);
  router_entropy_.assign(static_cast<size_t>(spec.num_layers), 0.0f);
  activation_ms_.assign(static_cast<size_t>(spec.num_layers), 0.0);
}

void TransformerModel::update_router_bias(float speed) {
  for (auto& b : blocks_) {
    if (Moe* m = b->moe()) m->update_score_bias(store_, speed);
  }
}

std::vector<std::vector<int64_t>*> TransformerModel::pending_router_counts() {
  std::vector<std::vector<int64_t>*> out;
  for (auto& b : blocks_) {
    if (Moe* m = b->moe()) out.push_back(&m->pending_counts());
  }
  return out;
}

void TransformerModel::initialize(uint64_t seed) {
  store_.initialize(seed, static_cast<float>(spec_.initializer_range));
}

const float* TransformerModel::lm_head_weight() const {
  return store_.data(lm_head_.valid() ? lm_head_ : embed_);
}

void TransformerModel::embed(const int32_t* tokens, const StepShape& s, float* x) const {
  const int64_t n = s.tokens(), h = spec_.hidden_size;
  kernels::embedding_forward(tokens, store_.data(embed_), x, n, h, static_cast<float>(spec_.embed_scale));
  if (positions_.valid()) {
    const float* wpe = store_.data(positions_);
#pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t i = 0; i < n; ++i) {
      const float* p = wpe + (s.first_position + i % s.seq) * h;
      for (int64_t c = 0; c < h; ++c) x[i * h + c] += p[c];
    }
  }
}

std::optional<Recompute> parse_recompute(std::string_view name) {
  if (name == "none") return Recompute::None;
  if (name == "attention") return Recompute::Attention;
  if (name == "blocks") return Recompute::Blocks;
  return std::nullopt;
}

std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Attention: return "attention";
    case Recompute::Blocks: return "blocks";
  }
  return "none";
}

float* TransformerModel::forward_block(size_t l, float* x, const StepShape& s, bool for_backward) {
  float* max_logit = max_logits_of(l);
  Block& block = *blocks_[l];
  const size_t size = static_cast<size_t>(s.tokens() * spec_.hidden_size);
  // A packed step without recomputation (and the MLPs of recompute = attention under "all"):
  // each sublayer runs in a stretch of its own (packed_activations.hpp), on a copy of its
  // input made at the stretch's start, and its output goes to the residual buffer its input is
  // not in, outside every stretch: nothing fp32 of the residual stream stays between two
  // stretches. The backward expands one sublayer at a time, the MLP's and then the attention's
  // over it, with its temporaries right above the one expanded (backward_block): at its peak
  // a block is one sublayer packed and one expanded, not both expanded. Every attention is
  // packed, the last one's too, since its MLP's backward runs first; the last MLP is not, its
  // backward being the first to run. Under bf16_activations = "all" each input copy is a
  // residual tensor that packing rounds to bf16. A packed stretch keeps no copy of its pre-norm's
  // output: the backward writes it again from the norm's input and statistics (drop_normed).
  const bool round_residuals = bf16_activations_ == Bf16Activations::All;
  auto sublayer = [&](size_t part, const float* in, float* dest, bool compact, auto&& f) {
    const Arena::Mark mark = arena_.mark();
    const float* out = nullptr;
    {
      kernels::Bf16Capture capture(packed_.capture(part), round_residuals);
      float* input = arena_.alloc(size);
      parallel_copy(input, in, size);
      kernels::keep_residual_as_bf16(input, static_cast<int64_t>(size));
      out = f(input);
    }
    parallel_copy(dest, out, size);
    expanded_end_[part] = stretch_end(out, size);
    if (compact) pack_sublayer(l, part, out, s.tokens(), mark);  // the next sublayer reads dest
    return dest;
  };
  float* other = x == residual_buffers_[0] ? residual_buffers_[1] : residual_buffers_[0];
  if (for_backward && lean_block(l)) {
    // The block's input and the sum after its attention, kept in bf16 as the backward of "all"
    // reads them; nothing else of the block is kept. The output goes over the input.
    auto* words = reinterpret_cast<uint16_t*>(arena_.alloc(size));
    block.forward_lean(store_, arena_, x, other, x, s, max_logit, words, words + size);
    lean_words_[l] = words;
    return x;
  }
  if (packing_ && recompute_ == Recompute::None) {
    float* x1 = sublayer(2 * l, x, other, true, [&](const float* in) {
      return block.forward_attention(store_, arena_, in, s, max_logit);
    });
    return sublayer(2 * l + 1, x1, x, l + 1 < blocks_.size(),
                    [&](const float* in) { return block.forward_mlp(store_, arena_, in, s); });
  }
  if (for_backward && kept_inputs_bf16()) {
    // Recomputation under bf16_activations = "all": the block's input, rounded to bf16 in place
    // so that the forward reads what the recomputation will, is kept in 2 bytes a value; the
    // stream between blocks lives in the two residual buffers below every stretch, as without
    // recomputation. Blocks recomputes the whole block from it; attention recomputes the
    // attention and packs the MLP's stretch, its input copy rounded as without recomputation.
    auto* kept = reinterpret_cast<uint16_t*>(arena_.alloc((size + 1) / 2));
    keep_as_bf16(x, kept, size);
    block_inputs_bf16_[l] = kept;
    const Arena::Mark mark = arena_.mark();
    if (recompute_ == Recompute::Blocks) {
      run_block_released(l, x, other, s);
      return other;
    }
    parallel_copy(other, block.forward_attention(store_, arena_, x, s, max_logit), size);
    arena_.release(mark);
    return sublayer(2 * l + 1, other, x, l + 1 < blocks_.size(),
                    [&](const float* in) { return block.forward_mlp(store_, arena_, in, s); });
  }
  // Runs part of the block in its own stretch of the arena, copies the part's output to a buffer
  // allocated before that stretch, then hands the stretch to `done`: given back (recomputation)
  // or packed as bf16 (recompute = attention packs the MLP's stretch).
  auto keep_output = [&](auto&& part, auto&& done) -> float* {
    float* kept = arena_.alloc(size);
    const Arena::Mark mark = arena_.mark();
    const float* out = part();
    parallel_copy(kept, out, size);
    done(mark, out);
    return kept;
  };
  auto given_back = [&](const Arena::Mark& mark, const float*) { arena_.release(mark); };
  if (!for_backward || recompute_ == Recompute::None) return block.forward(store_, arena_, x, s, max_logit);
  // Recomputation keeps the block's input (already in the arena) and the part's output.
  block_inputs_[l] = x;
  if (recompute_ == Recompute::Blocks) {
    float* kept = arena_.alloc(size);
    run_block_released(l, x, kept, s);
    return kept;
  }
  float* x1 = keep_output([&] { return block.forward_attention(store_, arena_, x, s, max_logit); }, given_back);
  auto mlp = [&] { return block.forward_mlp(store_, arena_, x1, s); };
  // The last block's MLP is not packed: its backward comes first.
  if (!packing_ || l + 1 == blocks_.size()) return mlp();
  const size_t part = 2 * l + 1;
  return keep_output(
      [&] {
        kernels::Bf16Capture capture(packed_.capture(part));
        return mlp();
      },
      [&](const Arena::Mark& mark, const float* out) {
        pack_sublayer(l, part, out, s.tokens(), mark);  // the next block reads the kept copy
      });
}

bool TransformerModel::lean_block(size_t l) const {
  if (!packing_ || recompute_ != Recompute::None || bf16_activations_ != Bf16Activations::All ||
      l + lean_top_blocks_ < blocks_.size()) {
    return false;
  }
  // Only an unbroken run of lean blocks at the top moves the peak: a block that cannot run lean
  // above l (an MoE layer) is expanded whole on top of l's kept words anyway.
  for (size_t k = l; k < blocks_.size(); ++k) {
    if (!blocks_[k]->can_run_lean()) return false;
  }
  return true;
}

bool TransformerModel::kept_inputs_bf16() const {
  return packing_ && recompute_ != Recompute::None && bf16_activations_ == Bf16Activations::All;
}

const float* TransformerModel::kept_input_end(size_t l, const StepShape& s) const {
  const size_t size = static_cast<size_t>(s.tokens() * spec_.hidden_size);
  return reinterpret_cast<const float*>(block_inputs_bf16_[l]) + Arena::padded((size + 1) / 2);
}

const float* TransformerModel::block_input(size_t l, const StepShape& s) {
  if (block_inputs_bf16_[l] == nullptr) return block_inputs_[l];
  const size_t size = static_cast<size_t>(s.tokens() * spec_.hidden_size);
  float* x = arena_.alloc(size);  // given back with the block's backward temporaries
  expand_bf16(block_inputs_bf16_[l], x, size);
  return x;
}

void TransformerModel::drop_normed(size_t l, size_t part, int64_t n) {
  // What the norm's saved input and statistics give again, bit for bit: n × hidden values a
  // stretch need not hold (4 of Qwen3-0.6B's 32 KiB a token and block under "all").
  float* normed = blocks_[l]->give_up_normed_input(part % 2 == 1);
  if (normed != nullptr) packed_.unused(part)->push_back({normed, n * spec_.hidden_size});
}

void TransformerModel::pack_sublayer(size_t l, size_t part, const float* out, int64_t n, const Arena::Mark& since) {
  // The stretch's copy of the output is read no more: it was copied out for what comes next.
  packed_.unused(part)->push_back({const_cast<float*>(out), n * spec_.hidden_size});
  drop_normed(l, part, n);
  packed_.pack(part, arena_, since);
}

void TransformerModel::backward_block(size_t l, float* grad, const StepShape& s) {
  float* max_logit = max_logits_of(l);
  Block& block = *blocks_[l];
  // The backward's own temporaries are given back after each block in every mode: only grad,
  // now the block's input gradient, travels on to the block below.
  const Arena::Mark mark = arena_.mark();
  if (lean_block(l)) {
    // Everything above the block's words is dead (later blocks, the loss; grad is a residual
    // buffer below every block): the recomputation and the backward go right above them.
    const size_t size = static_cast<size_t>(s.tokens() * spec_.hidden_size);
    arena_.move_to(reinterpret_cast<const float*>(lean_words_[l]) + Arena::padded(size));
    block.backward_lean(store_, arena_, grad, s, lean_words_[l], lean_words_[l] + size);
    arena_.release(mark);
    return;
  }
  switch (recompute_) {
    case Recompute::None:
      if (packing_) {
        // One sublayer expanded at a time (forward_block). Everything above the expanded stretch
        // is dead (later sublayers, the loss; grad is a residual buffer below every stretch), so
        // the sublayer's temporaries go right above it. A stretch in an older block of a growing
        // arena (a first step without reserved address space) leaves them on top (move_to).
        packed_.unpack(2 * l + 1);  // its normed input is written again by its backward
        arena_.move_to(expanded_end_[2 * l + 1]);
        block.backward_mlp(store_, arena_, grad, s, spare_residual(grad));
        packed_.unpack(2 * l);
        arena_.move_to(expanded_end_[2 * l]);
        block.backward_attention(store_, arena_, grad, s, spare_residual(grad));
      } else {
        block.backward(store_, arena_, grad, s);
      }
      break;
    case Recompute::Blocks:
      // With the inputs kept in bf16 everything above block l's own is dead (later blocks' inputs,
      // the loss; grad is a residual buffer below them all): the recomputation goes right there.
      if (kept_inputs_bf16()) arena_.move_to(kept_input_end(l, s));
      if (packing_ && !recompute_whole_blocks_) {
        recompute_block_packed(l, grad, s);
      } else {
        block.forward(store_, arena_, block_input(l, s), s, max_logit);  // the same values again
        block.backward(store_, arena_, grad, s);
      }
      break;
    case Recompute::Attention:
      if (packing_) packed_.unpack(2 * l + 1);
      // With the inputs kept in bf16, as without recomputation: the MLP's temporaries right above
      // its expanded stretch, and then the attention's recomputation over that dead stretch.
      if (kept_inputs_bf16()) arena_.move_to(expanded_end_[2 * l + 1]);
      block.backward_mlp(store_, arena_, grad, s, spare_residual(grad));
      if (kept_inputs_bf16()) arena_.move_to(kept_input_end(l, s));
      block.forward_attention(store_, arena_, block_input(l, s), s, max_logit);
      block.backward_attention(store_, arena_, grad, s, spare_residual(grad));
      break;
  }
  arena_.release(mark);
}

void TransformerModel::run_block_released(size_t l, const float* x, float* dest, const StepShape& s) {
  // Block::forward would hold the attention's activations under the MLP's forward; each
  // sublayer's are dead once its output is copied out, so the MLP runs over the attention's.
  float* max_logit = max_logits_of(l);
  Block& block = *blocks_[l];
  const size_t size = static_cast<size_t>(s.tokens() * spec_.hidden_size);
  const Arena::Mark mark = arena_.mark();
  parallel_copy(dest, block.forward_attention(store_, arena_, x, s, max_logit), size);
  arena_.release(mark);
  const float* out = block.forward_mlp(store_, arena_, dest, s);
  KEEL_CHECK(out != dest);  // the sum is in the arena: dest, the MLP's input, is read no more
  parallel_copy(dest, out, size);
  arena_.release(mark);
}

void TransformerModel::recompute_block_packed(size_t l, float* grad, const StepShape& s) {
  // The whole block recomputed in fp32 held its attention's activations under the MLP's
  // backward, and the MLP's under the attention's: at Qwen3-0.6B's shape 59% of the step's
  // arena per token under "all" (docs/performance.md, "Recomputed blocks a sublayer at a
  // time"). Recomputed as forward_block lays out a step without recomputation, a block holds one
  // sublayer expanded at a time: the attention runs in a stretch of its own that is packed
  // straight away, the MLP above it in fp32 (its backward comes first), and the attention's
  // stretch is expanded over the dead MLP for its own backward. Nothing is rounded that the
  // forward did not round (no residual spans are recorded), so the gradients are the bits of the
  // whole-block recomputation.
  float* max_logit = max_logits_of(l);
  Block& block = *blocks_[l];
  const int64_t n = s.tokens();
  const size_t size = static_cast<size_t>(n * spec_.hidden_size);
  const size_t part = 2 * l;
  const float* x = block_input(l, s);  // below the stretch, alive through the attention's backward
  // The MLP's input: under "all" the residual buffer grad is not in (it held the last block's
  // output, dead once the final norm's backward, or the loss without one, has read it),
  // otherwise a buffer below the stretch.
  float* x1 = kept_inputs_bf16() ? spare_residual(grad) : arena_.alloc(size);
  const Arena::Mark mark = arena_.mark();
  const float* out = nullptr;
  {
    kernels::Bf16Capture capture(packed_.capture(part));
    out = block.forward_attention(store_, arena_, x, s, max_logit);  // the forward's values again
  }
  parallel_copy(x1, out, size);
  expanded_end_[part] = stretch_end(out, size);
  pack_sublayer(l, part, out, n, mark);
  // The MLP's output is read by nothing: where it is its last allocation the temporaries start there.
  arena_.move_to(stretch_end(block.forward_mlp(store_, arena_, x1, s), size));
  block.backward_mlp(store_, arena_, grad, s);
  packed_.unpack(part);  // over the MLP's activations and temporaries, dead now
  arena_.move_to(expanded_end_[part]);
  // Under "all" the MLP's input is dead now too: its buffer takes the attention's input gradient.
  block.backward_attention(store_, arena_, grad, s, kept_inputs_bf16() ? x1 : nullptr);
}

float* TransformerModel::spare_residual(const float* grad) const {
  if (residual_buffers_[0] == nullptr) return nullptr;
  KEEL_CHECK(grad == residual_buffers_[0] || grad == residual_buffers_[1]);
  return grad == residual_buffers_[0] ? residual_buffers_[1] : residual_buffers_[0];
}

const float* TransformerModel::stretch_end(const float* out, size_t size) {
  // The output is dead once copied: where it is the stretch's last allocation (the projection
  // that the residual sum took over), the backward's temporaries may start at it.
  const float* end = arena_.top();
  const bool output_last = out < end && end - out == static_cast<ptrdiff_t>(Arena::padded(size));
  return output_last ? out : end;
}

float* TransformerModel::forward_hidden(const int32_t* tokens, const StepShape& s, bool for_backward) {
  KEEL_CHECK(s.seq <= spec_.max_position_embeddings);
  arena_.reset();
  tokens_ = tokens;
  const int64_t n = s.tokens(), h = spec_.hidden_size;
  float* x = arena_.alloc(static_cast<size_t>(n * h));
  embed(tokens, s, x);
  std::fill(max_logits_.begin(), max_logits_.end(), -std::numeric_limits<float>::infinity());
  block_inputs_.assign(blocks_.size(), nullptr);
  block_inputs_bf16_.assign(blocks_.size(), nullptr);
  lean_words_.assign(blocks_.size(), nullptr);
  packing_ = for_backward && bf16_activations_ != Bf16Activations::Fp32 && precision_ == kernels::Precision::Bf16;
  if (packing_) packed_.start(2 * blocks_.size());  // an attention and an MLP stretch a block
  expanded_end_.assign(2 * blocks_.size(), nullptr);
  // The residual buffers of a packed step without recomputation (forward_block): the embedding
  // output, then the first attention's output in a second buffer, the first MLP's over the
  // embeddings, and so on; below every stretch. With recomputation and the block inputs kept in
  // bf16 the same two: under blocks each block's output goes to the one its input is not in;
  // under attention the attention's output to the second and the MLP's back to the first.
  residual_buffers_[0] = residual_buffers_[1] = nullptr;
  // Without packing, the pre-norms' outputs share one buffer (SharedNormed), below every block.
  shared_normed_ = SharedNormed{};
  const bool share_normed = for_backward && !packing_ && share_normed_outputs_ &&
                            std::any_of(blocks_.begin(), blocks_.end(), [](const auto& b) { return b->has_pre_norm(); });
  if (share_normed) shared_normed_.data = arena_.alloc(static_cast<size_t>(n * h));
  for (auto& b : blocks_) b->set_shared_normed(share_normed ? &shared_normed_ : nullptr);
  if (packing_ && (recompute_ == Recompute::None || kept_inputs_bf16())) {
    residual_buffers_[0] = x;
    residual_buffers_[1] = arena_.alloc(static_cast<size_t>(n * h));
  }
  for (size_t l = 0; l < blocks_.size(); ++l) {
    x = forward_block(l, x, s, for_backward);
    const double sum = fixed_order_sum<1>(n * h, [x](int64_t i0, int64_t i1) {
      return std::array<double, 1>{sum_of_squares_in_lanes(x, i0, i1)};
    })[0];
    activation_ms_[l] = sum / static_cast<double>(n * h);
    if (const Moe* m = blocks_[l]->moe()) {
      std::copy(m->load().begin(), m->load().end(), expert_load_.begin() + static_cast<int64_t>(l) * m->experts());
      router_entropy_[l] = static_cast<float>(m->entropy());
    }
  }
  // Under recompute = attention the loss and the backward go above every stretch; without
  // recomputation each sublayer's backward places its temporaries itself (backward_block).
  if (packing_ && recompute_ != Recompute::None) packed_.reserve(arena_);
  if (for_backward) {
    forward_packed_ = packing_ ? PackedSizes{packed_.packed_fp32_bytes(), packed_.compacted_bytes(),
                                             packed_.dropped_bytes()}
                               : PackedSizes{};
  }
  last_block_out_ = x;
  return final_norm_ ? final_norm_->forward(store_, arena_, x, n) : x;
}

LossSums TransformerModel::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                                            float grad_scale) {
  StepShape s{batch, seq};
  kernels::PrecisionScope precision(precision_);
  const int64_t n = s.tokens(), h = spec_.hidden_size;
  const size_t size = static_cast<size_t>(n * h);
  float* hf = forward_hidden(tokens, s, /*for_backward=*/true);
  for (auto& b : blocks_) {
    if (Moe* m = b->moe()) m->accumulate_counts();  // training routing steers the bias update
  }
  const Arena::Mark before_loss_gradient = arena_.mark();
  float* dhf = arena_.alloc_zeroed(size);
  float* dw = store_.grad(lm_head_.valid() ? lm_head_ : embed_);
  auto r = kernels::lm_head_cross_entropy(hf, lm_head_weight(), targets, n, h, spec_.vocab_size,
                                          static_cast<float>(spec_.z_loss), static_cast<float>(spec_.final_softcap),
                                          grad_scale, dhf, dw);
  // One buffer carries the gradient down the blocks, each block turning its output gradient into
  // its input gradient in place. With a final norm it is the norm's output hf, dead once the loss
  // has read it (a norm's backward reads its input), and dhf is given back after the norm's
  // backward: no hidden-wide buffer beyond hf under the blocks' backward.
  // A packed step without recomputation, or with it and the block inputs kept in bf16, carries it
  // in the residual buffer that does not hold the last block's output, below every stretch:
  // nothing above the stretch a block's backward expands (or above its kept input) is live then,
  // and its temporaries go right above it (backward_block); hf is dead and built over.
  float* dx = dhf;
  float* below_stretches = residual_buffers_[0] == nullptr     ? nullptr
                           : residual_buffers_[0] == last_block_out_ ? residual_buffers_[1]
                                                                  : residual_buffers_[0];
  if (final_norm_) {
    dx = below_stretches != nullptr ? below_stretches : hf;
    parallel_zero(dx, size);
    final_norm_->backward(store_, dhf, dx, n);
    arena_.release(before_loss_gradient);
  } else if (below_stretches != nullptr) {
    parallel_copy(below_stretches, dhf, size);
    dx = below_stretches;
    arena_.release(before_loss_gradient);
  }
  for (size_t l = blocks_.size(); l-- > 0;) {
    backward_block(l, dx, s);
    if (block_backward_hook_) block_backward_hook_(static_cast<int64_t>(l));
  }
  kernels::embedding_backward(tokens, dx, store_.grad(embed_), n, h, static_cast<float>(spec_.embed_scale));
  if (positions_.valid()) {
    float* dwpe = store_.grad(positions_);
    // Positions are shared by the batch; loop over positions outside so threads never collide.
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t b = 0; b < batch; ++b) {
        const float* d = dx + (b * seq + t) * h;
        for (int64_t c = 0; c < h; ++c) dwpe[t * h + c] += d[c];
      }
    }
  }
  return {r.ce_sum, r.z_sum, r.count};
}

LossSums TransformerModel::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq) {
  StepShape s{batch, seq};
  kernels::PrecisionScope precision(precision_);
  float* hf = forward_hidden(tokens, s);
  auto r = kernels::lm_head_cross_entropy(hf, lm_head_weight(), targets, s.tokens(), spec_.hidden_size,
                                          spec_.vocab_size, static_cast<float>(spec_.z_loss),
                                          static_cast<float>(spec_.final_softcap), 1.0f, nullptr, nullptr);
  return {r.ce_sum, r.z_sum, r.count};
}

void TransformerModel::forward_logits(const int32_t* tokens, int64_t batch, int64_t seq, float* logits) {
  StepShape s{batch, seq};
  kernels::PrecisionScope precision(precision_);
  float* hf = forward_hidden(tokens, s);
  kernels::lm_head_logits(hf, lm_head_weight(), logits, s.tokens(), spec_.hidden_size, spec_.vocab_size,
                          static_cast<float>(spec_.final_softcap));
}

DecodeState TransformerModel::new_decode_state() const {
  DecodeState state;
  for (const auto& b : blocks_) state.layers.push_back(b->make_cache(spec_.max_position_embeddings));
  return state;
}

void TransformerModel::forward_incremental(const int32_t* tokens, int64_t n, DecodeState& state, float* logits) const {
  KEEL_CHECK(n >= 1 && state.layers.size() == blocks_.size());
  const int64_t context = spec_.max_position_embeddings;
  if (state.length + n > context) {
    throw Error(spec_.source, "max_position_embeddings",
                "the context of " + std::to_string(context) + " positions is full (" + std::to_string(state.length) +
                    " cached, " + std::to_string(n) + " more)");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= spec_.vocab_size) {
      throw Error(spec_.source, "vocab_size",
                  "token id " + std::to_string(tokens[i]) + " is outside the model's vocabulary of " +
                      std::to_string(spec_.vocab_size));
    }
  }
  kernels::PrecisionScope precision(precision_);
  Arena& arena = state.arena;
  arena.reset();
  const int64_t h = spec_.hidden_size;
  const StepShape s{1, n, state.length};
  float* x = arena.alloc(static_cast<size_t>(n * h));
  embed(tokens, s, x);
  for (size_t l = 0; l < blocks_.size(); ++l) x = blocks_[l]->forward_incremental(store_, arena, x, n, state.layers[l]);
  state.length += n;
  // Only the last token's logits are read; norms are per row, so normalizing it alone is exact.
  const float* last = x + (n - 1) * h;
  if (final_norm_) last = final_norm_->forward_incremental(store_, arena, last, 1);
  kernels::lm_head_logits(last, lm_head_weight(), logits, 1, h, spec_.vocab_size,
                          static_cast<float>(spec_.final_softcap));
}

std::vector<std::string> run_start_notes(const TransformerModel& model) {
  std::vector<std::string> notes = {kernels::openblas_core_note()};
  if (model.precision() == kernels::Precision::Bf16) {
    notes.push_back(kernels::bf16_emulation_note());
  }
  std::erase_if(notes, [](const std::string& n) { return n.empty(); });
  return notes;
}

}  // namespace keel::nn
