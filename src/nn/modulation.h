// adaLN: LayerNorm without affine parameters (eps 1e-6), then a per-sample
// shift and scale from the conditioning vector: x̂ * (1 + scale) + shift.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::nn {

// x: [B, N, C]; returns LayerNorm over C with no weight or bias.
at::Tensor layer_norm_no_affine(const at::Tensor& x, double eps = 1e-6);
// x: [B, N, C]; shift, scale: [B, C].
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

}  // namespace perftrain::nn
