#pragma once
#include <optional>
#include <string_view>

namespace keel::nn {

// Activation recomputation (run.recompute): what forward_backward keeps from the forward for
// the backward. None keeps every activation; Attention keeps each block's input and the MLP's
// activations and recomputes the attention sublayer (norm, projections, RoPE, attention, output
// projection) during the backward; Blocks keeps only each block's input and recomputes the
// whole block (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"); under bf16
// activation storage its backward holds one sublayer expanded at a time, the recomputed
// attention packed under the MLP's backward (TransformerModel::recompute_block_packed). The
// recomputation is the same computation, so gradients are bit-identical in all three, in fp32
// and under bf16 with run.bf16_activations = "packed" or "fp32". Under bf16 "all" each block's
// input is kept in bf16 and the training forward reads it rounded (TransformerModel::
// kept_inputs_bf16), so attention and blocks give one step and none a slightly different one.
enum class Recompute { None, Attention, Blocks };
std::optional<Recompute> parse_recompute(std::string_view name);
std::string_view recompute_name(Recompute r);

}  // namespace keel::nn
