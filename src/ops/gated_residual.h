// The gated residual update of a DiT block as one autograd function:
//   x + gate[:, None, :] * y
// in one pass over x and y (fp32 math, result in x's dtype), where y is the
// attention or MLP output (bf16 under autocast) and x the fp32 residual stream.
// The backward writes dy and sums dgate over tokens deterministically
// (kernels/gated_residual.h); dx is the incoming gradient itself.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// x, y [B, T, D] float32/bfloat16/float16 (any mix); gate [B, D]
// float32/bfloat16/float16 (a strided view is fine; its last dimension must be
// contiguous, else it is copied). Returns [B, T, D] in x's dtype. Gradients:
// x's is the incoming gradient (no copy), y's in y's dtype, gate's in gate's
// dtype. CUDA: fused kernels (D up to 8192). CPU: gated_residual_reference.
// Bad shapes, dtypes or devices throw UsageError.
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

// The plain-ATen reference: computed in fp32 (fp64 when any input is fp64),
// the result cast to x's dtype; autograd through ATen gives its backward.
at::Tensor gated_residual_reference(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

}  // namespace perftrain::ops
