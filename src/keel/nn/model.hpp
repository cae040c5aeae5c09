#pragma once
// A decoder-only transformer built from a ModelSpec: embeddings, a stack of blocks (attention
// and MLP sublayers with the configured norm placement), optional final norm, and the LM head
// fused with the cross-entropy loss. Parameters carry their HF names.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "keel/nn/recompute.hpp"
#include "keel/arch/model_spec.hpp"
#include "keel/core/arena.hpp"
#include "keel/kernels/precision.hpp"
#include "keel/kernels/rope.hpp"
#include "keel/nn/mla_attention.hpp"
#include "keel/nn/modules.hpp"
#include "keel/nn/kv_cache.hpp"
#include "keel/nn/moe.hpp"
#include "keel/nn/packed_activations.hpp"
#include "keel/nn/parameters.hpp"

namespace keel::nn {

struct LossSums {
  double ce_sum = 0;   // Σ cross-entropy over predicted positions
  double z_sum = 0;    // Σ logsumexp² over the same positions
  int64_t count = 0;   // predicted positions (targets != -1)
  double mean_ce() const { return count ? ce_sum / static_cast<double>(count) : 0.0; }
};

// A training step's pre-norm outputs, where bf16 packing does not drop them (fp32 storage): one
// n × hidden buffer that every sublayer's norm before its branch writes into, instead of a slot
// of its own beside the norm's input. The output follows from that input and the row statistics
// the norm keeps: a norm whose output another's took the place of is marked gone, and its
// sublayer's backward writes it again (the forward's bits: Block::restore_normed_input). One
// buffer for the step instead of one a sublayer: at Qwen3-0.6B's shape 220 of fp32's 1,837 KiB
// a token.
struct SharedNormed {
  float* data = nullptr;
  Norm* holder = nullptr;  // the norm whose output the buffer holds now
};

class Block {
 public:
  Block(ParameterStore& store, const arch::ModelSpec& spec, int64_t layer, const kernels::RopeTable* rope);
  float* forward(ParameterStore& store, Arena& arena, const float* x, const StepShape& s, float* max_logit);
  // grad: (n, hidden), the block's output gradient on entry and its input gradient on return (the
  // residual stream's gradient is carried in place: no buffer of its own per sublayer).
  void backward(ParameterStore& store, Arena& arena, float* grad, const StepShape& s);
  // The two residual sublayers apart, for activation recomputation: forward = forward_mlp after
  // forward_attention, backward = backward_attention after backward_mlp.
  float* forward_attention(ParameterStore& store, Arena& arena, const float* x, const StepShape& s, float* max_logit);
  float* forward_mlp(ParameterStore& store, Arena& arena, const float* x1, const StepShape& s);
  // spare: a hidden-wide buffer (n × hidden) dead through the call, which the sublayer's branch
  // input gradient may take instead of the arena (sublayers with a norm before the branch:
  // pre-norm and sandwich); null for none.
  void backward_mlp(ParameterStore& store, Arena& arena, float* grad, const StepShape& s, float* spare = nullptr);
  void backward_attention(ParameterStore& store, Arena& arena, float* grad, const StepShape& s,
                          float* spare = nullptr);
  // The same sublayers for n new tokens of one sequence, attending over (and appending to) cache.
  float* forward_incremental(const ParameterStore& store, Arena& arena, const float* x, int64_t n,
                             KvCache& cache) const;
  KvCache make_cache(int64_t max_rows) const;
  // Where the last training forward wrote the output of the norm before the attention (mlp =
  // false) or before the FFN (rounded under bf16 where only products read it), now given up by
  // the caller (bf16 packing drops it from the sublayer's stretch); null where the sublayer has
  // no norm before it. The sublayer's backward writes it again from the norm's saved input and
  // statistics (restore_normed_input): the same bits, one elementwise pass, instead of n ×
  // hidden values held beside the norm's input from which they follow.
  float* give_up_normed_input(bool mlp);
  // The training forwards from here on write the pre-norms' outputs into `shared` (null: each into
  // the arena), and the backwards write them again there as needed.
  void set_shared_normed(SharedNormed* shared) { shared_normed_ = shared; }
  bool has_pre_norm() const { return attn_norms_.before.has_value() || mlp_norms_.before.has_value(); }
  // The lean form (TransformerModel::lean_block): a block that keeps only its input and the sum
  // after its attention, each in bf16 words, and recomputes the rest in its backward, its
  // attention a kv head at a time and its MLP a run of rows at a time, so no n-row temporary is
  // wider than the hidden size. For pre-norm blocks with a dense MLP and an attention that
  // splits_by_kv_head.
  bool can_run_lean() const;
  // x: the block's input (n, hidden), kept rounded to bf16 in x_words; x1 gets the sum after the
  // attention, kept likewise in x1_words; out the block's output (out may be x, x1 must be
  // neither). The values of forward, up to the order of fp32 sums inside the split products.
  void forward_lean(ParameterStore& store, Arena& arena, const float* x, float* x1, float* out, const StepShape& s,
                    float* max_logit, uint16_t* x_words, uint16_t* x1_words);
  // grad as in backward, from forward_lean's words: everything else recomputed from them, as the
  // backward of a packed block under "all" reads its input copies rounded.
  void backward_lean(ParameterStore& store, Arena& arena, float* grad, const StepShape& s, const uint16_t* x_words,
                     const uint16_t* x1_words);
  // The routed-expert FFN of an MoE layer, null for a dense one.
  Moe* moe() { return moe_ ? &*moe_ : nullptr; }
  const Moe* moe() const { return moe_ ? &*moe_ : nullptr; }

 private:
  void backward_sublayer(Sublayer& sub, ParameterStore& store, Arena& arena, float* grad, const StepShape& s,
                         bool attention, float* spare);
  // The sublayer reads its normed input only as a product's operand (attention's and a dense
  // MLP's projections, not a router): under bf16 it is stored rounded.
  bool matmul_input(bool mlp) const { return !mlp || mlp_.has_value(); }
  // Where the sublayer's pre-norm writes its output: the shared buffer, whose last holder's
  // output is gone then, or null for the arena.
  float* claim_shared_normed(Sublayer& sub);
  // Before the sublayer's backward, where its pre-norm's output is gone: written again in its
  // place (the shared buffer claimed back) and rounded as the forward rounded it.
  void restore_normed_input(const ParameterStore& store, Sublayer& sub, bool mlp, int64_t n);

  int64_t hidden_;
  SharedNormed* shared_normed_ = nullptr;
  Sublayer attn_norms_, mlp_norms_;
  // Exactly one attention: MHA/GQA/MQA, or MLA (DeepSeek-V3 / Kimi K2).
  std::optional<Attention> attention_;
  std::optional<MlaAttention> mla_;
  // Exactly one FFN: a dense MLP or routed experts (spec.is_moe_layer).
  std::optional<Mlp> mlp_;
  std::optional<Moe> moe_;
};

// Throws keel::Error(source, "model_type", why) for a family keel reads but cannot build
// (Qwen3-Next: names its Gated DeltaNet layers). The trainer asks before the run folder exists.
void check_trainable(const arch::ModelSpec& spec);

class TransformerModel {
 public:
  explicit TransformerModel(const arch::ModelSpec& spec);
  // Blocks point into the model (its RoPE table), so it never moves: hold it by unique_ptr.
  TransformerModel(const TransformerModel&) = delete;
  TransformerModel& operator=(const TransformerModel&) = delete;

  const arch::ModelSpec& spec() const { return spec_; }
  ParameterStore& parameters() { return store_; }
  const ParameterStore& parameters() const { return store_; }

  // Matmul precision of forward_backward, forward_loss and forward_logits: fp32 (default) or
  // bf16 mixed precision (bf16 matmul operands and activations, fp32 accumulation, norms,
  // softmax, loss and router; parameters, gradients and optimizer state stay fp32). See
  // docs/precision.md.
  void set_precision(kernels::Precision p) { precision_ = p; }
  kernels::Precision precision() const { return precision_; }
  void set_recompute(Recompute r) { recompute_ = r; }
  Recompute recompute() const { return recompute_; }
  // bf16 activation storage (nn/packed_activations.hpp): under bf16 precision, what the blocks
  // save for the backward is held packed as bf16 between forward and backward. All by default
  // (the residual stream's saved copies rounded too; see Bf16Activations); Packed keeps those
  // copies fp32 (gradients bit-identical to Fp32); Fp32 keeps the bf16 values in fp32 slots.
  void set_bf16_activations(Bf16Activations a) { bf16_activations_ = a; }
  Bf16Activations bf16_activations() const { return bf16_activations_; }
  // Of the last training step's forward: bytes the packed bf16 tensors would take in fp32, the
  // bytes of all blocks' compacted stretches, and the fp32 bytes of the unused tensors dropped
  // from them (all 0 without packing, and under recompute = blocks, whose backward packs one
  // attention at a time).
  size_t packed_activation_fp32_bytes() const { return forward_packed_.fp32; }
  size_t packed_activation_compacted_bytes() const { return forward_packed_.compacted; }
  size_t packed_activation_dropped_bytes() const { return forward_packed_.dropped; }
  // Of the last training step: how many blocks ran lean (set_lean_top_blocks).
  int64_t lean_blocks_last_step() const {
    return std::count_if(lean_words_.begin(), lean_words_.end(), [](const uint16_t* w) { return w != nullptr; });
  }
  // Tests: recompute = blocks recomputes each block whole in the backward, its activations in fp32
  // slots, even under packing (the layout before the packed recomputation; its reference twin).
  void set_recompute_whole_blocks(bool whole) { recompute_whole_blocks_ = whole; }
  // Tests: a step without packing gives each pre-norm's output a slot of its own in the arena, as
  // before SharedNormed (its reference twin).
  void set_share_normed_outputs(bool share) { share_normed_outputs_ = share; }
  // How many of the top blocks a step with bf16_activations = "all" and no recomputation runs
  // lean (Block::forward_lean; run.lean_blocks, default 2); 0 runs every block packed, its
  // reference twin.
  void set_lean_top_blocks(size_t count) { lean_top_blocks_ = count; }

  // normal(0, initializer_range) matrices and embeddings, ones for norm gains, zeros for biases.
  void initialize(uint64_t seed);

  // tokens, targets: (batch, seq) row-major; target -1 = not predicted.
  // Forward and backward: accumulates into the parameter gradients the gradient of
  //   grad_scale * (Σ CE + z_loss * Σ logZ²).
  LossSums forward_backward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq, float grad_scale);
  // Called by forward_backward after each block's backward (blocks from the last to the first),
  // so data parallelism can send a block's gradients while the blocks below are computed.
  void set_block_backward_hook(std::function<void(int64_t block)> hook) { block_backward_hook_ = std::move(hook); }
  // Forward only.
  LossSums forward_loss(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq);
  // logits: (batch, seq, vocab).
  void forward_logits(const int32_t* tokens, int64_t batch, int64_t seq, float* logits);

  // The incremental (KV-cache) forward of one sequence: an empty state sized for the context,
  // then n >= 1 tokens at positions state.length.. per call, leaving the logits (vocab) of the
  // last one. Same modules, kernels and precision as forward_logits; reads the parameters as
  // they are now, so it follows training. keel::Error (naming the config) for a full context or
  // a token outside the vocabulary.
  DecodeState new_decode_state() const;
  void forward_incremental(const int32_t* tokens, int64_t n, DecodeState& state, float* logits) const;

  // Per layer and query head, the max scaled pre-softmax logit of the last forward: (layers, heads).
  const std::vector<float>& max_logits() const { return max_logits_; }
  // MoE layers, of the last forward: each expert's share of the token assignments, (layers,
  // experts) with zero rows for dense layers; mean router entropy (nats) per layer, 0 for dense.
  const std::vector<float>& expert_load() const { return expert_load_; }
  const std::vector<float>& router_entropy() const { return router_entropy_; }
  // Per layer, of the last forward: the mean square of the residual stream after the block
  // (its RMS², averaged over tokens and channels). Growth with depth or over training is the
  // early sign of the instabilities docs/training.md lists.
  const std::vector<double>& activation_mean_square() const { return activation_ms_; }
  // After each optimizer step: the auxiliary-loss-free bias update (DeepSeek-V3 §2.1.2) of every
  // e_score_correction_bias from the routing of the forward_backward calls since the last one.
  void update_router_bias(float speed);
  // Every MoE layer's assignment counts pending for the next bias update, layer by layer: data
  // parallelism replaces them with the sums over all ranks first, so every rank moves the same.
  std::vector<std::vector<int64_t>*> pending_router_counts();
  // The routed-expert FFN of a layer, null for a dense layer.
  const Moe* moe_layer(int64_t layer) const { return blocks_[static_cast<size_t>(layer)]->moe(); }
  size_t activation_capacity_bytes() const { return arena_.capacity_floats() * sizeof(float); }

 private:
  std::function<void(int64_t)> block_backward_hook_;
  // Embeddings and blocks; returns the final hidden states (after the final norm, if any).
  float* forward_hidden(const int32_t* tokens, const StepShape& s, bool for_backward = false);
  // Block l's forward under recompute_, keeping what the backward needs; returns its output.
  float* forward_block(size_t l, float* x, const StepShape& s, bool for_backward);
  // Block l's backward (recomputing first what forward_block dropped): grad holds its output
  // gradient on entry and its input gradient on return.
  void backward_block(size_t l, float* grad, const StepShape& s);
  // Under packing: declares the normed input of stretch `part` (attention 2l, MLP 2l + 1) unused
  // before it is packed; expands it before its backward, writing that input again.
  void drop_normed(size_t l, size_t part, int64_t n);
  // Under recomputation with bf16_activations = "all": each block's input is kept in bf16
  // (block_inputs_bf16_), rounded in place first so that the forward reads those values too.
  bool kept_inputs_bf16() const;
  // Block l's input for its recomputation: the kept fp32 one, or the bf16 one expanded into a
  // buffer on top of the arena.
  const float* block_input(size_t l, const StepShape& s);
  // Just past block l's input kept in bf16: where its MLP's stretch began under recompute =
  // attention, and where the backward's recomputation may start once what lies above is dead.
  const float* kept_input_end(size_t l, const StepShape& s) const;
  // After stretch `part`'s forward (since `since`), its output of n tokens copied out: drops that
  // output and the normed input from the stretch and packs it.
  void pack_sublayer(size_t l, size_t part, const float* out, int64_t n, const Arena::Mark& since);
  // Block l's per-head max logits of the step (what its attention's forward writes).
  float* max_logits_of(size_t l) { return max_logits_.data() + l * static_cast<size_t>(spec_.attention.num_heads); }
  // Block l's forward from x into dest (which must not alias x), keeping nothing: each sublayer's
  // activations given back once its output is copied to dest (recompute = blocks).
  void run_block_released(size_t l, const float* x, float* dest, const StepShape& s);
  // Under recompute = blocks with packing: block l recomputed and its backward run one sublayer
  // expanded at a time, as without recomputation (grad as in backward_block).
  void recompute_block_packed(size_t l, float* grad, const StepShape& s);
  // Where the backward's temporaries of a stretch that just returned `out` (size floats, copied
  // out already) may start: at out where it is the stretch's last allocation, else the top.
  const float* stretch_end(const float* out, size_t size);
  // Of the two residual buffers (a packed step without recomputation, or with the block inputs
  // kept in bf16), the one the backward's gradient is not in: it held the last block's output,
  // dead once the final norm's backward (or the loss, without one) has read it. Null otherwise.
  float* spare_residual(const float* grad) const;
  // Block l runs lean in this training step: one of the top lean_top_blocks_ blocks of a packed
  // step under bf16_activations = "all" without recomputation, and a block that can. The top
  // blocks set the step's peak: while the last one runs forward or backward every block below
  // it is held packed, so its own temporaries sit on all of them (docs/performance.md, "bf16
  // under half").
  bool lean_block(size_t l) const;
  // Token embeddings (times embed_scale) plus learned positions from s.first_position.
  void embed(const int32_t* tokens, const StepShape& s, float* x) const;
  const float* lm_head_weight() const;

  arch::ModelSpec spec_;
  ParameterStore store_;
  kernels::RopeTable rope_;
  kernels::RopeTable local_rope_;  // Gemma 3's sliding layers: rope_local_base_freq, no scaling
  ParamRef embed_, positions_, lm_head_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::optional<Norm> final_norm_;
  Arena arena_;
  std::vector<float> max_logits_;
  std::vector<float> expert_load_, router_entropy_;
  std::vector<double> activation_ms_;
  const int32_t* tokens_ = nullptr;
  float* last_block_out_ = nullptr;
  kernels::Precision precision_ = kernels::Precision::Fp32;
  Recompute recompute_ = Recompute::None;
  std::vector<float*> block_inputs_;  // of the last training forward, for recomputation
  std::vector<uint16_t*> block_inputs_bf16_;  // ... in 2 bytes a value (kept_inputs_bf16)
  Bf16Activations bf16_activations_ = Bf16Activations::All;
  bool packing_ = false;  // this training step packs (bf16 precision, activations not Fp32)
  // A packed step without recomputation, or with it and block inputs kept in bf16: the
  // sublayers' (or blocks') outputs alternate between these two (the embedding output and one
  // more buffer), below every packed stretch.
  float* residual_buffers_[2] = {nullptr, nullptr};
  // Where each sublayer's stretch (attention 2l, MLP 2l + 1) ended in fp32 in that step's
  // forward: its backward's temporaries go from there.
  std::vector<const float*> expanded_end_;
  PackedActivations packed_;
  struct PackedSizes {
    size_t fp32 = 0, compacted = 0, dropped = 0;
  } forward_packed_;
  bool recompute_whole_blocks_ = false;
  // Of the last training step without packing: the pre-norms' shared output buffer.
  SharedNormed shared_normed_;
  bool share_normed_outputs_ = true;
  size_t lean_top_blocks_ = 2;
  // Of the last training forward, per lean block: its input and its sum after the attention in
  // bf16, one n × hidden run of floats holding both; where they end.
  std::vector<uint16_t*> lean_words_;
};

// What a run on `model` is told at its start about this machine and its settings, one line each
// (OpenBLAS on kernels older than the CPU, bf16 products emulated, bf16 storage other than asked);
// the lines that apply, in that order.
std::vector<std::string> run_start_notes(const TransformerModel& model);

}  // namespace keel::nn
