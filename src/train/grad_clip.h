// Clips the global L2 norm of all gradients to max_norm without reading the
// norm back to the host: the scale min(1, max_norm / (norm + 1e-6)) is a
// device tensor. Returns the norm before clipping (a 0-d device tensor).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace perftrain::train {

at::Tensor global_grad_norm(const std::vector<at::Tensor>& params);
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace perftrain::train
