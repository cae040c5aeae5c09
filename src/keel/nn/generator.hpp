#pragma once
// Autoregressive decoding and sampling: a sampling loop over TransformerModel's incremental
// forward (forward_incremental, the same modules and kernels as training, with a KV cache per
// layer: keys and values for MHA/GQA/MQA, the compressed latent and shared rotary key for MLA).
//
// The Generator reads the model's weights on every call (it copies none), so it follows
// training updates. Use: prefill(prompt), then alternately next_logits() and append(token).
// Tests hold its logits equal to TransformerModel::forward_logits at every position for every
// family and "keel" variant.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "keel/arch/model_spec.hpp"
#include "keel/nn/kv_cache.hpp"
#include "keel/nn/model.hpp"

namespace keel::nn {

class Generator {
 public:
  // The model must outlive the generator. Throws keel::Error (naming the config's model_type)
  // for a family whose row does not support generation.
  explicit Generator(const TransformerModel& model);

  // Drops the cache and runs the prompt (at least one token) from position 0.
  void prefill(std::span<const int32_t> prompt);
  // Runs one more token at position length(). Throws keel::Error when the context is full.
  void append(int32_t token);
  // Logits (vocab) predicting the token after the last one run, soft-capped like training.
  std::span<const float> next_logits() const { return logits_; }

  int64_t length() const { return state_.length; }           // tokens in the cache
  int64_t context_length() const { return model_->spec().max_position_embeddings; }
  const arch::ModelSpec& spec() const { return model_->spec(); }
  // Bytes the cache holds per token over all layers (fp32): 2·kv_heads·head_dim per layer for
  // standard attention, kv_lora_rank + qk_rope_head_dim for MLA.
  int64_t cache_bytes_per_token() const { return state_.bytes_per_token(); }

 private:
  const TransformerModel* model_;
  DecodeState state_;
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
  // Stop after emitting any of these (it is included in the output): the tokenizer's end of text
  // and a generation_config.json's eos_token_id, which chat models give as a list.
  std::vector<int32_t> eos_ids;
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
