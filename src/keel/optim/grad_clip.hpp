#pragma once
// Global gradient-norm clipping as torch.nn.utils.clip_grad_norm_: scale every gradient by
// max_norm / (‖g‖ + 1e-6) when that is below 1. Returns the norm before clipping.
#include <span>

namespace keel::optim {

double global_grad_norm(std::span<const float> grads);
double clip_grad_norm(std::span<float> grads, double max_norm);

}  // namespace keel::optim
