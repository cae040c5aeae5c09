#include "keel/nn/generator.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "keel/core/error.hpp"
#include "keel/core/rng.hpp"
#include "keel/kernels/activation.hpp"
#include "keel/kernels/cross_entropy.hpp"
#include "keel/kernels/embedding.hpp"
#include "keel/kernels/linear.hpp"
#include "keel/kernels/norm.hpp"

namespace keel::nn {

namespace {

// The model was built from the same spec, so a missing required name is a broken invariant.
const float* find_param(const ParameterStore& store, const std::string& name, bool required = true) {
  const ParamInfo* p = store.find(name);
  if (p == nullptr) {
    KEEL_CHECK(!required);
    return nullptr;
  }
  return store.values().data() + p->offset;
}

void add_into(float* dst, const float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
}

// Grows a cache to hold `rows` rows of `width` floats, doubling so appends stay amortized O(1)
// while a short generation never allocates the full context.
void reserve_rows(std::vector<float>& cache, int64_t rows, int64_t width, int64_t max_rows) {
  const size_t need = static_cast<size_t>(rows * width);
  if (cache.size() >= need) return;
  const int64_t have = static_cast<int64_t>(cache.size()) / width;
  const int64_t grown = std::min(max_rows, std::max({rows, 2 * have, int64_t{16}}));
  cache.resize(static_cast<size_t>(grown * width));
}

}  // namespace

Generator::Generator(const TransformerModel& model)
    : spec_(model.spec()),
      store_(&model.parameters()),
      gpt2_(spec_.family == arch::Family::Gpt2),
      hidden_(spec_.hidden_size),
      heads_(spec_.attention.num_heads),
      kv_heads_(spec_.attention.num_kv_heads),
      head_dim_(spec_.attention.head_dim) {
  const ParameterStore& store = model.parameters();
  const auto& a = spec_.attention;
  // The KV cache here holds per-head K and V; MLA would cache the latent and k^R instead.
  if (a.kind == arch::AttentionKind::Mla)
    throw Error(spec_.source, "model_type",
                "keel generate does not support MLA attention (" + spec_.model_type +
                    ") yet; keel eval and keel train do");
  embed_ = find_param(store, gpt2_ ? "transformer.wte.weight" : "model.embed_tokens.weight");
  if (gpt2_) {
    positions_ = find_param(store, "transformer.wpe.weight");
  } else {
    rope_ = kernels::make_rope_table(a.rope.theta, a.rope.rotary_dim, spec_.max_position_embeddings, a.rope.scaling);
  }
  lm_head_ = spec_.tie_word_embeddings ? embed_ : find_param(store, "lm_head.weight");
  auto norm_at = [&](const std::string& prefix) {
    Norm n;
    n.weight = find_param(store, prefix + ".weight");
    if (spec_.norm == arch::NormKind::LayerNorm) n.bias = find_param(store, prefix + ".bias");
    return n;
  };
  if (spec_.has_final_norm()) final_norm_ = norm_at(gpt2_ ? "transformer.ln_f" : "model.norm");

  layers_.resize(static_cast<size_t>(spec_.num_layers));
  for (int64_t l = 0; l < spec_.num_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    const std::string p = (gpt2_ ? "transformer.h." : "model.layers.") + std::to_string(l) + ".";
    // Norm slots and HF names as Block registers them (model.cpp, make_sublayer).
    if (gpt2_) {
      L.attn_before = norm_at(p + "ln_1");
      L.mlp_before = norm_at(p + "ln_2");
    } else {
      switch (spec_.placement) {
        case arch::NormPlacement::Pre:
          L.attn_before = norm_at(p + "input_layernorm");
          L.mlp_before = norm_at(p + "post_attention_layernorm");
          break;
        case arch::NormPlacement::Post:
          L.attn_wrap = norm_at(p + "post_attention_layernorm");
          L.mlp_wrap = norm_at(p + "post_feedforward_layernorm");
          break;
        case arch::NormPlacement::Sandwich:
          L.attn_before = norm_at(p + "input_layernorm");
          L.attn_after = norm_at(p + "post_attention_layernorm");
          L.mlp_before = norm_at(p + "pre_feedforward_layernorm");
          L.mlp_after = norm_at(p + "post_feedforward_layernorm");
          break;
      }
    }
    if (gpt2_) {
      L.w_qkv = find_param(store, p + "attn.c_attn.weight");
      L.b_qkv = find_param(store, p + "attn.c_attn.bias");
      L.wo = find_param(store, p + "attn.c_proj.weight");
      L.bo = find_param(store, p + "attn.c_proj.bias");
      L.w_up = find_param(store, p + "mlp.c_fc.weight");
      L.b_up = find_param(store, p + "mlp.c_fc.bias");
      L.w_down = find_param(store, p + "mlp.c_proj.weight");
      L.b_down = find_param(store, p + "mlp.c_proj.bias");
      continue;
    }
    const std::string at = p + "self_attn.", mp = p + "mlp.";
    L.wq = find_param(store, at + "q_proj.weight");
    L.wk = find_param(store, at + "k_proj.weight");
    L.wv = find_param(store, at + "v_proj.weight");
    L.wo = find_param(store, at + "o_proj.weight");
    L.bq = find_param(store, at + "q_proj.bias", a.qkv_bias);
    L.bk = find_param(store, at + "k_proj.bias", a.qkv_bias);
    L.bv = find_param(store, at + "v_proj.bias", a.qkv_bias);
    L.bo = find_param(store, at + "o_proj.bias", a.o_bias);
    if (a.qk_norm) {
      L.q_norm = find_param(store, at + "q_norm.weight");
      L.k_norm = find_param(store, at + "k_norm.weight");
    }
    if (spec_.is_moe_layer(l)) {
      L.moe = model.moe_layer(l);
      continue;
    }
    L.w_gate = find_param(store, mp + "gate_proj.weight");
    L.w_up = find_param(store, mp + "up_proj.weight");
    L.w_down = find_param(store, mp + "down_proj.weight");
    L.b_gate = find_param(store, mp + "gate_proj.bias", spec_.mlp.bias);
    L.b_up = find_param(store, mp + "up_proj.bias", spec_.mlp.bias);
    L.b_down = find_param(store, mp + "down_proj.bias", spec_.mlp.bias);
  }
  logits_.assign(static_cast<size_t>(spec_.vocab_size), 0.f);
}

void Generator::prefill(std::span<const int32_t> prompt) {
  if (prompt.empty()) throw Error("", "prompt", "is empty: generation needs at least one token");
  length_ = 0;
  run(prompt.data(), static_cast<int64_t>(prompt.size()));
}

void Generator::append(int32_t token) { run(&token, 1); }

void Generator::norm(const Norm& w, const float* x, float* y, int64_t n) {
  std::vector<float> mean(static_cast<size_t>(n)), rstd(static_cast<size_t>(n));
  const float eps = static_cast<float>(spec_.norm_eps);
  switch (spec_.norm) {
    case arch::NormKind::RmsNorm:
      kernels::rmsnorm_forward(x, w.weight, y, rstd.data(), n, hidden_, eps);
      break;
    case arch::NormKind::LayerNorm:
      kernels::layernorm_forward(x, w.weight, w.bias, y, mean.data(), rstd.data(), n, hidden_, eps);
      break;
  }
}

void Generator::attention(Layer& L, const float* x, float* y, int64_t n) {
  const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_, p0 = length_;
  std::vector<float> q(static_cast<size_t>(n * q_out)), k(static_cast<size_t>(n * kv_out)),
      v(static_cast<size_t>(n * kv_out));
  if (gpt2_) {
    std::vector<float> qkv(static_cast<size_t>(n * 3 * hidden_));
    kernels::linear_forward(x, L.w_qkv, L.b_qkv, qkv.data(), n, hidden_, 3 * hidden_, true);
    for (int64_t t = 0; t < n; ++t) {
      const float* row = qkv.data() + t * 3 * hidden_;
      std::memcpy(q.data() + t * hidden_, row, sizeof(float) * size_t(hidden_));
      std::memcpy(k.data() + t * hidden_, row + hidden_, sizeof(float) * size_t(hidden_));
      std::memcpy(v.data() + t * hidden_, row + 2 * hidden_, sizeof(float) * size_t(hidden_));
    }
  } else {
    kernels::linear_forward(x, L.wq, L.bq, q.data(), n, hidden_, q_out);
    kernels::linear_forward(x, L.wk, L.bk, k.data(), n, hidden_, kv_out);
    kernels::linear_forward(x, L.wv, L.bv, v.data(), n, hidden_, kv_out);
    if (L.q_norm != nullptr) {
      // QK-Norm before RoPE, as in training (Qwen3).
      std::vector<float> raw_q = q, raw_k = k, rstd(static_cast<size_t>(n * heads_));
      const float eps = static_cast<float>(spec_.norm_eps);
      kernels::rmsnorm_forward(raw_q.data(), L.q_norm, q.data(), rstd.data(), n * heads_, head_dim_, eps);
      kernels::rmsnorm_forward(raw_k.data(), L.k_norm, k.data(), rstd.data(), n * kv_heads_, head_dim_, eps);
    }
    kernels::rope_forward_at(q.data(), rope_, n, heads_, head_dim_, p0);
    kernels::rope_forward_at(k.data(), rope_, n, kv_heads_, head_dim_, p0);
  }
  const int64_t max_rows = spec_.max_position_embeddings;
  reserve_rows(L.k_cache, p0 + n, kv_out, max_rows);
  reserve_rows(L.v_cache, p0 + n, kv_out, max_rows);
  std::memcpy(L.k_cache.data() + p0 * kv_out, k.data(), sizeof(float) * k.size());
  std::memcpy(L.v_cache.data() + p0 * kv_out, v.data(), sizeof(float) * v.size());

  // Token t (position p0 + t) attends to cache rows 0..p0+t; query head h reads kv head
  // h / (heads / kv_heads). Scores as attention_forward: scale·q·k, then the soft-cap.
  std::vector<float> out(static_cast<size_t>(n * q_out));
  const int64_t group = heads_ / kv_heads_;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim_)));
  const float cap = static_cast<float>(spec_.attention.softcap);
  const float* kc = L.k_cache.data();
  const float* vc = L.v_cache.data();
#pragma omp parallel if (n * heads_ * (p0 + n) > 32768)
  {
    std::vector<float> s(static_cast<size_t>(p0 + n)), acc(static_cast<size_t>(head_dim_));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < n * heads_; ++task) {
      const int64_t t = task / heads_, h = task % heads_, kvh = h / group, keys = p0 + t + 1;
      const float* qv = q.data() + (t * heads_ + h) * head_dim_;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < keys; ++j) {
        const float* kv = kc + (j * kv_heads_ + kvh) * head_dim_;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < head_dim_; ++c) dot += qv[c] * kv[c];
        float z = dot * scale;
        if (cap > 0.f) z = cap * std::tanh(z / cap);
        s[size_t(j)] = z;
        m = std::max(m, z);
      }
      double sum = 0;
      for (int64_t j = 0; j < keys; ++j) {
        s[size_t(j)] = std::exp(s[size_t(j)] - m);
        sum += s[size_t(j)];
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < keys; ++j) {
        const float* vv = vc + (j * kv_heads_ + kvh) * head_dim_;
        const float pj = s[size_t(j)];
#pragma omp simd
        for (int64_t c = 0; c < head_dim_; ++c) acc[size_t(c)] += pj * vv[c];
      }
      float* o = out.data() + (t * heads_ + h) * head_dim_;
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t c = 0; c < head_dim_; ++c) o[c] = acc[size_t(c)] * inv;
    }
  }
  kernels::linear_forward(out.data(), L.wo, L.bo, y, n, q_out, hidden_, gpt2_);
}

void Generator::mlp(const Layer& L, const float* x, float* y, int64_t n) {
  if (L.moe != nullptr) {
    L.moe->infer(*store_, x, y, n);
    return;
  }
  const int64_t width = spec_.mlp.intermediate_size;
  const auto act = to_kernel_activation(spec_.mlp.activation);
  std::vector<float> up(static_cast<size_t>(n * width)), h(static_cast<size_t>(n * width));
  kernels::linear_forward(x, L.w_up, L.b_up, up.data(), n, hidden_, width, gpt2_);
  if (L.w_gate != nullptr) {
    std::vector<float> gate(static_cast<size_t>(n * width));
    kernels::linear_forward(x, L.w_gate, L.b_gate, gate.data(), n, hidden_, width);
    kernels::gated_forward(gate.data(), up.data(), h.data(), n * width, act);
  } else {
    kernels::activation_forward(up.data(), h.data(), n * width, act);
  }
  kernels::linear_forward(h.data(), L.w_down, L.b_down, y, n, width, hidden_, gpt2_);
}

void Generator::run(const int32_t* tokens, int64_t n) {
  const int64_t context = spec_.max_position_embeddings;
  if (length_ + n > context) {
    throw Error("", "max_position_embeddings",
                "the context of " + std::to_string(context) + " positions is full (" + std::to_string(length_) +
                    " cached, " + std::to_string(n) + " more)");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= spec_.vocab_size) {
      throw Error("", "vocab_size",
                  "token id " + std::to_string(tokens[i]) + " is outside the model's vocabulary of " +
                      std::to_string(spec_.vocab_size));
    }
  }
  const size_t size = static_cast<size_t>(n * hidden_);
  std::vector<float> x(size), a(size), b(size), f(size);
  kernels::embedding_forward(tokens, embed_, x.data(), n, hidden_, static_cast<float>(spec_.embed_scale));
  if (positions_ != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      const float* p = positions_ + (length_ + i) * hidden_;
      for (int64_t c = 0; c < hidden_; ++c) x[size_t(i * hidden_ + c)] += p[c];
    }
  }
  // One sublayer, as Block::forward: x <- wrap(x + after(f(before(x)))).
  auto sublayer = [&](const std::optional<Norm>& before, const std::optional<Norm>& after,
                      const std::optional<Norm>& wrap, auto&& fn) {
    const float* in = x.data();
    if (before) {
      norm(*before, x.data(), a.data(), n);
      in = a.data();
    }
    fn(in, f.data());
    if (after) {
      norm(*after, f.data(), b.data(), n);
      std::swap(f, b);
    }
    add_into(b.data(), x.data(), f.data(), n * hidden_);
    if (wrap) {
      norm(*wrap, b.data(), x.data(), n);
    } else {
      std::swap(x, b);
    }
  };
  for (Layer& L : layers_) {
    sublayer(L.attn_before, L.attn_after, L.attn_wrap, [&](const float* in, float* out) { attention(L, in, out, n); });
    sublayer(L.mlp_before, L.mlp_after, L.mlp_wrap, [&](const float* in, float* out) { mlp(L, in, out, n); });
  }
  length_ += n;
  const float* last = x.data() + (n - 1) * hidden_;
  std::vector<float> h(static_cast<size_t>(hidden_));
  if (final_norm_) {
    // Normalizing only the last row gives the same values: norms are per row.
    norm(*final_norm_, last, h.data(), 1);
    last = h.data();
  }
  kernels::lm_head_logits(last, lm_head_, logits_.data(), 1, hidden_, spec_.vocab_size,
                          static_cast<float>(spec_.final_softcap));
}

// ---------------------------------------------------------------------------------------------
// Sampling

void check_sampling_config(const SamplingConfig& c) {
  if (!(c.temperature >= 0.0) || !std::isfinite(c.temperature)) {
    throw Error("", "temperature", "must be a finite number >= 0 (0 = greedy), got " + std::to_string(c.temperature));
  }
  if (c.top_k < 0) throw Error("", "top_k", "must be >= 0 (0 = off), got " + std::to_string(c.top_k));
  if (!(c.top_p > 0.0 && c.top_p <= 1.0)) {
    throw Error("", "top_p", "must be in (0, 1] (1 = off), got " + std::to_string(c.top_p));
  }
}

int32_t sample_token(std::span<const float> logits, const SamplingConfig& c, uint64_t draw) {
  check_sampling_config(c);
  KEEL_CHECK(!logits.empty());
  const int64_t vocab = static_cast<int64_t>(logits.size());
  // Descending logit, ties to the lower id, so greedy and top-k agree on ties.
  auto before = [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b); };
  if (c.temperature == 0.0) {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i) {
      if (before(i, best)) best = i;
    }
    return best;
  }
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t keep = c.top_k > 0 ? std::min(c.top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), before);
  order.resize(static_cast<size_t>(keep));
  // Softmax of logits/temperature over the survivors, in double.
  std::vector<double> prob(order.size());
  const double top = static_cast<double>(logits[size_t(order[0])]) / c.temperature;
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    prob[i] = std::exp(static_cast<double>(logits[size_t(order[i])]) / c.temperature - top);
    sum += prob[i];
  }
  size_t n = order.size();
  if (c.top_p < 1.0) {
    // Nucleus (Holtzman et al. 2020, §3.1): the smallest prefix whose mass reaches top_p.
    double mass = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      mass += prob[i] / sum;
      if (mass >= c.top_p) {
        n = i + 1;
        break;
      }
    }
    sum = std::accumulate(prob.begin(), prob.begin() + static_cast<std::ptrdiff_t>(n), 0.0);
  }
  // A uniform in [0, 1) with 53 bits from the counter-based stream: draw i of seed s is fixed.
  constexpr uint64_t kMantissa = uint64_t{1} << 53;
  const double u =
      static_cast<double>(uniform_int_at(c.seed, stable_hash("keel.sample"), draw, kMantissa)) / double(kMantissa);
  double target = u * sum, cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += prob[i];
    if (target < cum) return order[i];
  }
  return order[n - 1];  // rounding left u·sum at the very top
}

std::string_view to_string(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::MaxNewTokens: return "max_new_tokens";
    case StopReason::ContextFull: return "context_full";
  }
  return "?";
}

Generation generate(Generator& generator, std::span<const int32_t> prompt, const GenerateOptions& options) {
  check_sampling_config(options.sampling);
  if (options.max_new_tokens < 0) {
    throw Error("", "max_new_tokens", "must be >= 0, got " + std::to_string(options.max_new_tokens));
  }
  const int64_t context = generator.context_length();
  if (prompt.empty()) throw Error("", "prompt", "is empty: generation needs at least one token");
  if (static_cast<int64_t>(prompt.size()) > context) {
    throw Error("", "prompt", std::to_string(prompt.size()) + " tokens exceed the context of " +
                                  std::to_string(context) + " positions (max_position_embeddings)");
  }
  std::span<const float> logits = generator.next_logits();
  if (options.vocab_limit < 0 || options.vocab_limit > static_cast<int64_t>(logits.size())) {
    throw Error("", "vocab_limit", "must be in [0, vocab_size], got " + std::to_string(options.vocab_limit));
  }
  if (options.vocab_limit > 0) logits = logits.first(static_cast<size_t>(options.vocab_limit));
  generator.prefill(prompt);
  Generation out;
  // The sequence (prompt + new tokens) never outgrows the positions the model was trained on;
  // the last new token is never run, since nothing would read its logits.
  for (;;) {
    const int64_t made = static_cast<int64_t>(out.ids.size());
    if (made >= options.max_new_tokens) {
      out.stop = StopReason::MaxNewTokens;
      break;
    }
    if (static_cast<int64_t>(prompt.size()) + made >= context) {
      out.stop = StopReason::ContextFull;
      break;
    }
    if (made > 0) generator.append(out.ids.back());
    const int32_t token = sample_token(logits, options.sampling, static_cast<uint64_t>(made));
    out.ids.push_back(token);
    if (options.eos_id && token == *options.eos_id) {
      out.stop = StopReason::Eos;
      break;
    }
  }
  return out;
}

}  // namespace keel::nn
