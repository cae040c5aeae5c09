#pragma once
// Rotary position embedding (RoPE), Hugging Face "rotate half" layout, or adjacent pairs for
// DeepSeek's rope_interleave (see RopeTable::interleave).
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace keel::kernels {

// cos, sin: (max_positions, rotary_dim/2); entry (t, i) is for angle t·inv_freq_i, times YaRN's
// attention factor (1 for every other scaling type).
struct RopeTable {
  int64_t rotary_dim = 0;
  int64_t max_positions = 0;
  // false: frequency i rotates the pair (i, i + rotary_dim/2) (HF rotate_half).
  // true: it rotates the adjacent pair (2i, 2i+1) (DeepSeek's official code; HF deepseek_v3 with
  // rope_interleave=True permutes q^R/k^R to halves and then rotates half, which gives the same
  // q·k for every pair of vectors because q and k are permuted alike). See docs/mla.md.
  bool interleave = false;
  std::vector<float> cos, sin;
};

// inv_freq_i = theta^(-2i/rotary_dim), then rope_scaling: null (or rope_type "default"), "linear"
// (inv_freq / factor), "llama3" (transformers' _compute_llama3_parameters) or "yarn"
// (_compute_yarn_parameters; its original_max_position_embeddings defaults to max_positions).
// Any other type throws keel::Error(field "rope_scaling").
// Errors (keel::Error, field "rope_scaling"/"rotary_dim") name `source`, the config it came from.
RopeTable make_rope_table(double theta, int64_t rotary_dim, int64_t max_positions, const nlohmann::json& rope_scaling,
                          const std::string& source = "rope_scaling");

// The inverse frequencies make_rope_table uses, (rotary_dim/2); exposed for tests and reports.
// max_positions only matters for yarn without original_max_position_embeddings.
std::vector<double> rope_inv_freq(double theta, int64_t rotary_dim, const nlohmann::json& rope_scaling,
                                  int64_t max_positions = 0, const std::string& source = "rope_scaling");

// YaRN's factor on cos and sin (transformers _compute_yarn_parameters: attention_factor, else
// mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set, else
// mscale(factor)); 1 for every other scaling type.
double rope_attention_factor(const nlohmann::json& rope_scaling, const std::string& source = "rope_scaling");

// YaRN's get_mscale: 0.1·m·ln(scale) + 1 for scale > 1, else 1 (DeepSeek-V3 §4.3).
double yarn_mscale(double scale, double m);

// x: (B, T, H, D), in place; token t of each sequence sits at position t. Rotates the first
// rotary_dim dims of each head, pairing dim i with i + rotary_dim/2 (or 2i with 2i+1 when the
// table is interleaved); the rest pass through.
void rope_forward(float* x, const RopeTable& table, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim);

// x: (tokens, H, D), in place; token i sits at position first_position + i (decoding with a KV
// cache, where new tokens continue a sequence). rope_forward is this with first_position 0 per
// sequence.
void rope_forward_at(float* x, const RopeTable& table, int64_t tokens, int64_t heads, int64_t head_dim,
                     int64_t first_position);

// dx: (B, T, H, D), in place: the rotation is orthogonal, so the gradient is rotated back by
// the inverse (transposed) rotation. Overwrites rather than accumulates.
void rope_backward(float* dx, const RopeTable& table, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim);

}  // namespace keel::kernels
