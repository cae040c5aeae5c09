#pragma once
// Exact parameter, memory and FLOP accounting from a ModelSpec, tensor by tensor over the HF
// layout (hf_tensors.hpp). Nothing here knows a model by name: counts follow from the config.
#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "keel/arch/hf_tensors.hpp"
#include "keel/arch/model_spec.hpp"

namespace keel::arch {

struct ParamCounts {
  int64_t total = 0;          // decoder + input embedding + final norm + untied lm_head + router bias; no MTP
  int64_t active = 0;         // per token: all but routed experts, plus experts_per_token of them per MoE layer
  int64_t non_embedding = 0;  // total - input embeddings (token and position) - lm_head
  int64_t mtp = 0;            // num_nextn_predict_layers modules as stored in the checkpoint
  int64_t muon = 0;           // of total: matrices routed to Muon
  int64_t adamw = 0;          // of total: the rest (embeddings, lm_head, router, norms, biases)
  int64_t matmul_active = 0;  // weights multiplied per token, incl. lm_head even when tied
  int64_t tensors = 0;        // tensors stored (experts expanded), no MTP
  std::map<Component, int64_t> by_component;         // total per component (MTP under Component::Mtp)
  std::map<Component, int64_t> active_by_component;
};

// Bytes for training state. Gradients are kept in fp32 in both modes (keel accumulates in fp32).
struct MemoryPlan {
  int64_t weights = 0;
  int64_t master_weights = 0;  // fp32 copy, bf16 mode only
  int64_t gradients = 0;
  int64_t adamw_state = 0;     // two fp32 moments per parameter
  int64_t muon_state = 0;      // one fp32 momentum per Muon matrix element, AdamW moments for the rest
  int64_t total_adamw() const { return weights + master_weights + gradients + adamw_state; }
  int64_t total_muon() const { return weights + master_weights + gradients + muon_state; }
};

struct FlopsPerToken {
  int64_t seq = 0;
  double matmul = 0;          // 6 * matmul_active
  double attention = 0;       // 6 * L * seq * heads * (qk_dim + v_dim), PaLM's convention (full T); a
                              // sliding-window layer counts min(seq, window) keys
  double attention_causal = 0;  // same with the mean causal context (seq + 1) / 2
  double training() const { return matmul + attention; }
  double training_causal() const { return matmul + attention_causal; }
};

struct Accounting {
  ParamCounts params;
  MemoryPlan fp32;
  MemoryPlan bf16_mixed;
  int64_t kv_cache_bytes_per_token_bf16 = 0;
  FlopsPerToken flops;
};

// Throws keel::Error(spec.source, ...) when a count would overflow 64 bits.
Accounting account(const ModelSpec& spec, int64_t seq);

}  // namespace keel::arch
