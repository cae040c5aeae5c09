#include "keel/arch/accounting.hpp"

#include "keel/core/error.hpp"

namespace keel::arch {

namespace {

class Checked {
 public:
  explicit Checked(const std::string& source) : source_(source) {}
  int64_t mul(int64_t a, int64_t b) const {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) overflow();
    return r;
  }
  int64_t add(int64_t a, int64_t b) const {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) overflow();
    return r;
  }
  int64_t numel(const TensorEntry& t) const {
    int64_t n = 1;
    for (int64_t d : t.shape) n = mul(n, d);
    return n;
  }

 private:
  [[noreturn]] void overflow() const {
    throw Error(source_, "", "the model is too large to count: a size overflows 64 bits");
  }
  const std::string& source_;
};

}  // namespace

Accounting account(const ModelSpec& spec, int64_t seq) {
  Checked c(spec.source);
  Accounting acc;
  ParamCounts& p = acc.params;
  const auto& moe = spec.moe;

  for (const TensorEntry& t : hf_tensor_layout(spec, /*include_mtp=*/true)) {
    const int64_t one = c.numel(t);
    const int64_t all = c.mul(one, t.copies);
    p.by_component[t.component] = c.add(p.by_component[t.component], all);
    if (t.component == Component::Mtp) {
      p.mtp = c.add(p.mtp, all);
      continue;
    }
    p.total = c.add(p.total, all);
    p.tensors = c.add(p.tensors, t.copies);
    if (t.optimizer == OptimizerGroup::Muon) p.muon = c.add(p.muon, all);
    // Routed experts: k of them per token (a fused tensor holds all E along its first dim).
    const int64_t per_expert = t.fused_experts > 0 ? one / t.fused_experts : one;
    const int64_t used = t.component == Component::RoutedExperts ? c.mul(per_expert, moe.experts_per_token) : all;
    p.active = c.add(p.active, used);
    p.active_by_component[t.component] = c.add(p.active_by_component[t.component], used);
    if (t.matmul) p.matmul_active = c.add(p.matmul_active, used);
  }
  p.adamw = p.total - p.muon;
  p.non_embedding = p.total - p.by_component[Component::Embedding] -
                    p.by_component[Component::PositionEmbedding] - p.by_component[Component::LmHead];
  // A tied lm_head is not stored but still multiplies every token's hidden state.
  if (spec.tie_word_embeddings) p.matmul_active = c.add(p.matmul_active, c.mul(spec.vocab_size, spec.hidden_size));

  const int64_t total = p.total;
  acc.fp32.weights = c.mul(4, total);
  acc.fp32.gradients = c.mul(4, total);
  acc.fp32.adamw_state = c.mul(8, total);
  acc.fp32.muon_state = c.add(c.mul(4, p.muon), c.mul(8, p.adamw));
  acc.bf16_mixed = acc.fp32;
  acc.bf16_mixed.weights = c.mul(2, total);
  acc.bf16_mixed.master_weights = c.mul(4, total);

  const auto& a = spec.attention;
  // Per token and layer the cache holds K and V (bf16); MLA holds the latent and the shared k^R.
  const int64_t per_layer = a.kind == AttentionKind::Mla
                                ? c.add(a.kv_lora_rank, a.qk_rope_head_dim)
                                : c.mul(2, c.mul(a.num_kv_heads, a.head_dim));
  // Gated DeltaNet layers keep a fixed-size state instead of a per-token cache.
  int64_t cached_layers = 0;
  for (int64_t l = 0; l < spec.num_layers; ++l) cached_layers += spec.is_linear_attention_layer(l) ? 0 : 1;
  acc.kv_cache_bytes_per_token_bf16 = c.mul(2, c.mul(cached_layers, per_layer));

  FlopsPerToken& f = acc.flops;
  f.seq = seq;
  f.matmul = 6.0 * static_cast<double>(p.matmul_active);
  // Keys per query, summed over layers: seq on a global layer (PaLM's convention), at most the
  // window on a local one; causal: the mean over positions 1..seq of min(position, window).
  const double per_key_layer = 6.0 * static_cast<double>(a.num_heads) * static_cast<double>(a.qk_head_dim() + a.value_head_dim());
  const double T = static_cast<double>(seq);
  double keys = 0, keys_causal = 0;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    if (spec.is_linear_attention_layer(l)) continue;  // no softmax over keys (its recurrence is not counted)
    if (spec.is_sliding_layer(l) && a.sliding_window < seq) {
      const double W = static_cast<double>(a.sliding_window);
      keys += W;
      keys_causal += (W * (W + 1.0) / 2.0 + (T - W) * W) / T;
    } else {
      keys += T;
      keys_causal += (T + 1.0) / 2.0;
    }
  }
  f.attention = per_key_layer * keys;
  f.attention_causal = per_key_layer * keys_causal;
  return acc;
}

}  // namespace keel::arch
