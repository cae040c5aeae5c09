#pragma once
// Autoregressive decoding with a KV cache over a TransformerModel's parameters, and sampling.
//
// The Generator reads the model's weights by HF name on every call (it copies none), so it
// follows training updates; per layer it caches K (after QK-Norm and RoPE) and V for up to
// max_position_embeddings positions. Use: prefill(prompt), then alternately next_logits() and
// append(token). Its forward is the training forward restricted to new rows: same kernels,
// same norm placements, biases, soft-caps and GQA grouping; tests hold it equal to
// TransformerModel::forward_logits at every position.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "keel/arch/model_spec.hpp"
#include "keel/kernels/rope.hpp"
#include "keel/nn/model.hpp"

namespace keel::nn {

class Generator {
 public:
  // The model must outlive the generator. Throws keel::Error for families the training model
  // cannot build either (it cannot exist then) and never for the ones it can.
  explicit Generator(const TransformerModel& model);

  // Drops the cache and runs the prompt (at least one token) from position 0.
  void prefill(std::span<const int32_t> prompt);
  // Runs one more token at position length(). Throws keel::Error when the context is full.
  void append(int32_t token);
  // Logits (vocab) predicting the token after the last one run, soft-capped like training.
  std::span<const float> next_logits() const { return logits_; }

  int64_t length() const { return length_; }                 // tokens in the cache
  int64_t context_length() const { return spec_.max_position_embeddings; }
  const arch::ModelSpec& spec() const { return spec_; }

 private:
  struct Norm {
    const float* weight = nullptr;
    const float* bias = nullptr;  // LayerNorm only
  };
  struct Layer {
    std::optional<Norm> attn_before, attn_after, attn_wrap, mlp_before, mlp_after, mlp_wrap;
    // Separate projections (Linear layout) or GPT-2's fused Conv1D c_attn ([in, 3·hidden]).
    const float *wq = nullptr, *bq = nullptr, *wk = nullptr, *bk = nullptr, *wv = nullptr, *bv = nullptr;
    const float *w_qkv = nullptr, *b_qkv = nullptr;
    const float *wo = nullptr, *bo = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    const float *w_gate = nullptr, *b_gate = nullptr, *w_up = nullptr, *b_up = nullptr, *w_down = nullptr,
                *b_down = nullptr;
    const Moe* moe = nullptr;  // routed experts instead of the dense MLP
    std::vector<float> k_cache, v_cache;  // (max_positions, kv_heads, head_dim)
  };

  // Runs n tokens at positions length_.. and leaves the logits of the last one in logits_.
  void run(const int32_t* tokens, int64_t n);
  void norm(const Norm& w, const float* x, float* y, int64_t n);
  // x: (n, hidden) -> y: (n, hidden); attends over cache rows [0, length_ + i] for token i.
  void attention(Layer& layer, const float* x, float* y, int64_t n);
  void mlp(const Layer& layer, const float* x, float* y, int64_t n);

  arch::ModelSpec spec_;
  const ParameterStore* store_;
  bool gpt2_;
  int64_t hidden_, heads_, kv_heads_, head_dim_;
  kernels::RopeTable rope_;
  const float *embed_ = nullptr, *positions_ = nullptr, *lm_head_ = nullptr;
  std::optional<Norm> final_norm_;
  std::vector<Layer> layers_;
  int64_t length_ = 0;
  std::vector<float> logits_;
};

// How the next token is drawn from the logits.
struct SamplingConfig {
  double temperature = 0.0;  // 0: greedy (argmax); else softmax(logits / temperature)
  int64_t top_k = 0;         // > 0: keep only the k most likely tokens
  double top_p = 1.0;        // < 1: keep the smallest set of most likely tokens with mass >= top_p
  uint64_t seed = 0;
};

// Draw number `draw` of a generation: a pure function of (logits, config, draw), so a seed
// reproduces a whole generation. Greedy ties go to the lowest id. Top-k, then top-p on the
// renormalized survivors (the order transformers' TopK/TopP logits warpers apply them).
// Throws keel::Error(field "temperature"/"top_k"/"top_p") for values out of range.
int32_t sample_token(std::span<const float> logits, const SamplingConfig& config, uint64_t draw);
void check_sampling_config(const SamplingConfig& config);

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingConfig sampling;
  std::optional<int32_t> eos_id;  // stop after emitting it (it is included in the output)
  // > 0: only ids below it are drawn, for a tokenizer smaller than the model's padded vocabulary.
  int64_t vocab_limit = 0;
};

enum class StopReason { Eos, MaxNewTokens, ContextFull };
std::string_view to_string(StopReason r);

struct Generation {
  std::vector<int32_t> ids;  // new tokens only
  StopReason stop = StopReason::MaxNewTokens;
};

// Prefills the prompt (1..context_length tokens; keel::Error(field "prompt") otherwise) and
// samples until eos, max_new_tokens or a full context.
Generation generate(Generator& generator, std::span<const int32_t> prompt, const GenerateOptions& options);

}  // namespace keel::nn
