// LayerNorm (no affine, statistics in fp32) fused with adaLN modulation, as
// one autograd function: the start of each half of a DiT block,
//   h = LN(x) * (1 + scale[:, None, :]) + shift[:, None, :]
// written straight in the dtype of the matmul that consumes it. The backward
// reads x, dy and the saved per-row mean/rstd once and writes dx, with
// dshift/dscale summed over tokens deterministically (kernels/adaln_layernorm.h).
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// x [B, T, D] float32/bfloat16/float16; shift, scale [B, D] float32/bfloat16/
// float16 (strided views such as chunks of one [B, 6D] tensor are fine; the
// last dimension must be contiguous, else they are copied). Returns
// [B, T, D] in out_dtype (float32/bfloat16/float16). Gradients: x's in x's
// dtype, shift's and scale's in their own dtypes. CUDA: fused kernels (D up
// to 8192). CPU: adaln_layernorm_reference. Bad shapes, dtypes or devices
// throw UsageError.
at::Tensor adaln_layernorm(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                           at::ScalarType out_dtype, double eps = 1e-6);

// The plain-ATen reference: computed in fp32 (fp64 when any input is fp64),
// the result cast to out_dtype; autograd through ATen gives its backward.
at::Tensor adaln_layernorm_reference(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                                     at::ScalarType out_dtype, double eps = 1e-6);

}  // namespace perftrain::ops
