#pragma once
// Global gradient-norm clipping as torch.nn.utils.clip_grad_norm_: scale every gradient by
// max_norm / (‖g‖ + 1e-6) when that is below 1. Returns the norm before clipping.
#include <span>

namespace keel::optim {

double global_grad_norm(std::span<const float> grads);
// Σ g², in fixed chunks summed in a fixed order (bit-identical whatever the threads do).
double sum_of_squares(std::span<const float> grads);
double clip_grad_norm(std::span<float> grads, double max_norm);
// The factor clip_grad_norm multiplies every gradient by: max_norm / (norm + 1e-6) as a float
// when that is below 1, else exactly 1 (a NaN norm included). The trainer hands it to the
// optimizer (Optimizer::step's grad_scale) instead of scaling the gradients in place.
float clip_scale(double norm, double max_norm);

}  // namespace keel::optim
