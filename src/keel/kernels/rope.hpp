#pragma once
// Rotary position embedding (RoPE), Hugging Face "rotate half" layout.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <vector>

namespace keel::kernels {

// cos, sin: (max_positions, rotary_dim/2); entry (t, i) is for angle t·inv_freq_i.
struct RopeTable {
  int64_t rotary_dim = 0;
  int64_t max_positions = 0;
  std::vector<float> cos, sin;
};

// inv_freq_i = theta^(-2i/rotary_dim), then rope_scaling: null (or rope_type "default"), "linear"
// (inv_freq / factor) or "llama3" (transformers' _compute_llama3_parameters). Any other type
// throws keel::Error(field "rope_scaling").
RopeTable make_rope_table(double theta, int64_t rotary_dim, int64_t max_positions, const nlohmann::json& rope_scaling);

// The inverse frequencies make_rope_table uses, (rotary_dim/2); exposed for tests and reports.
std::vector<double> rope_inv_freq(double theta, int64_t rotary_dim, const nlohmann::json& rope_scaling);

// x: (B, T, H, D), in place; token t of each sequence sits at position t. Rotates the first
// rotary_dim dims of each head, pairing dim i with i + rotary_dim/2; the rest pass through.
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
